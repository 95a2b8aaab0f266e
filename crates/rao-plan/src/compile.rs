//! From a pipeline file to a checked, expanded DAG of stage instances.
//!
//! Validation collects every problem it can find (with positions) before anything runs.
//! Loops expand into `STAGE@k` instances and matrices into `STAGE[key=value]` instances.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use petgraph::graph::{DiGraph, NodeIndex};
use serde_json::Value;

use crate::diag::{Diagnostic, Diagnostics};
use crate::kind::Kinds;
use crate::plan_cache::PlanCache;
use crate::spec::{PipelineFile, Pos, Resources, VariantFile};
use serde::{Deserialize, Serialize};

/// Default store: a directory next to the pipeline file.
pub const DEFAULT_STORE: &str = ".rao/store";

/// Where an input comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Source {
    /// An output of a known instance.
    Output { instance: usize, output: String },
    /// A loop variable after the loop's last iteration that ran (known only once the loop decides).
    LoopExit { loop_idx: usize, var: String },
}

/// One runnable stage instance.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Instance {
    pub name: String,
    /// The stage entry it comes from.
    pub stage: String,
    pub kind: String,
    pub kind_version: u32,
    /// The kind's code version (see `KindSignature::code_version`).
    pub code: String,
    /// What makes this instance's bits machine-dependent (see `KindSignature::machine_profile`).
    pub machine: String,
    /// Params as written (placeholders substituted): what the stage receives.
    pub params: Value,
    /// Params with the kind's defaults filled in: what the fingerprint hashes.
    pub resolved_params: Value,
    pub inputs: Vec<(String, Vec<Source>)>,
    pub outputs: Vec<String>,
    pub retries: u32,
    pub timeout: Option<std::time::Duration>,
    pub resources: Resources,
    /// The stage's own executor, if it names one (else the run's default applies).
    pub executor: Option<crate::spec::ExecutorSpec>,
    pub seed: u64,
    /// Fingerprint content the kind adds (e.g. hashes of files a command reads).
    pub extra: String,
    /// (loop index, iteration starting at 1) for loop-body instances.
    pub iteration: Option<(usize, u32)>,
    pub pos: Pos,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StopInfo {
    pub stage: String,
    pub metric: String,
    /// Stop once the metric's mean is at least this…
    pub above: Option<f64>,
    /// …or at most this.
    pub below: Option<f64>,
}

impl StopInfo {
    pub fn is_met(&self, value: f64) -> bool {
        self.above.is_some_and(|a| value >= a) || self.below.is_some_and(|b| value <= b)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoopInfo {
    pub name: String,
    pub max_iterations: u32,
    pub stop: Option<StopInfo>,
    /// var → (body stage, output).
    pub carry: BTreeMap<String, (String, String)>,
    /// Per iteration (index k-1): body stage name → its instances.
    pub iterations: Vec<BTreeMap<String, Vec<usize>>>,
}

impl LoopInfo {
    /// Where `var` comes from when iteration `k` (1-based) is the last.
    pub fn carry_sources(&self, var: &str, k: u32) -> Vec<Source> {
        let Some((stage, output)) = self.carry.get(var) else { return Vec::new() };
        let instances = self.iterations.get(k as usize - 1).and_then(|it| it.get(stage));
        instances.into_iter().flatten().map(|&i| Source::Output { instance: i, output: output.clone() }).collect()
    }

    /// The last iteration, given what is known of finished instances' metrics
    /// (`metric(i)` is `None` while instance `i` has not finished). `None` while undecided.
    pub fn exit_iteration(&self, metric: impl Fn(usize) -> Option<Option<f64>>) -> Option<u32> {
        let Some(stop) = &self.stop else { return Some(self.max_iterations) };
        for k in 1..=self.max_iterations {
            let insts = &self.iterations[k as usize - 1][&stop.stage];
            let mut values = Vec::new();
            for &i in insts {
                match metric(i)? {
                    Some(v) => values.push(v),
                    None => values.clear(),
                }
            }
            if !values.is_empty() {
                let mean = values.iter().sum::<f64>() / values.len() as f64;
                if stop.is_met(mean) {
                    return Some(k);
                }
            }
        }
        Some(self.max_iterations)
    }
}

/// A checked pipeline, expanded into instances. Serialised whole by the plan cache, except the
/// graph and its order, which are rebuilt from the instances' inputs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Compiled {
    pub name: String,
    pub seed: u64,
    pub file: PathBuf,
    pub base_dir: PathBuf,
    pub store_url: String,
    /// The file's default executor (`executor:` at the top level), if any.
    pub executor: Option<crate::spec::ExecutorSpec>,
    /// The command line's `--set` entries.
    pub overrides: Vec<String>,
    /// What a variant's `set:` entries (and `name`) change in the file it extends; empty for a
    /// pipeline that extends nothing.
    #[serde(default)]
    pub variant_sets: Vec<String>,
    /// The pipeline as resolved (after `--set`), for run records and reports.
    pub resolved: crate::resolved::ResolvedPipeline,
    pub instances: Vec<Instance>,
    pub loops: Vec<LoopInfo>,
    /// Stage entries in file order, with the names of their instances (for folded views).
    pub stages: Vec<(String, Vec<usize>)>,
    #[serde(skip)]
    pub graph: DiGraph<usize, ()>,
    #[serde(skip)]
    pub order: Vec<usize>,
}

impl Compiled {
    pub fn instance_index(&self, name: &str) -> Option<usize> {
        self.instances.iter().position(|i| i.name == name)
    }

    /// Instances of a stage entry (or the one instance of that exact name); for --force/--only.
    pub fn select(&self, name: &str) -> Option<Vec<usize>> {
        if let Some(i) = self.instance_index(name) {
            return Some(vec![i]);
        }
        if let Some((_, v)) = self.stages.iter().find(|(s, _)| s == name) {
            return Some(v.clone());
        }
        if let Some(l) = self.loops.iter().find(|l| l.name == name) {
            return Some(l.iterations.iter().flat_map(|m| m.values().flatten().copied()).collect());
        }
        None
    }

    pub fn predecessors(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        self.graph.neighbors_directed(NodeIndex::new(i), petgraph::Direction::Incoming).map(|n| n.index())
    }

    pub fn successors(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        self.graph.neighbors_directed(NodeIndex::new(i), petgraph::Direction::Outgoing).map(|n| n.index())
    }

    /// Every instance reachable downstream of `roots` (roots included).
    pub fn downstream(&self, roots: &[usize]) -> Vec<bool> {
        let mut seen = vec![false; self.instances.len()];
        let mut stack: Vec<usize> = roots.to_vec();
        while let Some(i) = stack.pop() {
            if !std::mem::replace(&mut seen[i], true) {
                stack.extend(self.successors(i));
            }
        }
        seen
    }
}

/// Read, check and expand a pipeline file. `overrides` are `path.to.key=value` strings.
/// A file with `extends` is a variant: another pipeline file plus the changes in its `set`.
pub fn load(path: &Path, overrides: &[String], registry: &dyn Kinds) -> Result<Compiled, Diagnostics> {
    load_cached(path, overrides, registry, None)
}

/// Like [`load`], through a cache of compiled plans (see `plan_cache`): a file that compiled
/// before, with the same overrides and the same rao, is read back instead of compiled again.
pub fn load_cached(path: &Path, overrides: &[String], registry: &dyn Kinds, cache: Option<&PlanCache>) -> Result<Compiled, Diagnostics> {
    let label = path.display().to_string();
    let text = read_pipeline_text(path).map_err(|m| Diagnostics {
        file: label.clone(),
        source: String::new(),
        items: vec![Diagnostic::new(Pos::NONE, m)],
    })?;
    let base = folder_of(path);
    crate::secrets::remember_given(overrides);
    // A credential given with `--set` is not written to the cache folder (a file's own values
    // are on disk already).
    let cached = cache
        .filter(|_| !may_be_variant(&text) && !overrides.iter().any(|o| crate::secrets::sets_secret(o)))
        .and_then(|cache| Some((cache, PlanCache::key(&label, &text, &base, overrides, registry)?)));
    if let Some(hit) = cached.as_ref().and_then(|(cache, key)| cache.get(key, registry)) {
        return Ok(hit);
    }
    let (label, text, sets) = resolve_variant(path, label, text, 0)?;
    let (variant_sets, mut origins): (Vec<String>, Vec<String>) = sets.into_iter().unzip();
    let all_overrides: Vec<String> = variant_sets.iter().chain(overrides).cloned().collect();
    origins.extend(overrides.iter().map(|_| "--set".to_string()));
    // Relative paths (store, deps, a shell's working folder) mean what they mean in the file that
    // has the stages: a variant kept in another folder shares its base's store.
    let base = folder_of(Path::new(&label));
    let mut c = compile_given(&label, &text, &base, (&all_overrides, &origins), registry)?;
    c.file = path.to_path_buf();
    c.overrides = overrides.to_vec();
    c.variant_sets = variant_sets;
    if let Some((cache, key)) = &cached {
        cache.put(key, &c);
    }
    Ok(c)
}

/// The folder a pipeline file's relative paths are resolved against: its own (canonical).
fn folder_of(path: &Path) -> PathBuf {
    let dir = path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p }).unwrap_or(Path::new("."));
    dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf())
}

/// Whether a file's text can name `extends` (not even spelt with a YAML escape); one that
/// cannot is not parsed a first time just to find out.
fn may_be_variant(text: &str) -> bool {
    text.contains("extends") || text.contains('\\')
}

/// The file's text: a regular file of bounded size (a FIFO or a device would block or never end).
/// Used for the file given and for the files variants extend.
fn read_pipeline_text(path: &Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read pipeline file: {e}"))?;
    if !meta.is_file() {
        return Err("the pipeline file is not a regular file (a folder, a pipe or a device)".into());
    }
    if meta.len() > crate::parse::MAX_FILE_BYTES as u64 {
        return Err(format!("the pipeline file is {} bytes; at most {} are read", meta.len(), crate::parse::MAX_FILE_BYTES));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read pipeline file: {e}"))?;
    String::from_utf8(bytes).map_err(|e| format!("the pipeline file is not UTF-8 text (byte {})", e.utf8_error().valid_up_to()))
}

/// A variant's `set:` entries as overrides (outermost variant last), each with where it was
/// written (`FILE:LINE:COLUMN`), so an error in a value the base file uses can name that line.
type VariantSets = Vec<(String, String)>;

/// Follow `extends` to the pipeline file that has the stages; returns its label and text and the
/// overrides that turn it into the variant.
fn resolve_variant(path: &Path, label: String, text: String, depth: usize) -> Result<(String, String, VariantSets), Diagnostics> {
    if !may_be_variant(&text) {
        return Ok((label, text, Vec::new()));
    }
    let fail = |items: Vec<Diagnostic>| Diagnostics { file: label.clone(), source: text.clone(), items };
    // A file that is not YAML at all is reported as such here: taken for a plain pipeline, a
    // variant's syntax error would surface as "unknown field `extends`".
    if crate::parse::parse::<Value>(&text).map_err(|d| fail(vec![d]))?.get("extends").is_none() {
        return Ok((label, text, Vec::new()));
    }
    let v: VariantFile = crate::parse::parse(&text).map_err(|d| fail(vec![d]))?;
    if depth >= 8 {
        return Err(fail(vec![
            Diagnostic::new(v.extends.pos, "`extends` chains deeper than 8 files (is there a loop?)")
                .help("make `extends` name the pipeline with the stages, not a variant that leads back here"),
        ]));
    }
    if !crate::check::valid_name(&v.name.value) {
        let shown: String = v.name.value.chars().take(40).collect();
        return Err(fail(vec![Diagnostic::new(v.name.pos, format!("invalid pipeline name `{shown}`")).help(crate::check::name_help())]));
    }
    let base_path = path.parent().unwrap_or(Path::new(".")).join(&v.extends.value);
    let base_text = read_pipeline_text(&base_path).map_err(|m| {
        fail(vec![
            Diagnostic::new(v.extends.pos, format!("cannot extend `{}`: {m}", base_path.display()))
                .help("`extends` takes a pipeline file path relative to this file"),
        ])
    })?;
    let (base_label, base_text, mut sets) = resolve_variant(&base_path, base_path.display().to_string(), base_text, depth + 1)?;
    let at = |pos: Pos| format!("{label}:{}:{}", pos.line, pos.column);
    sets.push((format!("name={}", v.name.value), at(v.name.pos)));
    // Check each change against the base here, so an error points at this file's line.
    let mut spec: PipelineFile =
        crate::parse::parse(&base_text).map_err(|d| Diagnostics { file: base_label.clone(), source: base_text.clone(), items: vec![d] })?;
    let given: Vec<String> = sets.iter().map(|(o, _)| o.clone()).collect();
    crate::overrides::apply(&mut spec, &given).map_err(|d| fail(vec![d]))?;
    let mut problems = Vec::new();
    for (key, value) in &v.set.entries {
        let o = format!("{}={}", key.value, serde_json::to_string(&value.value).unwrap_or_default());
        match crate::overrides::apply(&mut spec, std::slice::from_ref(&o)) {
            Ok(()) => sets.push((o, at(key.pos))),
            Err(d) => problems.push(Diagnostic { pos: key.pos, message: d.message.replacen("--set ", "set ", 1), help: d.help }),
        }
    }
    if !problems.is_empty() {
        return Err(fail(problems));
    }
    Ok((base_label, base_text, sets))
}

/// Like [`load`], from text (`label` names it in errors).
pub fn compile_str(label: &str, text: &str, base_dir: &Path, overrides: &[String], registry: &dyn Kinds) -> Result<Compiled, Diagnostics> {
    compile_given(label, text, base_dir, (overrides, &[]), registry)
}

/// [`compile_str`] with where each override came from (`--set`, or a variant's line), where known
/// (the second list is then as long as the first).
fn compile_given(
    label: &str,
    text: &str,
    base_dir: &Path,
    (overrides, origins): (&[String], &[String]),
    registry: &dyn Kinds,
) -> Result<Compiled, Diagnostics> {
    let fail = |items: Vec<Diagnostic>| Diagnostics { file: label.to_string(), source: text.to_string(), items };
    let mut spec: PipelineFile = crate::parse::parse_all(text).map_err(fail)?;
    crate::overrides::apply(&mut spec, overrides).map_err(|d| fail(vec![d]))?;
    let mut diags = Vec::new();
    let lowered = crate::lower::lower(&spec, registry, &mut diags);
    let mut checker = crate::check::Checker { lowered: &lowered, base_dir, source: text, overrides, origins, diags };
    checker.check_all();
    if !checker.diags.is_empty() {
        return Err(fail(checker.diags));
    }
    let (expanded, diags) = crate::expand::Expander::new(&lowered, base_dir).run();
    if !diags.is_empty() {
        return Err(fail(diags));
    }
    let crate::expand::Expanded { instances, loops, stages } = expanded;
    let (graph, order) = dependency_graph(&instances, &loops).map_err(|d| fail(vec![d]))?;
    Ok(Compiled {
        name: spec.name.value.clone(),
        seed: spec.seed.value,
        file: PathBuf::from(label),
        base_dir: base_dir.to_path_buf(),
        store_url: spec.store.as_ref().map(|s| s.value.clone()).unwrap_or_else(|| DEFAULT_STORE.to_string()),
        executor: spec.executor.clone(),
        overrides: overrides.to_vec(),
        variant_sets: Vec::new(),
        resolved: crate::resolved::ResolvedPipeline::new(serde_json::to_value(&spec).unwrap_or(Value::Null)),
        instances,
        loops,
        stages,
        graph,
        order,
    })
}

/// The instances' dependency graph and a stable topological order of it.
pub(crate) fn dependency_graph(instances: &[Instance], loops: &[LoopInfo]) -> Result<(DiGraph<usize, ()>, Vec<usize>), Diagnostic> {
    let mut graph = DiGraph::<usize, ()>::new();
    for i in 0..instances.len() {
        graph.add_node(i);
    }
    for (i, inst) in instances.iter().enumerate() {
        for (_, sources) in &inst.inputs {
            for src in sources {
                match src {
                    Source::Output { instance, .. } => {
                        graph.update_edge(NodeIndex::new(*instance), NodeIndex::new(i), ());
                    }
                    Source::LoopExit { loop_idx, .. } => {
                        // The consumer waits for every iteration (or its being skipped).
                        for it in &loops[*loop_idx].iterations {
                            for j in it.values().flatten() {
                                graph.update_edge(NodeIndex::new(*j), NodeIndex::new(i), ());
                            }
                        }
                    }
                }
            }
        }
    }
    let order = stable_toposort(&graph);
    if order.len() != instances.len() {
        return Err(Diagnostic::new(Pos::NONE, "internal: the expanded graph has a cycle"));
    }
    Ok((graph, order))
}

/// Derive an instance seed from the pipeline seed and the instance's name.
pub fn instance_seed(pipeline_seed: u64, instance: &str) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&pipeline_seed.to_le_bytes());
    h.update(instance.as_bytes());
    let b = h.finalize();
    u64::from_le_bytes(b.as_bytes()[..8].try_into().unwrap())
}

/// Topological order that prefers lower instance indices (file order) among ready nodes.
fn stable_toposort(g: &DiGraph<usize, ()>) -> Vec<usize> {
    use std::cmp::Reverse;
    let n = g.node_count();
    let mut indeg: Vec<usize> = (0..n).map(|i| g.neighbors_directed(NodeIndex::new(i), petgraph::Direction::Incoming).count()).collect();
    let mut heap: std::collections::BinaryHeap<Reverse<usize>> = (0..n).filter(|&i| indeg[i] == 0).map(Reverse).collect();
    let mut out = Vec::with_capacity(n);
    while let Some(Reverse(i)) = heap.pop() {
        out.push(i);
        for s in g.neighbors_directed(NodeIndex::new(i), petgraph::Direction::Outgoing) {
            indeg[s.index()] -= 1;
            if indeg[s.index()] == 0 {
                heap.push(Reverse(s.index()));
            }
        }
    }
    out
}
