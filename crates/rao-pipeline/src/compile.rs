//! From a pipeline file to a checked, expanded DAG of stage instances.
//!
//! Validation collects every problem it can find (with positions) before anything runs.
//! Loops expand into `STAGE@k` instances and matrices into `STAGE[key=value]` instances.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use petgraph::graph::{DiGraph, NodeIndex};
use serde_json::Value;

use crate::diag::{Diagnostic, Diagnostics, did_you_mean};
use crate::kind::Registry;
use crate::spec::{OrderedMap, PipelineFile, Pos, Resources, Sp, StageSpec, StopWhen, VariantFile};

/// Default store: a directory next to the pipeline file.
pub const DEFAULT_STORE: &str = ".rao/store";

/// Where an input comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// An output of a known instance.
    Output { instance: usize, output: String },
    /// A loop variable after the loop's last iteration that ran (known only once the loop decides).
    LoopExit { loop_idx: usize, var: String },
}

/// One runnable stage instance.
#[derive(Debug, Clone)]
pub struct Instance {
    pub name: String,
    /// The stage entry it comes from.
    pub stage: String,
    pub kind: String,
    pub kind_version: u32,
    /// The kind's code version (see `StageKind::code_version`).
    pub code: String,
    /// What makes this instance's bits machine-dependent (see `StageKind::machine_profile`).
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

#[derive(Debug, Clone)]
pub struct StopInfo {
    pub stage: String,
    pub metric: String,
    pub when: StopWhen,
}

#[derive(Debug, Clone)]
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
        let (stage, output) = &self.carry[var];
        self.iterations[k as usize - 1][stage].iter().map(|&i| Source::Output { instance: i, output: output.clone() }).collect()
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
                if stop.when.is_met(mean) {
                    return Some(k);
                }
            }
        }
        Some(self.max_iterations)
    }
}

/// A checked pipeline, expanded into instances.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub name: String,
    pub seed: u64,
    pub file: PathBuf,
    pub base_dir: PathBuf,
    pub store_url: String,
    /// The file's default executor (`executor:` at the top level), if any.
    pub executor: Option<crate::spec::ExecutorSpec>,
    pub overrides: Vec<String>,
    /// The pipeline as resolved (after `--set`), for run records.
    pub resolved: Value,
    pub instances: Vec<Instance>,
    pub loops: Vec<LoopInfo>,
    /// Stage entries in file order, with the names of their instances (for folded views).
    pub stages: Vec<(String, Vec<usize>)>,
    pub graph: DiGraph<usize, ()>,
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
pub fn load(path: &Path, overrides: &[String], registry: &Registry) -> Result<Compiled, Diagnostics> {
    let label = path.display().to_string();
    let text = read_pipeline_text(path, &label)?;
    let base = path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p }).unwrap_or(Path::new("."));
    let base = base.canonicalize().unwrap_or_else(|_| base.to_path_buf());
    let (label, text, mut all_overrides) = resolve_variant(path, label, text, 0)?;
    all_overrides.extend_from_slice(overrides);
    compile_str(&label, &text, &base, &all_overrides, registry).map(|mut c| {
        c.file = path.to_path_buf();
        c.overrides = overrides.to_vec();
        c
    })
}

fn read_pipeline_text(path: &Path, label: &str) -> Result<String, Diagnostics> {
    std::fs::read_to_string(path).map_err(|e| Diagnostics {
        file: label.to_string(),
        source: String::new(),
        items: vec![Diagnostic::new(Pos::NONE, format!("cannot read pipeline file: {e}"))],
    })
}

/// Follow `extends` to the pipeline file that has the stages; returns its label and text and the
/// overrides (outermost variant last) that turn it into the variant.
fn resolve_variant(path: &Path, label: String, text: String, depth: usize) -> Result<(String, String, Vec<String>), Diagnostics> {
    let is_variant = serde_saphyr::from_str::<Value>(&text).ok().is_some_and(|v| v.get("extends").is_some());
    if !is_variant {
        return Ok((label, text, Vec::new()));
    }
    let fail = |items: Vec<Diagnostic>| Diagnostics { file: label.clone(), source: text.clone(), items };
    let v: VariantFile = serde_saphyr::from_str(&text).map_err(|e| fail(vec![parse_error(&e)]))?;
    if depth >= 8 {
        return Err(fail(vec![Diagnostic::new(v.extends.pos, "`extends` chains deeper than 8 files (is there a loop?)")]));
    }
    let base_path = path.parent().unwrap_or(Path::new(".")).join(&v.extends.value);
    let base_text = std::fs::read_to_string(&base_path).map_err(|e| {
        fail(vec![
            Diagnostic::new(v.extends.pos, format!("cannot read `{}`: {e}", base_path.display()))
                .help("`extends` takes a pipeline file path relative to this file"),
        ])
    })?;
    let (base_label, base_text, mut sets) = resolve_variant(&base_path, base_path.display().to_string(), base_text, depth + 1)?;
    sets.push(format!("name={}", v.name.value));
    // Check each change against the base here, so an error points at this file's line.
    let mut spec: PipelineFile = serde_saphyr::from_str(&base_text).map_err(|e| Diagnostics {
        file: base_label.clone(),
        source: base_text.clone(),
        items: vec![parse_error(&e)],
    })?;
    crate::overrides::apply(&mut spec, &sets).map_err(|d| fail(vec![d]))?;
    let mut problems = Vec::new();
    for (key, value) in &v.set.entries {
        let o = format!("{}={}", key.value, serde_json::to_string(&value.value).unwrap_or_default());
        match crate::overrides::apply(&mut spec, std::slice::from_ref(&o)) {
            Ok(()) => sets.push(o),
            Err(d) => problems.push(Diagnostic::new(key.pos, d.message.replacen("--set ", "set ", 1))),
        }
    }
    if !problems.is_empty() {
        return Err(fail(problems));
    }
    Ok((base_label, base_text, sets))
}

/// Like [`load`], from text (`label` names it in errors).
pub fn compile_str(label: &str, text: &str, base_dir: &Path, overrides: &[String], registry: &Registry) -> Result<Compiled, Diagnostics> {
    let fail = |items: Vec<Diagnostic>| Diagnostics { file: label.to_string(), source: text.to_string(), items };
    let mut spec: PipelineFile = serde_saphyr::from_str(text).map_err(|e| fail(vec![parse_error(&e)]))?;
    crate::overrides::apply(&mut spec, overrides).map_err(|d| fail(vec![d]))?;
    let mut c = Checker { registry, diags: Vec::new(), spec: &spec, base_dir };
    c.check_all();
    if !c.diags.is_empty() {
        return Err(fail(c.diags));
    }
    let mut out = c.expand();
    if !c.diags.is_empty() {
        return Err(fail(c.diags));
    }
    out.file = PathBuf::from(label);
    out.base_dir = base_dir.to_path_buf();
    out.overrides = overrides.to_vec();
    out.resolved = serde_json::to_value(&spec).unwrap_or(Value::Null);
    Ok(out)
}

/// Turn a YAML/serde error into a diagnostic with a suggestion where one helps.
fn parse_error(e: &serde_saphyr::Error) -> Diagnostic {
    let pos = e.location().map(|l| Pos { line: l.line(), column: l.column() }).unwrap_or(Pos::NONE);
    let full = e.without_snippet().to_string();
    // The message without serde-saphyr's own location suffix (we print positions ourselves).
    let msg = full.lines().next().unwrap_or(&full).to_string();
    let msg = match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    };
    let mut d = Diagnostic::new(pos, msg.clone());
    if let Some(rest) = msg.split("unknown field `").nth(1) {
        let wrong = rest.split('`').next().unwrap_or("");
        let expected: Vec<&str> = rest
            .split_once("expected")
            .map(|(_, e)| {
                e.trim_start_matches(" one of")
                    .trim_start_matches(" a field")
                    .split(',')
                    .map(|x| x.trim().trim_matches('`'))
                    .filter(|x| !x.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let hint = did_you_mean(wrong, expected.iter().copied()).unwrap_or_else(|| format!("allowed keys here: {}", expected.join(", ")));
        d = d.help(hint);
    } else if msg.contains("missing field") {
        d = d.help("add the missing key");
    } else if msg.contains("invalid type") || msg.starts_with("invalid ") {
        d = d.help("change the value to the expected type");
    }
    d
}

fn valid_name(n: &str) -> bool {
    !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

struct Checker<'a> {
    registry: &'a Registry,
    diags: Vec<Diagnostic>,
    spec: &'a PipelineFile,
    base_dir: &'a Path,
}

/// What a stage entry offers to others: output names (or carry vars for a loop).
fn offered_outputs(registry: &Registry, s: &StageSpec) -> Vec<String> {
    if let Some(l) = &s.loop_ {
        return l.carry.keys().map(str::to_string).collect();
    }
    let kind = s.kind.as_ref().and_then(|k| registry.get(&k.value));
    match kind.and_then(|k| k.outputs()) {
        Some(fixed) => fixed.iter().map(|s| s.to_string()).collect(),
        None => s.outputs.iter().map(|o| o.value.clone()).collect(),
    }
}

impl<'a> Checker<'a> {
    fn err(&mut self, pos: Pos, msg: impl Into<String>) {
        self.diags.push(Diagnostic::new(pos, msg));
    }
    fn err_help(&mut self, pos: Pos, msg: impl Into<String>, help: impl Into<String>) {
        self.diags.push(Diagnostic::new(pos, msg).help(help));
    }

    fn check_all(&mut self) {
        let spec = self.spec;
        if !valid_name(&spec.name.value) {
            self.err_help(spec.name.pos, format!("invalid pipeline name `{}`", spec.name.value), "use letters, digits, `_` and `-`");
        }
        if spec.stages.is_empty() {
            self.err(spec.name.pos, "the pipeline has no stages");
        }
        // Stage names are unique across the whole file (loop bodies included).
        let mut seen: HashMap<&str, Pos> = HashMap::new();
        for (name, s) in spec.stages.iter() {
            for (n, p) in std::iter::once((name, s)).chain(s.stages.iter()) {
                if let Some(first) = seen.insert(&n.value, n.pos) {
                    self.err_help(
                        n.pos,
                        format!("stage name `{}` is used twice", n.value),
                        format!("it was first defined at line {}; rename one", first.line),
                    );
                }
                if !valid_name(&n.value) {
                    self.err_help(n.pos, format!("invalid stage name `{}`", n.value), "use letters, digits, `_` and `-`");
                }
                let _ = p;
            }
        }
        for (name, s) in spec.stages.iter() {
            self.check_stage(name, s, None);
        }
        self.check_cycles(&spec.stages, "the pipeline");
        for (name, s) in spec.stages.iter() {
            if s.loop_.is_some() {
                self.check_cycles(&s.stages, &format!("loop `{}`", name.value));
            }
        }
    }

    fn check_stage(&mut self, name: &Sp<String>, s: &StageSpec, in_loop: Option<(&Sp<String>, &StageSpec)>) {
        match (&s.kind, &s.loop_) {
            (Some(_), Some(_)) => self.err_help(
                name.pos,
                format!("stage `{}` has both `kind` and `loop`", name.value),
                "a loop's stages go under its `stages:` key; remove `kind`",
            ),
            (None, None) => self.err_help(
                name.pos,
                format!("stage `{}` has no `kind`", name.value),
                format!("add `kind:` (one of: {})", self.registry.names().collect::<Vec<_>>().join(", ")),
            ),
            (None, Some(l)) => {
                if in_loop.is_some() {
                    self.err(name.pos, format!("loop `{}` is inside another loop; loops cannot nest", name.value));
                    return;
                }
                self.check_loop(name, s, l);
                return;
            }
            (Some(kind), None) => {
                if !s.stages.is_empty() {
                    self.err_help(
                        name.pos,
                        format!("stage `{}` has `stages` but no `loop`", name.value),
                        "add a `loop:` block or move the stages to the top level",
                    );
                }
                if self.registry.get(&kind.value).is_none() {
                    let help = did_you_mean(&kind.value, self.registry.names())
                        .unwrap_or_else(|| format!("known kinds: {}", self.registry.names().collect::<Vec<_>>().join(", ")));
                    self.err_help(kind.pos, format!("unknown stage kind `{}`", kind.value), help);
                    return;
                }
            }
        }
        let kind = self.registry.get(&s.kind.as_ref().unwrap().value).unwrap().clone();
        // Outputs.
        let mut outs: HashMap<&str, Pos> = HashMap::new();
        for o in &s.outputs {
            if let Some(first) = outs.insert(&o.value, o.pos) {
                self.err_help(
                    o.pos,
                    format!("output `{}` of stage `{}` is declared twice", o.value, name.value),
                    format!("first declared at line {}; remove one", first.line),
                );
            }
            if !valid_name(&o.value) {
                self.err_help(o.pos, format!("invalid output name `{}`", o.value), "use letters, digits, `_` and `-`");
            }
        }
        if let (Some(fixed), Some(first)) = (kind.outputs(), s.outputs.first()) {
            self.err_help(
                first.pos,
                format!("kind `{}` has fixed outputs ({}); `outputs` cannot be set", kind.name(), fixed.join(", ")),
                "remove the `outputs` key",
            );
        }
        // Inputs: declared names, required ones, and references.
        if let Some(decl) = kind.inputs() {
            for (iname, _) in s.inputs.iter() {
                if !decl.iter().any(|d| d.name == iname.value) {
                    let help = did_you_mean(&iname.value, decl.iter().map(|d| d.name)).unwrap_or_else(|| {
                        format!("kind `{}` takes: {}", kind.name(), decl.iter().map(|d| d.name).collect::<Vec<_>>().join(", "))
                    });
                    self.err_help(iname.pos, format!("kind `{}` has no input `{}`", kind.name(), iname.value), help);
                }
            }
            for d in decl.iter().filter(|d| d.required) {
                if s.inputs.get(d.name).is_none() {
                    self.err_help(
                        name.pos,
                        format!("stage `{}` lacks required input `{}`", name.value, d.name),
                        format!("add `inputs: {{{}: STAGE.OUTPUT}}`", d.name),
                    );
                }
            }
        }
        for (_, r) in s.inputs.iter() {
            for reference in r.value.refs() {
                self.check_ref(reference, r.pos, name, in_loop);
            }
        }
        // Params: substitution and the kind's own check (with the first matrix combination).
        let matrix = first_matrix(&s.matrix);
        for (k, v) in s.matrix.iter() {
            if v.value.is_empty() {
                self.err_help(v.pos, format!("matrix key `{}` has no values", k.value), "give at least one value");
            }
        }
        match self.substituted(&s.params, &matrix, in_loop.map(|_| 1)) {
            Ok(params) => {
                if let Err(e) = kind.check_params(&params) {
                    let pos = e.key.as_deref().and_then(|k| s.params.key_pos(k)).unwrap_or(name.pos);
                    let d = Diagnostic::new(pos, format!("stage `{}`: {}", name.value, e.message));
                    self.diags.push(match e.help {
                        Some(h) => d.help(h),
                        None => d,
                    });
                }
            }
            Err(d) => self.diags.push(d),
        }
    }

    fn check_loop(&mut self, name: &Sp<String>, s: &StageSpec, l: &crate::spec::LoopSpec) {
        if l.max_iterations.value == 0 {
            self.err_help(l.max_iterations.pos, "max_iterations must be at least 1", "set `max_iterations: 1` or more");
        }
        if s.stages.is_empty() {
            self.err_help(name.pos, format!("loop `{}` has no stages", name.value), "add its body under `stages:`");
        }
        for field in [&s.params.is_empty(), &s.inputs.is_empty(), &s.outputs.is_empty(), &s.matrix.is_empty()] {
            if !*field {
                self.err_help(
                    name.pos,
                    format!("loop `{}` takes only `loop` and `stages`", name.value),
                    "put params, inputs and outputs on the stages of its body",
                );
                break;
            }
        }
        for (var, r) in l.init.iter() {
            if l.carry.get(&var.value).is_none() {
                self.err_help(
                    var.pos,
                    format!("init variable `{}` is not carried", var.value),
                    format!("add `{}: STAGE.OUTPUT` under `carry` so iteration k feeds k+1", var.value),
                );
            }
            self.check_ref(&r.value, r.pos, name, None);
        }
        for (_, r) in l.carry.iter() {
            match r.value.split_once('.') {
                Some((st, out)) if s.stages.get(st).is_some() => {
                    let offered = offered_outputs(self.registry, s.stages.get(st).unwrap());
                    if !offered.iter().any(|o| o == out) {
                        self.err_help(
                            r.pos,
                            format!("stage `{st}` has no output `{out}`"),
                            did_you_mean(out, offered.iter().map(|s| s.as_str()))
                                .unwrap_or_else(|| format!("its outputs: {}", offered.join(", "))),
                        );
                    }
                }
                _ => self.err_help(
                    r.pos,
                    format!("carry source `{}` is not an output of this loop's body", r.value),
                    "write BODYSTAGE.OUTPUT",
                ),
            }
        }
        if let Some(stop) = &l.stop_when {
            if stop.above.is_none() && stop.below.is_none() {
                self.err_help(stop.metric.pos, "stop_when needs `above` or `below`", "e.g. `above: 0.9`");
            }
            match stop.metric.value.split_once('.') {
                Some((st, _)) if s.stages.get(st).is_some() => {}
                _ => self.err_help(
                    stop.metric.pos,
                    format!("stop metric `{}` must be BODYSTAGE.METRIC", stop.metric.value),
                    format!("body stages: {}", s.stages.keys().collect::<Vec<_>>().join(", ")),
                ),
            }
        }
        for (bname, b) in s.stages.iter() {
            // Loop variables used in the body must have an initial value.
            for (_, r) in b.inputs.iter() {
                for reference in r.value.refs() {
                    if let Some(var) = reference.strip_prefix("loop.") {
                        if l.carry.get(var).is_some() && l.init.get(var).is_none() {
                            self.err_help(
                                r.pos,
                                format!("loop variable `{var}` has no value in iteration 1"),
                                format!("add `{var}: STAGE.OUTPUT` under the loop's `init`"),
                            );
                        }
                    }
                }
            }
            self.check_stage(bname, b, Some((name, s)));
        }
    }

    /// A reference `STAGE.OUTPUT` (or `loop.VAR` in a body) must name something that exists.
    fn check_ref(&mut self, reference: &str, pos: Pos, from: &Sp<String>, in_loop: Option<(&Sp<String>, &StageSpec)>) {
        let Some((st, out)) = reference.split_once('.') else {
            self.err_help(pos, format!("input `{reference}` is not a reference"), "write STAGE.OUTPUT, e.g. `synthesize.tasks`");
            return;
        };
        if st == "loop" {
            match in_loop {
                Some((_, l)) => {
                    let lp = l.loop_.as_ref().unwrap();
                    if lp.carry.get(out).is_none() {
                        let help = did_you_mean(out, lp.carry.keys())
                            .unwrap_or_else(|| format!("carried variables: {}", lp.carry.keys().collect::<Vec<_>>().join(", ")));
                        self.err_help(pos, format!("`loop.{out}`: the loop carries no variable `{out}`"), help);
                    }
                }
                None => self.err_help(
                    pos,
                    format!("`{reference}` is only meaningful inside a loop body"),
                    "refer to LOOPNAME.VAR from outside a loop",
                ),
            }
            return;
        }
        if st == from.value {
            self.err(pos, format!("stage `{st}` takes its own output `{out}` as input"));
            return;
        }
        let target = in_loop.and_then(|(_, l)| l.stages.get(st)).or_else(|| self.spec.stages.get(st));
        let Some(target) = target else {
            let mut names: Vec<&str> = self.spec.stages.keys().collect();
            if let Some((_, l)) = in_loop {
                names.extend(l.stages.keys());
            }
            let help = did_you_mean(st, names.iter().copied()).unwrap_or_else(|| format!("stages: {}", names.join(", ")));
            self.err_help(pos, format!("input refers to unknown stage `{st}`"), help);
            return;
        };
        let offered = offered_outputs(self.registry, target);
        if !offered.iter().any(|o| o == out) {
            let what = if target.loop_.is_some() { "loop" } else { "stage" };
            let help = did_you_mean(out, offered.iter().map(|s| s.as_str()))
                .unwrap_or_else(|| format!("its outputs: {}", if offered.is_empty() { "none".to_string() } else { offered.join(", ") }));
            self.err_help(pos, format!("{what} `{st}` has no output `{out}`"), help);
        }
    }

    fn check_cycles(&mut self, stages: &OrderedMap<StageSpec>, scope: &str) {
        let names: Vec<&str> = stages.keys().collect();
        let (g, _) = scope_graph(stages);
        for scc in petgraph::algo::tarjan_scc(&g) {
            if scc.len() > 1 {
                let mut members: Vec<usize> = scc.iter().map(|n| g[*n]).collect();
                members.sort();
                let (first, _) = &stages.entries[members[0]];
                let cycle: Vec<&str> = members.iter().map(|&m| names[m]).collect();
                self.err_help(
                    first.pos,
                    format!("{scope} has a cycle: {} → {}", cycle.join(" → "), cycle[0]),
                    "a stage cannot depend on its own outputs; for iteration use a `loop` with `carry`",
                );
            }
        }
    }

    /// Params with `${params.X}`, `${matrix.X}` and `${loop.iteration}` replaced.
    fn substituted(
        &self,
        params: &OrderedMap<Sp<Value>>,
        matrix: &BTreeMap<String, Value>,
        iteration: Option<u32>,
    ) -> Result<Value, Diagnostic> {
        let mut out = serde_json::Map::new();
        for (k, v) in params.iter() {
            out.insert(k.value.clone(), subst_value(&v.value, v.pos, self.spec, matrix, iteration)?);
        }
        Ok(Value::Object(out))
    }

    fn expand(&mut self) -> Compiled {
        let mut ex = Expander {
            checker: self,
            instances: Vec::new(),
            loops: Vec::new(),
            stages: Vec::new(),
            top: HashMap::new(),
            loop_of: HashMap::new(),
        };
        ex.run();
        let Expander { instances, loops, stages, .. } = ex;
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
            self.err(Pos::NONE, "internal: expanded graph has a cycle");
        }
        let store_url = self.spec.store.as_ref().map(|s| s.value.clone()).unwrap_or_else(|| DEFAULT_STORE.to_string());
        Compiled {
            name: self.spec.name.value.clone(),
            seed: self.spec.seed.value,
            file: PathBuf::new(),
            base_dir: self.base_dir.to_path_buf(),
            store_url,
            executor: self.spec.executor.clone(),
            overrides: Vec::new(),
            resolved: Value::Null,
            instances,
            loops,
            stages,
            graph,
            order,
        }
    }
}

fn first_matrix(m: &OrderedMap<Sp<Vec<Value>>>) -> BTreeMap<String, Value> {
    m.iter().filter_map(|(k, v)| v.value.first().map(|x| (k.value.clone(), x.clone()))).collect()
}

/// Every combination of a matrix, in file order (one empty combination when there is no matrix).
fn combinations(m: &OrderedMap<Sp<Vec<Value>>>) -> Vec<Vec<(String, Value)>> {
    let mut out: Vec<Vec<(String, Value)>> = vec![Vec::new()];
    for (k, vals) in m.iter() {
        let mut next = Vec::new();
        for prefix in &out {
            for v in &vals.value {
                let mut c = prefix.clone();
                c.push((k.value.clone(), v.clone()));
                next.push(c);
            }
        }
        out = next;
    }
    out
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn subst_value(
    v: &Value,
    pos: Pos,
    spec: &PipelineFile,
    matrix: &BTreeMap<String, Value>,
    iteration: Option<u32>,
) -> Result<Value, Diagnostic> {
    match v {
        Value::String(s) => subst_str(s, pos, spec, matrix, iteration),
        Value::Array(a) => a.iter().map(|x| subst_value(x, pos, spec, matrix, iteration)).collect::<Result<_, _>>().map(Value::Array),
        Value::Object(o) => {
            let mut m = serde_json::Map::new();
            for (k, x) in o {
                m.insert(k.clone(), subst_value(x, pos, spec, matrix, iteration)?);
            }
            Ok(Value::Object(m))
        }
        other => Ok(other.clone()),
    }
}

/// Replace placeholders this engine owns; others (e.g. `${inputs.x}` for `shell`) stay.
fn subst_str(
    s: &str,
    pos: Pos,
    spec: &PipelineFile,
    matrix: &BTreeMap<String, Value>,
    iteration: Option<u32>,
) -> Result<Value, Diagnostic> {
    let lookup = |key: &str| -> Result<Option<Value>, Diagnostic> {
        if let Some(p) = key.strip_prefix("params.") {
            // `params.a.b` descends into mappings.
            let mut parts = p.split('.');
            let first = parts.next().unwrap_or("");
            let Some(mut v) = spec.params.get(first).map(|v| &v.value) else {
                return Err(Diagnostic::new(pos, format!("`${{{key}}}`: no global param `{first}`"))
                    .help(did_you_mean(first, spec.params.keys()).unwrap_or_else(|| "define it under the top-level `params:`".into())));
            };
            for part in parts {
                v = v.get(part).ok_or_else(|| Diagnostic::new(pos, format!("`${{{key}}}`: `{part}` not found")))?;
            }
            return Ok(Some(v.clone()));
        }
        if let Some(m) = key.strip_prefix("matrix.") {
            return match matrix.get(m) {
                Some(v) => Ok(Some(v.clone())),
                None => Err(Diagnostic::new(pos, format!("`${{{key}}}`: this stage has no matrix key `{m}`"))
                    .help("add it under the stage's `matrix:`")),
            };
        }
        if key == "loop.iteration" {
            return match iteration {
                Some(k) => Ok(Some(Value::from(k))),
                None => Err(Diagnostic::new(pos, "`${loop.iteration}` is only defined inside a loop body")),
            };
        }
        Ok(None)
    };
    // A string that is exactly one placeholder keeps the value's type.
    if let Some(inner) = s.strip_prefix("${").and_then(|r| r.strip_suffix('}')) {
        if !inner.contains("${") {
            if let Some(v) = lookup(inner)? {
                return Ok(v);
            }
        }
    }
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            rest = "";
            break;
        };
        let key = &after[..end];
        match lookup(key)? {
            Some(v) => out.push_str(&scalar_text(&v)),
            None => out.push_str(&rest[start..start + 2 + end + 1]),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(Value::String(out))
}

/// Derive an instance seed from the pipeline seed and the instance's name.
pub fn instance_seed(pipeline_seed: u64, instance: &str) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&pipeline_seed.to_le_bytes());
    h.update(instance.as_bytes());
    let b = h.finalize();
    u64::from_le_bytes(b.as_bytes()[..8].try_into().unwrap())
}

struct Expander<'c, 'a> {
    checker: &'c mut Checker<'a>,
    instances: Vec<Instance>,
    loops: Vec<LoopInfo>,
    stages: Vec<(String, Vec<usize>)>,
    /// Top-level stage name → its instances (for plain stages).
    top: HashMap<String, Vec<usize>>,
    /// Top-level loop name → loop index.
    loop_of: HashMap<String, usize>,
}

impl Expander<'_, '_> {
    fn run(&mut self) {
        let spec = self.checker.spec;
        // Expand in dependency order so references always point backwards.
        let order = top_order(&spec.stages);
        for i in order {
            let (name, s) = &spec.stages.entries[i];
            if let Some(l) = &s.loop_ {
                self.expand_loop(name, s, l);
            } else {
                let idx = self.expand_stage(name, s, None, &BTreeMap::new());
                self.top.insert(name.value.clone(), idx.clone());
                self.stages.push((name.value.clone(), idx));
            }
        }
    }

    fn expand_loop(&mut self, name: &Sp<String>, s: &StageSpec, l: &crate::spec::LoopSpec) {
        let loop_idx = self.loops.len();
        let carry: BTreeMap<String, (String, String)> = l
            .carry
            .iter()
            .map(|(k, v)| {
                let (st, out) = v.value.split_once('.').unwrap();
                (k.value.clone(), (st.to_string(), out.to_string()))
            })
            .collect();
        let stop = l.stop_when.as_ref().map(|w| {
            let (st, m) = w.metric.value.split_once('.').unwrap();
            StopInfo { stage: st.to_string(), metric: m.to_string(), when: w.clone() }
        });
        self.loops.push(LoopInfo { name: name.value.clone(), max_iterations: l.max_iterations.value, stop, carry, iterations: Vec::new() });
        let body_order = top_order(&s.stages);
        let mut per_stage: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for k in 1..=l.max_iterations.value {
            let mut this_iter: BTreeMap<String, Vec<usize>> = BTreeMap::new();
            for &bi in &body_order {
                let (bname, b) = &s.stages.entries[bi];
                let ctx = LoopCtx { loop_idx, iteration: k, spec: l, body: &this_iter };
                let idx = self.expand_stage(bname, b, Some(ctx), &BTreeMap::new());
                per_stage.entry(bname.value.clone()).or_default().extend(&idx);
                this_iter.insert(bname.value.clone(), idx);
            }
            self.loops[loop_idx].iterations.push(this_iter);
        }
        for (bname, _) in s.stages.iter() {
            self.stages.push((bname.value.clone(), per_stage.remove(&bname.value).unwrap_or_default()));
        }
        self.loop_of.insert(name.value.clone(), loop_idx);
    }

    fn expand_stage(&mut self, name: &Sp<String>, s: &StageSpec, lp: Option<LoopCtx>, _m: &BTreeMap<String, Value>) -> Vec<usize> {
        let registry = self.checker.registry;
        let kind = registry.get(&s.kind.as_ref().unwrap().value).unwrap().clone();
        let outputs: Vec<String> = match kind.outputs() {
            Some(f) => f.iter().map(|s| s.to_string()).collect(),
            None => s.outputs.iter().map(|o| o.value.clone()).collect(),
        };
        let mut made = Vec::new();
        for combo in combinations(&s.matrix) {
            let mut iname = name.value.clone();
            if let Some(l) = &lp {
                iname.push_str(&format!("@{}", l.iteration));
            }
            if !combo.is_empty() {
                let parts: Vec<String> = combo.iter().map(|(k, v)| format!("{k}={}", scalar_text(v))).collect();
                iname.push_str(&format!("[{}]", parts.join(",")));
            }
            let matrix: BTreeMap<String, Value> = combo.into_iter().collect();
            let params = match self.checker.substituted(&s.params, &matrix, lp.as_ref().map(|l| l.iteration)) {
                Ok(p) => p,
                Err(d) => {
                    self.checker.diags.push(d);
                    continue;
                }
            };
            if let Err(e) = kind.check_params(&params) {
                let pos = e.key.as_deref().and_then(|k| s.params.key_pos(k)).unwrap_or(name.pos);
                self.checker.diags.push(Diagnostic::new(pos, format!("instance `{iname}`: {}", e.message)));
                continue;
            }
            let resolved_params = match kind.resolve_params(&params) {
                Ok(r) => r,
                Err(e) => {
                    self.checker.diags.push(Diagnostic::new(name.pos, format!("instance `{iname}`: {}", e.message)));
                    continue;
                }
            };
            let extra = match kind.fingerprint_extra(&params, self.checker.base_dir) {
                Ok(x) => x,
                Err(msg) => {
                    self.checker.diags.push(Diagnostic::new(name.pos, format!("stage `{}`: {msg}", name.value)));
                    continue;
                }
            };
            let mut inputs = Vec::new();
            for (iname_, r) in s.inputs.iter() {
                let mut sources = Vec::new();
                for reference in r.value.refs() {
                    sources.extend(self.resolve(reference, lp.as_ref()));
                }
                inputs.push((iname_.value.clone(), sources));
            }
            let idx = self.instances.len();
            self.instances.push(Instance {
                seed: instance_seed(self.checker.spec.seed.value, &iname),
                name: iname,
                stage: name.value.clone(),
                kind: kind.name().to_string(),
                kind_version: kind.version(),
                code: kind.code_version().to_string(),
                machine: kind.machine_profile(&params),
                params,
                resolved_params,
                inputs,
                outputs: outputs.clone(),
                retries: s.retries.as_ref().map(|r| r.value).unwrap_or(0),
                timeout: s.timeout.as_ref().map(|t| t.value.0),
                resources: s.resources,
                executor: s.executor.clone(),
                extra,
                iteration: lp.as_ref().map(|l| (l.loop_idx, l.iteration)),
                pos: name.pos,
            });
            made.push(idx);
        }
        made
    }

    fn resolve(&self, reference: &str, lp: Option<&LoopCtx>) -> Vec<Source> {
        let (st, out) = reference.split_once('.').unwrap();
        let outputs = |idx: &Vec<usize>| idx.iter().map(|&i| Source::Output { instance: i, output: out.to_string() }).collect::<Vec<_>>();
        if let Some(l) = lp {
            if st == "loop" {
                if l.iteration == 1 {
                    let init = l.spec.init.get(out).expect("checked: loop variable has an init");
                    return self.resolve(&init.value, None);
                }
                return self.loops[l.loop_idx].carry_sources(out, l.iteration - 1);
            }
            if let Some(idx) = l.body.get(st) {
                return outputs(idx);
            }
        }
        if let Some(&loop_idx) = self.loop_of.get(st) {
            return vec![Source::LoopExit { loop_idx, var: out.to_string() }];
        }
        self.top.get(st).map(outputs).unwrap_or_default()
    }
}

struct LoopCtx<'a> {
    loop_idx: usize,
    iteration: u32,
    spec: &'a crate::spec::LoopSpec,
    body: &'a BTreeMap<String, Vec<usize>>,
}

/// The dependency graph of the stage entries of one scope (node i = entry i). A loop depends on
/// what its `init` and its body stages read from the scope.
fn scope_graph(stages: &OrderedMap<StageSpec>) -> (DiGraph<usize, ()>, Vec<NodeIndex>) {
    let names: Vec<&str> = stages.keys().collect();
    let mut g = DiGraph::<usize, ()>::new();
    let nodes: Vec<NodeIndex> = (0..names.len()).map(|i| g.add_node(i)).collect();
    for (i, (_, s)) in stages.iter().enumerate() {
        let mut refs: Vec<&str> = s.inputs.iter().flat_map(|(_, r)| r.value.refs()).collect();
        if let Some(l) = &s.loop_ {
            refs.extend(l.init.iter().map(|(_, r)| r.value.as_str()));
            refs.extend(s.stages.iter().flat_map(|(_, b)| b.inputs.iter().flat_map(|(_, r)| r.value.refs())));
        }
        for r in refs {
            if let Some(j) = r.split_once('.').and_then(|(st, _)| names.iter().position(|n| *n == st)) {
                if j != i {
                    g.update_edge(nodes[j], nodes[i], ());
                }
            }
        }
    }
    (g, nodes)
}

/// Stage entries of one scope in an order where every referenced stage comes first.
fn top_order(stages: &OrderedMap<StageSpec>) -> Vec<usize> {
    let names: Vec<&str> = stages.keys().collect();
    let (g, nodes) = scope_graph(stages);
    // Stable: among ready entries, file order first.
    let mut indeg: Vec<usize> = nodes.iter().map(|n| g.neighbors_directed(*n, petgraph::Direction::Incoming).count()).collect();
    let mut out = Vec::new();
    let mut done = vec![false; names.len()];
    while out.len() < names.len() {
        let Some(i) = (0..names.len()).find(|&i| !done[i] && indeg[i] == 0) else { break };
        done[i] = true;
        out.push(i);
        for n in g.neighbors_directed(nodes[i], petgraph::Direction::Outgoing) {
            indeg[n.index()] -= 1;
        }
    }
    out
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
