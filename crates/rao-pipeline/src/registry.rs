//! The name → kind table a run is built with.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::kind::StageKind;

/// The name → kind table an engine is built with.
#[derive(Clone, Default)]
pub struct Registry {
    kinds: BTreeMap<&'static str, Arc<dyn StageKind>>,
}

impl Registry {
    /// A registry with the built-in, RL-free kinds (`shell`, `noop`, `dataset`).
    pub fn with_builtins() -> Self {
        let mut r = Registry::default();
        r.register(Arc::new(crate::builtin::Shell));
        r.register(Arc::new(crate::builtin::Noop));
        r.register(Arc::new(crate::dataset::Dataset));
        r
    }
    pub fn register(&mut self, kind: Arc<dyn StageKind>) {
        self.kinds.insert(kind.name(), kind);
    }
    pub fn get(&self, name: &str) -> Option<&Arc<dyn StageKind>> {
        self.kinds.get(name)
    }
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.kinds.keys().copied()
    }
    pub fn kinds(&self) -> impl Iterator<Item = &Arc<dyn StageKind>> {
        self.kinds.values()
    }
}

impl rao_plan::Kinds for Registry {
    fn kind(&self, name: &str) -> Option<Arc<dyn rao_plan::KindSignature>> {
        self.kinds.get(name).map(|k| k.clone() as Arc<dyn rao_plan::KindSignature>)
    }
    fn all(&self) -> Vec<Arc<dyn rao_plan::KindSignature>> {
        self.kinds.values().map(|k| k.clone() as Arc<dyn rao_plan::KindSignature>).collect()
    }
}
