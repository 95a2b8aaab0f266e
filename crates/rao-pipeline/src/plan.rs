//! `rao plan` and `rao status`: what would run and why, as text, Graphviz dot or Mermaid.

use serde::Serialize;

use crate::compile::Compiled;
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
    pub state: State,
    pub fingerprint: Option<String>,
    pub reasons: Vec<String>,
}

/// The state of every instance, in dependency order.
pub async fn rows(c: &Compiled, store: &Store) -> StoreResult<Vec<Row>> {
    let snap: Snapshot = snapshot(c, store).await?;
    let mut out = Vec::new();
    for &i in &c.order {
        let inst = &c.instances[i];
        let (state, reasons) = if snap.skipped[i] {
            (State::Skipped, vec![])
        } else if snap.manifests[i].is_some() {
            (State::Done, vec![])
        } else if let Some(why) = &snap.damaged[i] {
            (State::Stale, vec![format!("damaged: {why}")])
        } else if let Some(parts) = &snap.parts[i] {
            match last_index(c, store, &inst.name).await? {
                Some(old) if old.fingerprint == snap.fps[i].clone().unwrap() => {
                    (State::Stale, vec!["its artifacts are missing from the store".into()])
                }
                Some(old) => (State::Stale, parts.explain_change(&old.parts)),
                None => (State::Missing, vec!["never ran".into()]),
            }
        } else {
            (State::Waiting, vec!["waits for a loop to decide its last iteration".into()])
        };
        out.push(Row {
            instance: inst.name.clone(),
            stage: inst.stage.clone(),
            kind: inst.kind.clone(),
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
        State::Waiting => "will run",
        State::Skipped => "skipped",
    }
}

/// Text plan: one line per instance (or per stage entry when `folded`).
pub fn render_text(c: &Compiled, rows: &[Row], folded: bool) -> String {
    let mut s = format!("pipeline `{}` ({} stage instances)\n", c.name, rows.len());
    if folded {
        for (stage, idx) in &c.stages {
            let names: std::collections::HashSet<&str> = idx.iter().map(|&i| c.instances[i].name.as_str()).collect();
            let mine: Vec<&Row> = rows.iter().filter(|r| names.contains(r.instance.as_str())).collect();
            let cached = mine.iter().filter(|r| r.state == State::Done).count();
            let kind = mine.first().map(|r| r.kind.as_str()).unwrap_or("?");
            s.push_str(&format!("  {stage:<28} {kind:<12} ×{:<4} {cached} cached, {} to run\n", mine.len(), mine.len() - cached));
        }
        return s;
    }
    for r in rows {
        let why = if r.reasons.is_empty() { String::new() } else { format!("  ({})", r.reasons.join("; ")) };
        s.push_str(&format!("  {:<9} {:<32} {:<12}{why}\n", label(&r.state), r.instance, r.kind));
    }
    s
}

fn node_id(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

/// Graphviz dot. Folded: one node per stage entry.
pub fn render_dot(c: &Compiled, rows: &[Row], folded: bool) -> String {
    let mut s = format!("digraph \"{}\" {{\n  rankdir=LR;\n  node [shape=box, style=rounded];\n", c.name);
    for (a, b, la, lb) in edges(c, rows, folded) {
        let _ = (&la, &lb);
        s.push_str(&format!("  {} -> {};\n", node_id(&a), node_id(&b)));
    }
    for (name, lab) in nodes(c, rows, folded) {
        s.push_str(&format!("  {} [label=\"{name}\\n{lab}\"];\n", node_id(&name)));
    }
    s.push_str("}\n");
    s
}

/// Mermaid flowchart. Folded: one node per stage entry.
pub fn render_mermaid(c: &Compiled, rows: &[Row], folded: bool) -> String {
    let mut s = String::from("flowchart LR\n");
    for (name, lab) in nodes(c, rows, folded) {
        s.push_str(&format!("  {}[\"{name}<br/>{lab}\"]\n", node_id(&name)));
    }
    for (a, b, _, _) in edges(c, rows, folded) {
        s.push_str(&format!("  {} --> {}\n", node_id(&a), node_id(&b)));
    }
    s
}

fn nodes(c: &Compiled, rows: &[Row], folded: bool) -> Vec<(String, String)> {
    if folded {
        c.stages
            .iter()
            .map(|(stage, idx)| {
                let names: Vec<&str> = idx.iter().map(|&i| c.instances[i].name.as_str()).collect();
                let cached = rows.iter().filter(|r| names.contains(&r.instance.as_str()) && r.state == State::Done).count();
                (stage.clone(), format!("×{} ({cached} cached)", idx.len()))
            })
            .collect()
    } else {
        rows.iter().map(|r| (r.instance.clone(), label(&r.state).to_string())).collect()
    }
}

fn edges(c: &Compiled, _rows: &[Row], folded: bool) -> Vec<(String, String, String, String)> {
    let mut out: Vec<(String, String, String, String)> = Vec::new();
    for e in c.graph.raw_edges() {
        let (a, b) = (&c.instances[e.source().index()], &c.instances[e.target().index()]);
        let (x, y) = if folded { (a.stage.clone(), b.stage.clone()) } else { (a.name.clone(), b.name.clone()) };
        if x != y && !out.iter().any(|(p, q, _, _)| *p == x && *q == y) {
            out.push((x, y, String::new(), String::new()));
        }
    }
    out
}

/// `rao status`: per instance, done / stale / missing with the reason.
pub fn render_status(rows: &[Row]) -> String {
    let mut s = String::new();
    for r in rows {
        let word = match r.state {
            State::Done => "done",
            State::Stale => "stale",
            State::Missing => "missing",
            State::Waiting => "waiting",
            State::Skipped => "skipped",
        };
        let why = if r.reasons.is_empty() { String::new() } else { format!("  {}", r.reasons.join("; ")) };
        s.push_str(&format!("{word:<8} {:<32}{why}\n", r.instance));
    }
    let done = rows.iter().filter(|r| r.state == State::Done).count();
    s.push_str(&format!("{done}/{} done\n", rows.len()));
    s
}
