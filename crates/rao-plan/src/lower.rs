//! The spec lowered once into a typed form: each entry is a stage (with its kind resolved) or a
//! loop (with its body), and every reference is parsed with its position. Structural problems
//! are reported here; entries that have them are left out, so the checks and the expansion that
//! follow work on well-formed data and never unwrap.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::diag::{Diagnostic, did_you_mean};
use crate::kind::{KindSignature, Kinds};
use crate::spec::{LoopSpec, PipelineFile, Pos, Sp, StageSpec, StopWhen};

/// `STAGE.OUTPUT` (or `loop.VAR` inside a loop body) as written.
#[derive(Debug, Clone)]
pub struct Ref {
    pub stage: String,
    pub output: String,
    pub pos: Pos,
}

impl Ref {
    pub fn parse(text: &str, pos: Pos) -> Result<Ref, Diagnostic> {
        match text.split_once('.') {
            Some((stage, output)) if !stage.is_empty() && !output.is_empty() && !output.contains('.') => {
                Ok(Ref { stage: stage.to_string(), output: output.to_string(), pos })
            }
            _ => Err(Diagnostic::new(pos, format!("`{text}` is not a reference")).help("write STAGE.OUTPUT, e.g. `synthesize.tasks`")),
        }
    }

    pub fn is_loop_var(&self) -> bool {
        self.stage == "loop"
    }
}

pub struct Input {
    pub name: Sp<String>,
    pub refs: Vec<Ref>,
}

pub struct Stage<'a> {
    pub name: &'a Sp<String>,
    pub kind: Arc<dyn KindSignature>,
    pub spec: &'a StageSpec,
    pub inputs: Vec<Input>,
}

impl Stage<'_> {
    /// Whether this stage has an instance in `iteration` of a loop of `max_iterations` (`every`).
    pub fn runs_in(&self, iteration: u32, max_iterations: u32) -> bool {
        match &self.spec.every {
            Some(n) => n.value > 0 && (iteration.is_multiple_of(n.value) || iteration == max_iterations),
            None => true,
        }
    }

    /// `every: N` when set: nothing else in the body can depend on it.
    pub fn sparse(&self) -> Option<u32> {
        self.spec.every.as_ref().map(|n| n.value)
    }

    /// Output names this stage offers (fixed by its kind, or listed under `outputs:`).
    pub fn outputs(&self) -> Vec<String> {
        match self.kind.outputs() {
            Some(fixed) => fixed.iter().map(|s| s.to_string()).collect(),
            None => self.spec.outputs.iter().map(|o| o.value.clone()).collect(),
        }
    }
}

pub struct Carry {
    pub var: Sp<String>,
    pub stage: String,
    pub output: String,
    pub pos: Pos,
}

/// `loop.VAR` that reads carried variable `of` as it was `by` iterations earlier.
pub struct Lag {
    pub var: Sp<String>,
    pub of: Sp<String>,
    pub by: u32,
}

pub struct Stop {
    pub stage: String,
    pub metric: String,
    pub when: StopWhen,
}

pub struct Loop<'a> {
    pub name: &'a Sp<String>,
    pub spec: &'a LoopSpec,
    pub init: Vec<(Sp<String>, Ref)>,
    pub carry: Vec<Carry>,
    pub lag: Vec<Lag>,
    pub stop: Option<Stop>,
    pub body: Vec<Stage<'a>>,
}

impl Loop<'_> {
    pub fn carries(&self, var: &str) -> bool {
        self.carry.iter().any(|c| c.var.value == var)
    }
    pub fn lag_of(&self, var: &str) -> Option<&Lag> {
        self.lag.iter().find(|g| g.var.value == var)
    }
    /// What `loop.VAR` reads: the carried variable and how many iterations behind the freshest.
    pub fn source_of<'v>(&'v self, var: &'v str) -> (&'v str, u32) {
        match self.lag_of(var) {
            Some(g) => (&g.of.value, g.by),
            None => (var, 0),
        }
    }
    pub fn init_of(&self, var: &str) -> Option<&Ref> {
        self.init.iter().find(|(v, _)| v.value == var).map(|(_, r)| r)
    }
    pub fn body_stage(&self, name: &str) -> Option<&Stage<'_>> {
        self.body.iter().find(|s| s.name.value == name)
    }
}

pub enum Entry<'a> {
    Stage(Stage<'a>),
    Loop(Loop<'a>),
}

impl<'a> Entry<'a> {
    pub fn name(&self) -> &'a Sp<String> {
        match self {
            Entry::Stage(s) => s.name,
            Entry::Loop(l) => l.name,
        }
    }
}

pub struct Lowered<'a> {
    pub spec: &'a PipelineFile,
    /// Top-level entries, in file order.
    pub entries: Vec<Entry<'a>>,
    /// Entry name → index in `entries` (pipelines have tens of thousands of stages).
    by_name: std::collections::HashMap<String, usize>,
    /// Names of entries left out for structural errors (references to them are not reported
    /// again).
    pub broken: BTreeSet<String>,
}

impl<'a> Lowered<'a> {
    pub fn entry(&self, name: &str) -> Option<&Entry<'a>> {
        self.by_name.get(name).map(|&i| &self.entries[i])
    }
}

pub fn lower<'a>(spec: &'a PipelineFile, registry: &dyn Kinds, diags: &mut Vec<Diagnostic>) -> Lowered<'a> {
    let mut out = Lowered { spec, entries: Vec::new(), by_name: Default::default(), broken: BTreeSet::new() };
    for (name, s) in spec.stages.iter() {
        let entry = match &s.loop_ {
            Some(l) => lower_loop(name, s, l, registry, diags).map(Entry::Loop),
            None => {
                if let Some(every) = &s.every {
                    diags.push(
                        Diagnostic::new(every.pos, format!("stage `{}`: `every` is for stages of a loop's body", name.value))
                            .help("remove `every`, or move the stage into a loop's `stages:`"),
                    );
                }
                lower_stage(name, s, registry, diags).map(Entry::Stage)
            }
        };
        match entry {
            Some(e) => {
                out.by_name.insert(name.value.clone(), out.entries.len());
                out.entries.push(e);
            }
            None => {
                out.broken.insert(name.value.clone());
                if s.loop_.is_some() {
                    out.broken.extend(s.stages.keys().map(str::to_string));
                }
            }
        }
    }
    out
}

fn lower_stage<'a>(name: &'a Sp<String>, s: &'a StageSpec, registry: &dyn Kinds, diags: &mut Vec<Diagnostic>) -> Option<Stage<'a>> {
    let Some(kind_name) = &s.kind else {
        let known = registry.names().join(", ");
        diags.push(
            Diagnostic::new(name.pos, format!("stage `{}` has no `kind`", name.value)).help(format!("add `kind:` (one of: {known})")),
        );
        return None;
    };
    if !s.stages.is_empty() {
        diags.push(
            Diagnostic::new(name.pos, format!("stage `{}` has `stages` but no `loop`", name.value))
                .help("add a `loop:` block or move the stages to the top level"),
        );
    }
    let Some(kind) = registry.kind(&kind_name.value) else {
        let help =
            did_you_mean(&kind_name.value, registry.names()).unwrap_or_else(|| format!("known kinds: {}", registry.names().join(", ")));
        diags.push(Diagnostic::new(kind_name.pos, format!("unknown stage kind `{}`", kind_name.value)).help(help));
        return None;
    };
    let mut inputs = Vec::new();
    let mut ok = true;
    for (iname, r) in s.inputs.iter() {
        let mut refs = Vec::new();
        for text in r.value.refs() {
            match Ref::parse(text, r.pos) {
                Ok(x) => refs.push(x),
                Err(d) => {
                    diags.push(d);
                    ok = false;
                }
            }
        }
        inputs.push(Input { name: iname.clone(), refs });
    }
    ok.then_some(Stage { name, kind, spec: s, inputs })
}

fn lower_loop<'a>(
    name: &'a Sp<String>,
    s: &'a StageSpec,
    l: &'a LoopSpec,
    registry: &dyn Kinds,
    diags: &mut Vec<Diagnostic>,
) -> Option<Loop<'a>> {
    let before = diags.len();
    if s.kind.is_some() {
        diags.push(
            Diagnostic::new(name.pos, format!("stage `{}` has both `kind` and `loop`", name.value))
                .help("a loop's stages go under its `stages:` key; remove `kind`"),
        );
    }
    if !(s.params.is_empty() && s.inputs.is_empty() && s.outputs.is_empty() && s.matrix.is_empty() && s.every.is_none()) {
        diags.push(
            Diagnostic::new(name.pos, format!("loop `{}` takes only `loop` and `stages`", name.value))
                .help("put params, inputs and outputs on the stages of its body"),
        );
    }
    let mut init = Vec::new();
    for (var, r) in l.init.iter() {
        match Ref::parse(&r.value, r.pos) {
            Ok(x) => init.push((var.clone(), x)),
            Err(d) => diags.push(d),
        }
    }
    let mut carry = Vec::new();
    for (var, r) in l.carry.iter() {
        match r.value.split_once('.') {
            Some((stage, output)) if s.stages.get(stage).is_some() && !output.is_empty() => {
                carry.push(Carry { var: var.clone(), stage: stage.to_string(), output: output.to_string(), pos: r.pos })
            }
            _ => diags.push(
                Diagnostic::new(r.pos, format!("carry source `{}` is not an output of this loop's body", r.value))
                    .help(format!("write BODYSTAGE.OUTPUT (body stages: {})", s.stages.keys().collect::<Vec<_>>().join(", "))),
            ),
        }
    }
    let lag = l.lag.iter().map(|(var, g)| Lag { var: var.clone(), of: g.of.clone(), by: g.by.value }).collect();
    let stop = match &l.stop_when {
        None => None,
        Some(w) => match w.metric.value.split_once('.') {
            Some((stage, metric)) if s.stages.get(stage).is_some() && !metric.is_empty() => {
                Some(Stop { stage: stage.to_string(), metric: metric.to_string(), when: w.clone() })
            }
            _ => {
                diags.push(
                    Diagnostic::new(w.metric.pos, format!("stop metric `{}` must be BODYSTAGE.METRIC", w.metric.value))
                        .help(format!("body stages: {}", s.stages.keys().collect::<Vec<_>>().join(", "))),
                );
                None
            }
        },
    };
    let mut body = Vec::new();
    for (bname, b) in s.stages.iter() {
        if b.loop_.is_some() {
            diags.push(
                Diagnostic::new(bname.pos, format!("loop `{}` is inside another loop; loops cannot nest", bname.value))
                    .help("move its stages into the outer loop's body, or make it a top-level loop"),
            );
            continue;
        }
        if let Some(stage) = lower_stage(bname, b, registry, diags) {
            body.push(stage);
        }
    }
    (diags.len() == before).then_some(Loop { name, spec: l, init, carry, lag, stop, body })
}
