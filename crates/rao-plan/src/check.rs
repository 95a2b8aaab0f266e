//! Every check of a lowered pipeline, each problem reported with its position before anything
//! runs: names, references, cycles, params (with the kinds' own checks), and limits that keep
//! the expansion bounded.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use petgraph::graph::{DiGraph, NodeIndex};
use serde_json::Value;

use crate::diag::{Diagnostic, did_you_mean};
use crate::lower::{Entry, Loop, Lowered, Ref, Stage};
use crate::spec::{OrderedMap, Pos, Sp, StageSpec};
use crate::subst::{Scope, scalar_text};

/// Most stage instances one pipeline may expand into (about 2.4 KB of memory each).
pub const MAX_INSTANCES: u64 = 200_000;
/// Longest per-attempt timeout (a year): longer is a typo, and too long for a clock.
pub const MAX_TIMEOUT_S: f64 = 366.0 * 86400.0;
pub const MAX_RETRIES: u32 = 100;
/// Longest stage or pipeline name. Names become store key components, so the store's limit
/// (`rao_store::layout::MAX_NAME_LEN`) must be at least this; rao-pipeline asserts it at compile time.
pub const MAX_NAME_LEN: usize = 120;

pub fn valid_name(n: &str) -> bool {
    !n.is_empty() && n.len() <= MAX_NAME_LEN && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// What [`valid_name`] takes, as help.
pub fn name_help() -> String {
    format!("use ASCII letters and digits, `_` and `-` (at most {MAX_NAME_LEN} characters)")
}

pub struct Checker<'l, 'a> {
    pub lowered: &'l Lowered<'a>,
    pub base_dir: &'l Path,
    /// The text the positions refer to (to point inside a string value).
    pub source: &'l str,
    /// `PATH=VALUE` changes applied to the file (`--set`, a variant's `set:`): an error in a
    /// value they gave names them, since the file's line shows another value.
    pub overrides: &'l [String],
    /// Where each of `overrides` was given (`--set` or `FILE:LINE:COLUMN` of a variant's
    /// `set:`); empty where not known.
    pub origins: &'l [String],
    pub diags: Vec<Diagnostic>,
}

impl Checker<'_, '_> {
    fn err(&mut self, pos: Pos, msg: impl Into<String>, help: impl Into<String>) {
        self.diags.push(Diagnostic::new(pos, msg).help(help));
    }

    pub fn check_all(&mut self) {
        let spec = self.lowered.spec;
        if !valid_name(&spec.name.value) {
            let shown: String = spec.name.value.chars().take(40).collect();
            self.err(spec.name.pos, format!("invalid pipeline name `{shown}`"), name_help());
        }
        if spec.stages.is_empty() {
            self.err(spec.name.pos, "the pipeline has no stages", "add at least one stage under `stages:`");
        }
        if let Some(store) = &spec.store
            && store.value.trim().is_empty()
        {
            self.err(store.pos, "the store path is empty", "give a folder or a URL, e.g. `.rao/store` (or leave `store:` out)");
        }
        if let Some(t) = &spec.tracking {
            if let Some(url) = t.mlflow.as_ref().filter(|u| !(u.value.starts_with("http://") || u.value.starts_with("https://"))) {
                self.err(url.pos, "`tracking.mlflow` is not an MLflow server URL", "e.g. `http://127.0.0.1:5000` (http:// or https://)");
            }
            if let Some(dir) = t.tensorboard.as_ref().filter(|d| d.value.trim().is_empty()) {
                self.err(dir.pos, "`tracking.tensorboard` is empty", "give the log folder, e.g. `runs/tb`");
            }
        }
        self.check_names();
        let lowered = self.lowered;
        for e in &lowered.entries {
            match e {
                Entry::Stage(s) => self.check_stage(s, None),
                Entry::Loop(l) => self.check_loop(l),
            }
        }
        self.check_cycles(&spec.stages, "the pipeline");
        for (name, s) in spec.stages.iter() {
            if s.loop_.is_some() {
                self.check_cycles(&s.stages, &format!("loop `{}`", name.value));
            }
        }
        self.check_size();
        // A problem in a global param is found again by every stage that uses it: say it once.
        let mut seen = std::collections::HashSet::new();
        self.diags.retain(|d| seen.insert((d.pos.line, d.pos.column, d.message.clone())));
    }

    /// Stage names are unique across the whole file (loop bodies included) and valid.
    fn check_names(&mut self) {
        let mut seen: HashMap<&str, Pos> = HashMap::new();
        let spec = self.lowered.spec;
        for (name, s) in spec.stages.iter() {
            for n in std::iter::once(name).chain(s.stages.keys_sp()) {
                if let Some(first) = seen.insert(&n.value, n.pos) {
                    self.err(
                        n.pos,
                        format!("stage name `{}` is used twice", n.value),
                        format!("it was first defined at line {}; rename one", first.line),
                    );
                }
                if !valid_name(&n.value) || n.value == "loop" {
                    let shown: String = n.value.chars().take(40).collect();
                    let help = if n.value == "loop" { "`loop` is reserved (`loop.VAR` in a loop body)".to_string() } else { name_help() };
                    self.err(n.pos, format!("invalid stage name `{shown}`"), help);
                }
            }
        }
    }

    fn check_stage(&mut self, st: &Stage, in_loop: Option<&Loop>) {
        let s = st.spec;
        let kind = st.kind.clone();
        let mut outs: HashMap<&str, Pos> = HashMap::new();
        for o in &s.outputs {
            if let Some(first) = outs.insert(&o.value, o.pos) {
                self.err(
                    o.pos,
                    format!("output `{}` of stage `{}` is declared twice", o.value, st.name.value),
                    format!("first declared at line {}; remove one", first.line),
                );
            }
            if !valid_name(&o.value) {
                self.err(o.pos, format!("invalid output name `{}`", o.value), name_help());
            }
        }
        if let (Some(fixed), Some(first)) = (kind.outputs(), s.outputs.first()) {
            self.err(
                first.pos,
                format!("kind `{}` has fixed outputs ({}); `outputs` cannot be set", kind.name(), fixed.join(", ")),
                "remove the `outputs` key",
            );
        }
        if let Some(decl) = kind.inputs() {
            for input in &st.inputs {
                if !decl.iter().any(|d| d.name == input.name.value) {
                    let help = did_you_mean(&input.name.value, decl.iter().map(|d| d.name)).unwrap_or_else(|| {
                        format!("kind `{}` takes: {}", kind.name(), decl.iter().map(|d| d.name).collect::<Vec<_>>().join(", "))
                    });
                    self.err(input.name.pos, format!("kind `{}` has no input `{}`", kind.name(), input.name.value), help);
                }
            }
            for d in decl.iter().filter(|d| d.required) {
                if !st.inputs.iter().any(|i| i.name.value == d.name) {
                    self.err(
                        st.name.pos,
                        format!("stage `{}` lacks required input `{}`", st.name.value, d.name),
                        format!("add `inputs: {{{}: STAGE.OUTPUT}}`", d.name),
                    );
                }
            }
        }
        for input in &st.inputs {
            for r in &input.refs {
                self.check_ref(r, st.name, in_loop);
            }
        }
        if let Some(t) = &s.timeout
            && t.value.0.as_secs_f64() > MAX_TIMEOUT_S
        {
            self.err(t.pos, "timeout longer than a year", "write a shorter duration, e.g. `2h`, or leave `timeout` out for no limit");
        }
        if let Some(r) = &s.retries
            && r.value > MAX_RETRIES
        {
            self.err(r.pos, format!("{} retries", r.value), format!("at most {MAX_RETRIES}"));
        }
        self.check_matrix(st);
        // Params: substitution and the kind's own checks (with the first matrix combination).
        let matrix: BTreeMap<String, Value> =
            s.matrix.iter().filter_map(|(k, v)| v.value.first().map(|x| (k.value.clone(), x.clone()))).collect();
        let scope = Scope { params: &self.lowered.spec.params, matrix: &matrix, iteration: in_loop.map(|_| 1) };
        match scope.params_in(&s.params, Some(self.source)) {
            Ok(params) => {
                self.check_io_placeholders(st, &params);
                let (overrides, origins) = (self.overrides, self.origins);
                let located = |e: crate::kind::ParamError| {
                    let pos = e.key.as_deref().and_then(|k| s.params.key_pos(k)).unwrap_or(st.name.pos);
                    let mut help = e.help.unwrap_or_else(|| format!("`rao schema` lists the params of kind `{}`", kind.name()));
                    if let Some(i) = e.key.as_deref().and_then(|k| override_of(overrides, st, k)) {
                        let given = crate::secrets::redact_overrides(std::slice::from_ref(&overrides[i])).pop().unwrap_or_default();
                        let by = origins.get(i).map_or("--set or a variant's `set:`", String::as_str);
                        help.push_str(&format!("; the value was given as `{given}` (by {by})"));
                    }
                    Diagnostic::new(pos, format!("stage `{}`: {}", st.name.value, e.message)).help(help)
                };
                match kind.check_params(&params) {
                    Err(e) => self.diags.push(located(e)),
                    Ok(()) => {
                        let inputs: Vec<&str> = st.inputs.iter().map(|i| i.name.value.as_str()).collect();
                        for e in kind.check(&params, &inputs) {
                            self.diags.push(located(e));
                        }
                        for e in kind.check_upstream(&params, &|| self.upstream(st, in_loop)) {
                            self.diags.push(located(e));
                        }
                    }
                }
            }
            Err(d) => self.diags.push(d),
        }
    }

    /// `${inputs.NAME}` / `${outputs.NAME}` in the params its kind fills them into
    /// ([`crate::kind::KindSignature::io_placeholder_params`]) name inputs / outputs of the stage: an
    /// unknown NAME was left in a shell command and reached `sh` as a broken placeholder ("Bad
    /// substitution") once upstream stages had run. `params` are substituted, so a reference
    /// brought in by a `${params.…}` is checked too (located at the value then).
    fn check_io_placeholders(&mut self, st: &Stage, params: &Value) {
        let keys = st.kind.io_placeholder_params();
        let inputs: Vec<String> = st.inputs.iter().map(|i| i.name.value.clone()).collect();
        let outputs = st.outputs();
        for key in keys {
            let Some(Value::String(text)) = params.get(*key) else { continue };
            let mut reported: Vec<&str> = Vec::new();
            for (what, names) in [("input", &inputs), ("output", &outputs)] {
                let open = format!("${{{what}s.");
                for (at, _) in text.match_indices(&open) {
                    // An unclosed one is the substitution's error (reported already).
                    let Some(len) = text[at..].find('}') else { continue };
                    let reference = &text[at..at + len + 1];
                    let name = &reference[open.len()..len];
                    if names.iter().any(|n| n == name) || reported.contains(&reference) {
                        continue;
                    }
                    reported.push(reference);
                    // At the reference itself when the param's text has it (not a global param's).
                    let (pos, via) = match st.spec.params.get(key) {
                        Some(Sp { value: Value::String(raw), pos }) => match raw.find(reference) {
                            Some(i) => (crate::subst::locate(self.source, *pos, raw, i), ""),
                            None => (*pos, " (through a `${params.…}`)"),
                        },
                        Some(w) => (w.pos, ""),
                        None => (st.name.pos, ""),
                    };
                    let help = did_you_mean(name, names.iter().map(|n| n.as_str())).unwrap_or_else(|| match (what, names.is_empty()) {
                        ("input", true) => format!("the stage has no inputs: add `inputs: {{{name}: STAGE.OUTPUT}}`"),
                        ("output", true) => format!("the stage has no outputs: add `outputs: [{name}]`"),
                        _ => format!("its {what}s: {}", names.join(", ")),
                    });
                    let message = format!("stage `{}`: `{reference}` in `{key}`{via}: the stage has no {what} `{name}`", st.name.value);
                    self.err(pos, message, help);
                }
            }
        }
    }

    /// The stages `st` reads from, transitively, nearest first (breadth-first; each once), with
    /// their params substituted (first matrix combination) and defaults filled. Stages whose
    /// params do not resolve are left out: their own checks report them.
    fn upstream(&self, st: &Stage, in_loop: Option<&Loop>) -> Vec<crate::kind::Upstream> {
        let find = |name: &str| -> Option<&Stage> {
            let sibling = in_loop.and_then(|l| l.body.iter().find(|s| s.name.value == name));
            sibling.or_else(|| match self.lowered.entry(name) {
                Some(Entry::Stage(s)) => Some(s),
                _ => None,
            })
        };
        let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::from([st.name.value.as_str()]);
        let mut queue: std::collections::VecDeque<&Stage> = std::collections::VecDeque::from([st]);
        let mut out = Vec::new();
        while let Some(s) = queue.pop_front() {
            for r in s.inputs.iter().flat_map(|i| &i.refs).filter(|r| !r.is_loop_var()) {
                let Some(up) = find(&r.stage) else { continue };
                if !seen.insert(up.name.value.as_str()) {
                    continue;
                }
                queue.push_back(up);
                let matrix: BTreeMap<String, Value> =
                    up.spec.matrix.iter().filter_map(|(k, v)| v.value.first().map(|x| (k.value.clone(), x.clone()))).collect();
                let scope = Scope { params: &self.lowered.spec.params, matrix: &matrix, iteration: in_loop.map(|_| 1) };
                if let Ok(params) = scope.params(&up.spec.params)
                    && let Ok(params) = up.kind.resolve_params(&params)
                {
                    out.push(crate::kind::Upstream {
                        stage: up.name.value.clone(),
                        kind: up.kind.name(),
                        params,
                        base_dir: self.base_dir.to_path_buf(),
                    });
                }
            }
        }
        out
    }

    /// Values present, none twice (their instances would share a name), names not too long.
    fn check_matrix(&mut self, st: &Stage) {
        let mut longest = st.name.value.len() + 8;
        for (k, v) in st.spec.matrix.iter() {
            if !valid_name(&k.value) {
                self.err(k.pos, format!("invalid matrix key `{}`", k.value), name_help());
            }
            if v.value.is_empty() {
                self.err(v.pos, format!("matrix key `{}` has no values", k.value), "give at least one value");
            }
            let mut seen: HashMap<String, usize> = HashMap::new();
            for (i, x) in v.value.iter().enumerate() {
                let text = scalar_text(x);
                if let Some(first) = seen.insert(text.clone(), i) {
                    self.err(
                        v.pos,
                        format!("matrix key `{}` lists `{text}` twice (values {} and {})", k.value, first + 1, i + 1),
                        "instances are named by their values: each value may appear once",
                    );
                }
                if text.is_empty() || text.chars().any(|c| c.is_control() || matches!(c, '/' | '\\' | '[' | ']' | ',' | '=')) {
                    self.err(
                        v.pos,
                        format!("matrix value `{}` of key `{}` cannot name an instance", text.escape_debug(), k.value),
                        "use values without `/`, `\\`, `[`, `]`, `,`, `=` or control characters",
                    );
                }
            }
            longest += k.value.len() + 1 + v.value.iter().map(|x| scalar_text(x).len()).max().unwrap_or(0) + 1;
        }
        if longest > 200 {
            self.err(
                st.name.pos,
                format!("the instances of stage `{}` get names of about {longest} characters", st.name.value),
                "shorten the matrix keys and values (instance names are at most 200 characters)",
            );
        }
    }

    fn check_loop(&mut self, l: &Loop) {
        let spec = l.spec;
        if spec.max_iterations.value == 0 {
            self.err(spec.max_iterations.pos, "max_iterations must be at least 1", "set `max_iterations: 1` or more");
        }
        if l.body.is_empty() {
            self.err(l.name.pos, format!("loop `{}` has no stages", l.name.value), "add its body under `stages:`");
        }
        for (var, r) in &l.init {
            if !l.carries(&var.value) {
                self.err(
                    var.pos,
                    format!("init variable `{}` is not carried", var.value),
                    format!("add `{}: STAGE.OUTPUT` under `carry` so iteration k feeds k+1", var.value),
                );
            }
            self.check_ref(r, l.name, None);
        }
        for c in &l.carry {
            if let Some(st) = l.body_stage(&c.stage) {
                let offered = st.outputs();
                if !offered.contains(&c.output) {
                    let help = did_you_mean(&c.output, offered.iter().map(|s| s.as_str()))
                        .unwrap_or_else(|| format!("its outputs: {}", offered.join(", ")));
                    self.err(c.pos, format!("stage `{}` has no output `{}`", c.stage, c.output), help);
                }
            }
        }
        for st in &l.body {
            if let Some(n) = &st.spec.every
                && n.value == 0
            {
                self.err(n.pos, "`every` must be at least 1", "e.g. `every: 10`: iterations 10, 20, … and the last");
            }
        }
        let sparse = |stage: &str| l.body_stage(stage).and_then(|s| s.sparse());
        let every_help = "a stage with `every` skips iterations: read it from nothing in the loop (it is for evaluations and reports)";
        for c in &l.carry {
            if let Some(n) = sparse(&c.stage) {
                self.err(c.pos, format!("carry `{}` reads `{}`, which runs only every {n} iterations", c.var.value, c.stage), every_help);
            }
        }
        if let Some(stop) = &l.stop
            && let Some(n) = sparse(&stop.stage)
            && let Some(w) = &spec.stop_when
        {
            self.err(w.metric.pos, format!("the stop metric's stage `{}` runs only every {n} iterations", stop.stage), every_help);
        }
        for st in &l.body {
            for r in st.inputs.iter().flat_map(|i| &i.refs) {
                if let Some(n) = sparse(&r.stage) {
                    self.err(
                        r.pos,
                        format!("`{}` reads `{}.{}`, which runs only every {n} iterations", st.name.value, r.stage, r.output),
                        every_help,
                    );
                }
            }
        }
        for g in &l.lag {
            if !l.carries(&g.of.value) {
                let vars: Vec<&str> = l.carry.iter().map(|c| c.var.value.as_str()).collect();
                let help =
                    did_you_mean(&g.of.value, vars.iter().copied()).unwrap_or_else(|| format!("carried variables: {}", vars.join(", ")));
                self.err(g.of.pos, format!("lag `{}` follows `{}`, which the loop does not carry", g.var.value, g.of.value), help);
            }
            if l.carries(&g.var.value) || l.init_of(&g.var.value).is_some() {
                self.err(
                    g.var.pos,
                    format!("lag `{}` has the name of a carried variable", g.var.value),
                    "give the lagged variable a name of its own, e.g. `behaviour`",
                );
            }
        }
        if let Some(stop) = &spec.stop_when
            && stop.above.is_none()
            && stop.below.is_none()
        {
            self.err(stop.metric.pos, "stop_when needs `above` or `below`", "e.g. `above: 0.9`");
        }
        for st in &l.body {
            for r in st.inputs.iter().flat_map(|i| &i.refs).filter(|r| r.is_loop_var()) {
                let (var, _) = l.source_of(&r.output);
                if l.carries(var) && l.init_of(var).is_none() {
                    self.err(
                        r.pos,
                        format!("loop variable `{}` has no value in iteration 1", r.output),
                        format!("add `{var}: STAGE.OUTPUT` under the loop's `init`"),
                    );
                }
            }
            self.check_stage(st, Some(l));
        }
    }

    /// A reference `STAGE.OUTPUT` (or `loop.VAR` in a body) must name something that exists.
    fn check_ref(&mut self, r: &Ref, from: &Sp<String>, in_loop: Option<&Loop>) {
        let lowered = self.lowered;
        if r.is_loop_var() {
            match in_loop {
                Some(l) if !l.carries(&r.output) && l.lag_of(&r.output).is_none() => {
                    let vars: Vec<&str> =
                        l.carry.iter().map(|c| c.var.value.as_str()).chain(l.lag.iter().map(|g| g.var.value.as_str())).collect();
                    let help =
                        did_you_mean(&r.output, vars.iter().copied()).unwrap_or_else(|| format!("carried variables: {}", vars.join(", ")));
                    self.err(r.pos, format!("`loop.{}`: the loop carries no variable `{}`", r.output, r.output), help);
                }
                Some(_) => {}
                None => self.err(
                    r.pos,
                    format!("`loop.{}` is only meaningful inside a loop body", r.output),
                    "refer to LOOPNAME.VAR from outside a loop",
                ),
            }
            return;
        }
        if r.stage == from.value {
            self.err(
                r.pos,
                format!("stage `{}` takes its own output `{}` as input", r.stage, r.output),
                "read another stage's output, or iterate with a `loop` that carries it",
            );
            return;
        }
        if let Some(l) = in_loop {
            if r.stage == l.name.value {
                self.err(
                    r.pos,
                    format!("`{}.{}` names the loop this stage is in", r.stage, r.output),
                    format!("inside the loop's body, its variables are `loop.{}`", r.output),
                );
                return;
            }
            if let Some(st) = l.body_stage(&r.stage) {
                return self.check_offered(r, "stage", st.outputs());
            }
        }
        match lowered.entry(&r.stage) {
            Some(Entry::Stage(st)) => self.check_offered(r, "stage", st.outputs()),
            Some(Entry::Loop(l)) => self.check_offered(r, "loop", l.carry.iter().map(|c| c.var.value.clone()).collect()),
            None if lowered.broken.contains(&r.stage) => {}
            None => {
                if let Some(l) = lowered.entries.iter().find_map(|e| match e {
                    Entry::Loop(l) if l.body_stage(&r.stage).is_some() => Some(l),
                    _ => None,
                }) {
                    let vars: Vec<&str> = l.carry.iter().map(|c| c.var.value.as_str()).collect();
                    self.err(
                        r.pos,
                        format!("stage `{}` is inside loop `{}`", r.stage, l.name.value),
                        format!("from outside a loop, refer to what it carries: `{}.VAR` ({})", l.name.value, vars.join(", ")),
                    );
                    return;
                }
                let mut names: Vec<&str> = lowered.spec.stages.keys().collect();
                if let Some(l) = in_loop {
                    names.extend(l.body.iter().map(|s| s.name.value.as_str()));
                }
                let help = did_you_mean(&r.stage, names.iter().copied()).unwrap_or_else(|| format!("stages: {}", names.join(", ")));
                self.err(r.pos, format!("input refers to unknown stage `{}`", r.stage), help);
            }
        }
    }

    fn check_offered(&mut self, r: &Ref, what: &str, offered: Vec<String>) {
        if !offered.contains(&r.output) {
            let help = did_you_mean(&r.output, offered.iter().map(|s| s.as_str()))
                .unwrap_or_else(|| format!("its outputs: {}", if offered.is_empty() { "none".to_string() } else { offered.join(", ") }));
            self.err(r.pos, format!("{what} `{}` has no output `{}`", r.stage, r.output), help);
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
                self.err(
                    first.pos,
                    format!("{scope} has a cycle: {} → {}", cycle.join(" → "), cycle[0]),
                    "a stage cannot depend on its own outputs; for iteration use a `loop` with `carry`",
                );
            }
        }
    }

    /// The expansion stays bounded: counted before any instance is made.
    fn check_size(&mut self) {
        let combos = |s: &StageSpec| s.matrix.iter().map(|(_, v)| v.value.len().max(1) as u64).fold(1u64, |a, b| a.saturating_mul(b));
        let mut total: u64 = 0;
        let mut biggest: Option<(u64, Pos, String)> = None;
        for e in &self.lowered.entries {
            let (n, pos, name) = match e {
                Entry::Stage(s) => (combos(s.spec), s.name.pos, s.name.value.clone()),
                Entry::Loop(l) => {
                    let body: u64 = l.body.iter().map(|s| combos(s.spec)).fold(0u64, |a, b| a.saturating_add(b));
                    (body.saturating_mul(l.spec.max_iterations.value as u64), l.spec.max_iterations.pos, l.name.value.clone())
                }
            };
            total = total.saturating_add(n);
            if biggest.as_ref().is_none_or(|b| n > b.0) {
                biggest = Some((n, pos, name));
            }
        }
        if total > MAX_INSTANCES {
            let (n, pos, name) = biggest.expect("a pipeline over the limit has entries");
            self.err(
                if pos.line > 0 { pos } else { self.lowered.spec.name.pos },
                format!("the pipeline expands into {total} stage instances ({n} from `{name}`); at most {MAX_INSTANCES} are allowed"),
                "lower `max_iterations` or the number of `matrix` values",
            );
        }
    }
}

/// The dependency graph of the stage entries of one scope (node i = entry i). A loop depends on
/// what its `init` and its body stages read from the scope.
pub fn scope_graph(stages: &OrderedMap<StageSpec>) -> (DiGraph<usize, ()>, Vec<NodeIndex>) {
    let names: Vec<&str> = stages.keys().collect();
    let index: HashMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let mut g = DiGraph::<usize, ()>::new();
    let nodes: Vec<NodeIndex> = (0..names.len()).map(|i| g.add_node(i)).collect();
    for (i, (_, s)) in stages.iter().enumerate() {
        let mut refs: Vec<&str> = s.inputs.iter().flat_map(|(_, r)| r.value.refs()).collect();
        if let Some(l) = &s.loop_ {
            refs.extend(l.init.iter().map(|(_, r)| r.value.as_str()));
            refs.extend(s.stages.iter().flat_map(|(_, b)| b.inputs.iter().flat_map(|(_, r)| r.value.refs())));
        }
        for r in refs {
            if let Some(j) = r.split_once('.').and_then(|(st, _)| index.get(st).copied())
                && j != i
            {
                g.update_edge(nodes[j], nodes[i], ());
            }
        }
    }
    (g, nodes)
}

/// Stage entries of one scope in an order where every referenced stage comes first (file order
/// among ready entries).
pub fn top_order(stages: &OrderedMap<StageSpec>) -> Vec<usize> {
    use std::cmp::Reverse;
    let (g, nodes) = scope_graph(stages);
    let mut indeg: Vec<usize> = nodes.iter().map(|x| g.neighbors_directed(*x, petgraph::Direction::Incoming).count()).collect();
    let mut ready: std::collections::BinaryHeap<Reverse<usize>> = (0..nodes.len()).filter(|&i| indeg[i] == 0).map(Reverse).collect();
    let mut out = Vec::with_capacity(nodes.len());
    while let Some(Reverse(i)) = ready.pop() {
        out.push(i);
        for m in g.neighbors_directed(nodes[i], petgraph::Direction::Outgoing) {
            indeg[m.index()] -= 1;
            if indeg[m.index()] == 0 {
                ready.push(Reverse(m.index()));
            }
        }
    }
    out
}

/// Which override (the last, as it wins) gave stage `st`'s param `key` its value:
/// `stages.ST.params.KEY…` itself, or `params.NAME…` of a global param the file's value of
/// `key` reads.
fn override_of(overrides: &[String], st: &Stage, key: &str) -> Option<usize> {
    let top = key.split('.').next().unwrap_or(key);
    let own = format!("stages.{}.params.{top}", st.name.value);
    let raw = st.spec.params.get(top).and_then(|v| v.value.as_str()).unwrap_or("");
    overrides.iter().rposition(|o| {
        let path = o.split_once('=').map_or(o.as_str(), |(p, _)| p);
        let reads = |g: &str| raw.contains(&format!("${{params.{g}}}")) || raw.contains(&format!("${{params.{g}."));
        path == own
            || path.starts_with(&format!("{own}."))
            || path.strip_prefix("params.").is_some_and(|g| reads(g) || reads(g.split('.').next().unwrap_or(g)))
    })
}
