//! Expansion of a checked, lowered pipeline into stage instances: `loop` bodies become
//! `STAGE@k`, `matrix` fans out `STAGE[key=value,…]`, placeholders are substituted, and each
//! instance gets its kind's resolved params, code version, machine profile and seed.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::Value;

use crate::check::top_order;
use crate::compile::{Instance, LoopInfo, Source, StopInfo, instance_seed};
use crate::diag::Diagnostic;
use crate::lower::{Entry, Loop, Lowered, Ref, Stage};
use crate::subst::{Scope, scalar_text};

pub struct Expanded {
    pub instances: Vec<Instance>,
    pub loops: Vec<LoopInfo>,
    /// Stage entries in file order, with their instances (for folded views).
    pub stages: Vec<(String, Vec<usize>)>,
}

struct LoopCtx<'x> {
    loop_idx: usize,
    iteration: u32,
    lp: &'x Loop<'x>,
    body: &'x BTreeMap<String, Vec<usize>>,
}

pub struct Expander<'l, 'a> {
    lowered: &'l Lowered<'a>,
    base_dir: &'l Path,
    pub diags: Vec<Diagnostic>,
    out: Expanded,
    /// Top-level stage name → its instances (for plain stages).
    top: HashMap<String, Vec<usize>>,
    /// Top-level loop name → loop index.
    loop_of: HashMap<String, usize>,
}

impl<'l, 'a> Expander<'l, 'a> {
    pub fn new(lowered: &'l Lowered<'a>, base_dir: &'l Path) -> Self {
        Expander {
            lowered,
            base_dir,
            diags: Vec::new(),
            out: Expanded { instances: Vec::new(), loops: Vec::new(), stages: Vec::new() },
            top: HashMap::new(),
            loop_of: HashMap::new(),
        }
    }

    pub fn run(mut self) -> (Expanded, Vec<Diagnostic>) {
        let lowered = self.lowered;
        // Expand in dependency order so references always point backwards.
        for i in top_order(&lowered.spec.stages) {
            let (name, _) = &lowered.spec.stages.entries[i];
            match lowered.entry(&name.value) {
                Some(Entry::Loop(l)) => self.expand_loop(l),
                Some(Entry::Stage(s)) => {
                    let idx = self.expand_stage(s, None);
                    self.top.insert(s.name.value.clone(), idx.clone());
                    self.out.stages.push((s.name.value.clone(), idx));
                }
                None => {}
            }
        }
        (self.out, self.diags)
    }

    fn expand_loop(&mut self, l: &Loop) {
        let loop_idx = self.out.loops.len();
        let carry = l.carry.iter().map(|c| (c.var.value.clone(), (c.stage.clone(), c.output.clone()))).collect();
        let stop = l.stop.as_ref().map(|s| StopInfo {
            stage: s.stage.clone(),
            metric: s.metric.clone(),
            above: s.when.above,
            below: s.when.below,
        });
        let max_iterations = l.spec.max_iterations.value;
        self.out.loops.push(LoopInfo { name: l.name.value.clone(), max_iterations, stop, carry, iterations: Vec::new() });
        let body_spec = &self.lowered.spec.stages.get(&l.name.value).expect("a lowered loop is in the file").stages;
        let body_order = top_order(body_spec);
        let mut per_stage: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for k in 1..=max_iterations {
            let mut this_iter: BTreeMap<String, Vec<usize>> = BTreeMap::new();
            for &bi in &body_order {
                let Some(st) = l.body_stage(&body_spec.entries[bi].0.value) else { continue };
                if !st.runs_in(k, max_iterations) {
                    this_iter.insert(st.name.value.clone(), vec![]);
                    continue;
                }
                let ctx = LoopCtx { loop_idx, iteration: k, lp: l, body: &this_iter };
                let idx = self.expand_stage(st, Some(&ctx));
                per_stage.entry(st.name.value.clone()).or_default().extend(&idx);
                this_iter.insert(st.name.value.clone(), idx);
            }
            self.out.loops[loop_idx].iterations.push(this_iter);
        }
        for st in &l.body {
            self.out.stages.push((st.name.value.clone(), per_stage.remove(&st.name.value).unwrap_or_default()));
        }
        self.loop_of.insert(l.name.value.clone(), loop_idx);
    }

    fn expand_stage(&mut self, st: &Stage, lp: Option<&LoopCtx>) -> Vec<usize> {
        let kind = st.kind.clone();
        let outputs = st.outputs();
        let spec = self.lowered.spec;
        let mut made = Vec::new();
        for combo in combinations(&st.spec.matrix) {
            let mut iname = st.name.value.clone();
            if let Some(l) = lp {
                iname.push_str(&format!("@{}", l.iteration));
            }
            if !combo.is_empty() {
                let parts: Vec<String> = combo.iter().map(|(k, v)| format!("{k}={}", scalar_text(v))).collect();
                iname.push_str(&format!("[{}]", parts.join(",")));
            }
            let matrix: BTreeMap<String, Value> = combo.into_iter().collect();
            let scope = Scope { params: &spec.params, matrix: &matrix, iteration: lp.map(|l| l.iteration) };
            let located = |e: crate::kind::ParamError| {
                let pos = e.key.as_deref().and_then(|k| st.spec.params.key_pos(k)).unwrap_or(st.name.pos);
                let help = e.help.unwrap_or_else(|| format!("`rao schema` lists the params of kind `{}`", kind.name()));
                Diagnostic::new(pos, format!("instance `{iname}`: {}", e.message)).help(help)
            };
            let params = match scope.params(&st.spec.params) {
                Ok(p) => p,
                Err(d) => {
                    self.diags.push(d);
                    continue;
                }
            };
            if let Err(e) = kind.check_params(&params) {
                self.diags.push(located(e));
                continue;
            }
            let resolved_params = match kind.resolve_params(&params) {
                Ok(r) => r,
                Err(e) => {
                    self.diags.push(located(e));
                    continue;
                }
            };
            let extra = match kind.fingerprint_extra(&params, self.base_dir) {
                Ok(x) => x,
                Err(msg) => {
                    self.diags.push(
                        Diagnostic::new(st.name.pos, format!("stage `{}`: {msg}", st.name.value))
                            .help("fix the file, folder or URL this stage's params name"),
                    );
                    continue;
                }
            };
            let inputs =
                st.inputs.iter().map(|i| (i.name.value.clone(), i.refs.iter().flat_map(|r| self.resolve(r, lp)).collect())).collect();
            let idx = self.out.instances.len();
            self.out.instances.push(Instance {
                seed: instance_seed(spec.seed.value, &iname),
                name: iname,
                stage: st.name.value.clone(),
                kind: kind.name().to_string(),
                kind_version: kind.version(),
                code: kind.code_version().to_string(),
                machine: kind.machine_profile(&params),
                params,
                resolved_params,
                inputs,
                outputs: outputs.clone(),
                retries: st.spec.retries.as_ref().map(|r| r.value).unwrap_or(0),
                timeout: st.spec.timeout.as_ref().map(|t| t.value.0),
                resources: st.spec.resources,
                executor: st.spec.executor.clone(),
                extra,
                iteration: lp.map(|l| (l.loop_idx, l.iteration)),
                pos: st.name.pos,
            });
            made.push(idx);
        }
        made
    }

    fn resolve(&self, r: &Ref, lp: Option<&LoopCtx>) -> Vec<Source> {
        let outputs = |idx: &Vec<usize>| idx.iter().map(|&i| Source::Output { instance: i, output: r.output.clone() }).collect::<Vec<_>>();
        if let Some(l) = lp {
            if r.is_loop_var() {
                // Iteration k reads the value after iteration k−1−lag; before iteration 1 that is
                // the init (checked: a variable read in the body has one).
                let (var, lag) = l.lp.source_of(&r.output);
                return match l.iteration.checked_sub(1 + lag).filter(|&j| j >= 1) {
                    Some(j) => self.out.loops[l.loop_idx].carry_sources(var, j),
                    None => l.lp.init_of(var).map(|init| self.resolve(init, None)).unwrap_or_default(),
                };
            }
            if let Some(idx) = l.body.get(&r.stage) {
                return outputs(idx);
            }
        }
        if let Some(&loop_idx) = self.loop_of.get(&r.stage) {
            return vec![Source::LoopExit { loop_idx, var: r.output.clone() }];
        }
        self.top.get(&r.stage).map(outputs).unwrap_or_default()
    }
}

/// Every combination of a matrix, in file order (one empty combination when there is no matrix).
fn combinations(m: &crate::spec::OrderedMap<crate::spec::Sp<Vec<Value>>>) -> Vec<Vec<(String, Value)>> {
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
