//! `rao plan` and `rao status`: what would run and why, as text, Graphviz dot or Mermaid.

use serde::Serialize;

use crate::compile::{Compiled, Source};
use crate::run_record::InstanceStatus;
use crate::snapshot::{Snapshot, last_index, snapshot};
use crate::store::{Store, StoreResult};

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Outputs are in the store for the current fingerprint.
    Done,
    /// Ran before with a different fingerprint (or its artifacts are gone); `reasons` says why.
    Stale,
    /// Never ran.
    Missing,
    /// Failed in the pipeline's last run, with the fingerprint it has now; `reasons` says how.
    Failed,
    /// Depends on a loop that has not decided its last iteration yet.
    Waiting,
    /// A loop stopped early before this iteration.
    Skipped,
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub instance: String,
    pub stage: String,
    pub kind: String,
    /// The loop iteration (from 1) of a loop-body instance; none outside loops.
    pub iteration: Option<u32>,
    pub state: State,
    pub fingerprint: Option<String>,
    pub reasons: Vec<String>,
}

/// The state of every instance, in dependency order.
pub async fn rows(c: &Compiled, store: &Store) -> StoreResult<Vec<Row>> {
    let snap: Snapshot = snapshot(c, store).await?;
    // Instances that failed or were skipped in the last run: said as such, not as absences.
    let last_run: std::collections::HashMap<String, (InstanceStatus, Option<String>, String)> =
        match crate::run_record::read(store, &c.name, "latest").await.ok().flatten() {
            Some(r) => r
                .instances
                .iter()
                .filter(|i| matches!(i.status, InstanceStatus::Failed | InstanceStatus::Skipped))
                .map(|i| {
                    let why = i.reason.as_deref().unwrap_or("no reason recorded").trim();
                    let what = if i.status == InstanceStatus::Failed { "failed" } else { "skipped" };
                    (i.name.clone(), (i.status.clone(), i.fingerprint.clone(), format!("{what} in run {}: {why}", r.run_id)))
                })
                .collect(),
            None => Default::default(),
        };
    let mut out = Vec::new();
    for &i in &c.order {
        let inst = &c.instances[i];
        let (state, reasons) = if snap.skipped[i] {
            (State::Skipped, vec![])
        } else if snap.manifests[i].is_some() {
            (State::Done, vec![])
        } else if let Some(why) = &snap.damaged[i] {
            (State::Stale, vec![format!("damaged: {why}")])
        } else if let Some((_, _, why)) =
            last_run.get(&inst.name).filter(|(st, fp, _)| *st == InstanceStatus::Failed && fp.is_some() && *fp == snap.fps[i])
        {
            (State::Failed, vec![why.clone()])
        } else if let Some(parts) = &snap.parts[i] {
            match last_index(c, store, &inst.name).await? {
                Some(old) if old.fingerprint == snap.fps[i].clone().unwrap() => {
                    (State::Stale, vec!["its artifacts are missing from the store".into()])
                }
                // The index keeps the last run of each instance name, whatever its seed: against
                // another seed's run its inputs differ too, so say which run this is against.
                Some(old) if old.parts.seed != parts.seed => {
                    let mut why = vec!["compared with its last run, which had another seed".to_string()];
                    why.extend(parts.explain_change(&old.parts).into_iter().filter(|w| w != "seed changed"));
                    (State::Stale, why)
                }
                Some(old) => (State::Stale, parts.explain_change(&old.parts)),
                None => match last_run.get(&inst.name) {
                    Some((InstanceStatus::Skipped, _, why)) => (State::Missing, vec![why.clone()]),
                    Some((_, _, why)) => (State::Missing, vec![format!("changed since it {why}")]),
                    None => (State::Missing, vec!["never ran".into()]),
                },
            }
        } else {
            (State::Waiting, vec!["waits for a loop to decide its last iteration".into()])
        };
        out.push(Row {
            instance: inst.name.clone(),
            stage: inst.stage.clone(),
            kind: inst.kind.clone(),
            iteration: inst.iteration.map(|(_, k)| k),
            state,
            fingerprint: snap.fps[i].clone(),
            reasons,
        });
    }
    Ok(out)
}

fn label(s: &State) -> &'static str {
    match s {
        State::Done => "cached",
        State::Stale => "will run",
        State::Missing => "will run",
        State::Failed => "will run",
        State::Waiting => "will run",
        State::Skipped => "skipped",
    }
}

/// How many instances are in each state.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Counts {
    pub instances: usize,
    pub cached: usize,
    pub stale: usize,
    pub missing: usize,
    pub failed: usize,
    pub waiting: usize,
    pub skipped: usize,
}

impl Counts {
    fn add(&mut self, s: &State) {
        self.instances += 1;
        match s {
            State::Done => self.cached += 1,
            State::Stale => self.stale += 1,
            State::Missing => self.missing += 1,
            State::Failed => self.failed += 1,
            State::Waiting => self.waiting += 1,
            State::Skipped => self.skipped += 1,
        }
    }
    pub fn to_run(&self) -> usize {
        self.stale + self.missing + self.failed + self.waiting
    }
    pub fn of<'a>(rows: impl IntoIterator<Item = &'a Row>) -> Counts {
        let mut c = Counts::default();
        rows.into_iter().for_each(|r| c.add(&r.state));
        c
    }
    /// `308 instances: 300 cached, 8 to run (5 stale, 3 missing)`.
    pub fn summary(&self, done_word: &str) -> String {
        let mut parts = vec![format!("{} {done_word}", self.cached)];
        let why: Vec<String> =
            [(self.failed, "failed last time"), (self.stale, "stale"), (self.missing, "missing"), (self.waiting, "waiting for a loop")]
                .iter()
                .filter(|(n, _)| *n > 0)
                .map(|(n, w)| format!("{n} {w}"))
                .collect();
        if self.to_run() > 0 {
            parts.push(format!("{} to run ({})", self.to_run(), why.join(", ")));
        }
        if self.skipped > 0 {
            parts.push(format!("{} skipped", self.skipped));
        }
        format!("{} instances: {}", self.instances, parts.join(", "))
    }
}

/// One node of a folded view: a stage entry's instances (its matrix and, in a loop, its
/// iterations) or, unfolded, one instance — except loop bodies, always folded over iterations.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    pub name: String,
    pub kind: String,
    /// The loop this stage is the body of.
    #[serde(rename = "loop", skip_serializing_if = "Option::is_none")]
    pub loop_name: Option<String>,
    #[serde(flatten)]
    pub counts: Counts,
    #[serde(skip)]
    members: Vec<usize>,
}

/// The groups of a view, in dependency order, and each instance's group.
fn groups(c: &Compiled, rows: &[Row], fold_all: bool) -> (Vec<Group>, Vec<usize>) {
    let state: std::collections::HashMap<&str, &State> = rows.iter().map(|r| (r.instance.as_str(), &r.state)).collect();
    let mut out: Vec<Group> = Vec::new();
    let mut of = vec![0; c.instances.len()];
    for &i in &c.order {
        let inst = &c.instances[i];
        let loop_name = inst.iteration.map(|(l, _)| c.loops[l].name.clone());
        let name = if fold_all || loop_name.is_some() { inst.stage.clone() } else { inst.name.clone() };
        let g = match out.iter().position(|g| g.name == name) {
            Some(g) => g,
            None => {
                out.push(Group { name, kind: inst.kind.clone(), loop_name, counts: Counts::default(), members: vec![] });
                out.len() - 1
            }
        };
        out[g].members.push(i);
        if let Some(s) = state.get(inst.name.as_str()) {
            out[g].counts.add(s);
        }
        of[i] = g;
    }
    (out, of)
}

/// Edges between groups (deduplicated, no self-loops): what each instance reads. A stage that
/// reads a loop's result reads the stage its variable is carried from; the scheduler's waiting
/// for the loop's other stages (to know which iteration is the last) is not data and not drawn.
fn group_edges(c: &Compiled, of: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (i, inst) in c.instances.iter().enumerate() {
        for source in inst.inputs.iter().flat_map(|(_, sources)| sources) {
            let from: Vec<usize> = match source {
                Source::Output { instance, .. } => vec![*instance],
                Source::LoopExit { loop_idx, var } => {
                    let l = &c.loops[*loop_idx];
                    let stage = l.carry.get(var).map(|(stage, _)| stage);
                    l.iterations.iter().filter_map(|it| it.get(stage?)).flatten().copied().collect()
                }
            };
            for j in from {
                let edge = (of[j], of[i]);
                if edge.0 != edge.1 && !out.contains(&edge) {
                    out.push(edge);
                }
            }
        }
    }
    out
}

/// Text plan: one line per instance (or per stage entry when `folded`), then the totals.
pub fn render_text(c: &Compiled, rows: &[Row], folded: bool) -> String {
    let mut s = format!("pipeline `{}` ({} stage instances)\n", c.name, rows.len());
    if folded {
        for g in groups(c, rows, true).0 {
            let n = &g.counts;
            s.push_str(&format!("  {:<28} {:<12} ×{:<4} {} cached, {} to run\n", g.name, g.kind, n.instances, n.cached, n.to_run()));
        }
    } else {
        for r in rows {
            let why = if r.reasons.is_empty() { String::new() } else { format!("  ({})", r.reasons.join("; ")) };
            s.push_str(&format!("  {:<9} {:<32} {:<12}{why}\n", label(&r.state), r.instance, r.kind));
        }
    }
    s.push_str(&Counts::of(rows).summary("cached"));
    s.push('\n');
    s
}

/// Folded JSON: one object per stage entry with its counts.
pub fn folded_json(c: &Compiled, rows: &[Row]) -> Vec<Group> {
    groups(c, rows, true).0
}

/// A dot/mermaid node id for a name: letters and digits as they are, `_` doubled, any other byte
/// as `_` and two hex digits — so `a-b`, `a_b` and `a.b` stay three nodes.
fn node_id(name: &str) -> String {
    let mut id = String::with_capacity(name.len());
    for b in name.bytes() {
        match b {
            b'_' => id.push_str("__"),
            b if b.is_ascii_alphanumeric() => id.push(b as char),
            b => id.push_str(&format!("_{b:02x}")),
        }
    }
    id
}

/// Fill colour of a group: all cached, some to run, all skipped.
fn colour(n: &Counts) -> &'static str {
    if n.to_run() > 0 {
        "#ffd8a8"
    } else if n.cached == 0 && n.skipped > 0 {
        "#e0e0e0"
    } else {
        "#c8ecc8"
    }
}

fn group_label(g: &Group) -> String {
    let n = &g.counts;
    let times = if g.members.len() > 1 { format!(" ×{}", g.members.len()) } else { String::new() };
    let state = match (n.cached, n.to_run(), n.skipped) {
        (_, 0, 0) => "cached".to_string(),
        (0, _, 0) => "will run".to_string(),
        (c, r, k) => [(c, "cached"), (r, "to run"), (k, "skipped")]
            .iter()
            .filter(|(x, _)| *x > 0)
            .map(|(x, w)| format!("{x} {w}"))
            .collect::<Vec<_>>()
            .join(", "),
    };
    format!("{}\\n{}{times} · {state}", g.name, g.kind)
}

/// Graphviz dot: loop bodies as clusters (one node per body stage, folded over iterations);
/// green: cached, orange: will run, grey: skipped. Folded: one node per stage entry.
pub fn render_dot(c: &Compiled, rows: &[Row], folded: bool) -> String {
    let (gs, of) = groups(c, rows, folded);
    let mut s = format!(
        "digraph \"{}\" {{\n  rankdir=LR;\n  label=\"{}\\n{}; green: cached, orange: will run, grey: skipped\";\n  node [shape=box, style=\"rounded,filled\"];\n",
        c.name,
        c.name,
        Counts::of(rows).summary("cached")
    );
    let node = |g: &Group| format!("{} [label=\"{}\", fillcolor=\"{}\"];", node_id(&g.name), group_label(g), colour(&g.counts));
    for g in gs.iter().filter(|g| g.loop_name.is_none()) {
        s.push_str(&format!("  {}\n", node(g)));
    }
    for l in &c.loops {
        s.push_str(&format!(
            "  subgraph cluster_{} {{\n    label=\"loop {} (up to {} iterations)\";\n    style=dashed;\n",
            node_id(&l.name),
            l.name,
            l.max_iterations
        ));
        for g in gs.iter().filter(|g| g.loop_name.as_deref() == Some(l.name.as_str())) {
            s.push_str(&format!("    {}\n", node(g)));
        }
        s.push_str("  }\n");
    }
    for (a, b) in group_edges(c, &of) {
        s.push_str(&format!("  {} -> {};\n", node_id(&gs[a].name), node_id(&gs[b].name)));
    }
    s.push_str("}\n");
    s
}

/// Mermaid flowchart, with the same grouping and colours as the dot output.
pub fn render_mermaid(c: &Compiled, rows: &[Row], folded: bool) -> String {
    let (gs, of) = groups(c, rows, folded);
    let mut s =
        String::from("flowchart LR\n  classDef cached fill:#c8ecc8\n  classDef run fill:#ffd8a8\n  classDef skipped fill:#e0e0e0\n");
    let node = |g: &Group| {
        let class = match colour(&g.counts) {
            "#ffd8a8" => "run",
            "#e0e0e0" => "skipped",
            _ => "cached",
        };
        format!("s_{}[\"{}\"]:::{class}", node_id(&g.name), group_label(g).replace("\\n", "<br/>"))
    };
    for g in gs.iter().filter(|g| g.loop_name.is_none()) {
        s.push_str(&format!("  {}\n", node(g)));
    }
    for l in &c.loops {
        // Subgraphs and nodes share mermaid's ids: stages are `s_…`, loops `loop_…`.
        s.push_str(&format!("  subgraph loop_{}[\"loop {}\"]\n", node_id(&l.name), l.name));
        for g in gs.iter().filter(|g| g.loop_name.as_deref() == Some(l.name.as_str())) {
            s.push_str(&format!("    {}\n", node(g)));
        }
        s.push_str("  end\n");
    }
    for (a, b) in group_edges(c, &of) {
        s.push_str(&format!("  s_{} --> s_{}\n", node_id(&gs[a].name), node_id(&gs[b].name)));
    }
    s
}

/// `rao status`: per instance (or per stage entry when `folded`), done / stale / missing with
/// the reason, then the totals.
pub fn render_status(c: &Compiled, rows: &[Row], folded: bool) -> String {
    let mut s = String::new();
    if folded {
        for g in groups(c, rows, true).0 {
            let n = &g.counts;
            // One word for the group, agreeing with the counts after it.
            let word = if n.failed > 0 {
                "failed"
            } else if n.to_run() == 0 && n.cached > 0 {
                "done"
            } else if n.cached == 0 && n.to_run() == n.missing {
                "missing"
            } else if n.cached == 0 && n.to_run() == n.stale {
                "stale"
            } else {
                "partial"
            };
            s.push_str(&format!(
                "{word:<8} {:<28} ×{:<4} {}\n",
                g.name,
                n.instances,
                n.summary("done").split_once(": ").map(|x| x.1).unwrap_or("")
            ));
        }
    } else {
        for r in rows {
            let word = match r.state {
                State::Done => "done",
                State::Stale => "stale",
                State::Missing => "missing",
                State::Failed => "failed",
                State::Waiting => "waiting",
                State::Skipped => "skipped",
            };
            let why = if r.reasons.is_empty() { String::new() } else { format!("  {}", r.reasons.join("; ")) };
            s.push_str(&format!("{word:<8} {:<32}{why}\n", r.instance));
        }
    }
    let done = rows.iter().filter(|r| r.state == State::Done).count();
    s.push_str(&format!("{done}/{} done · {}\n", rows.len(), Counts::of(rows).summary("done")));
    s
}

#[cfg(test)]
mod tests {
    /// Names that differ only in their punctuation are different nodes.
    #[test]
    fn node_ids_of_different_names_differ() {
        let names = ["a-b", "a_b", "a.b", "a__b", "a_5fb", "s_k_a_b_", "rollout@1", "e[window=64]", "é"];
        let ids: std::collections::BTreeSet<String> = names.iter().map(|n| super::node_id(n)).collect();
        assert_eq!(ids.len(), names.len(), "{ids:?}");
        assert!(ids.iter().all(|id| id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')), "{ids:?}");
    }
}
