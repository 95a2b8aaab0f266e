//! `rao inspect`: an execution tree in the terminal — goals, actions, receipts and scores,
//! indented by depth.

use std::collections::BTreeMap;

use rao_core::{Mode, NodeRecord, NodeStatus, TreeKey};

/// Which trees to print. `status`: trees with a node that ended that way (`context_overflow`
/// shows where a window ran out); `failed`: trees whose root did not fully succeed.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub task: Option<String>,
    pub group: Option<i32>,
    pub mode: Option<Mode>,
    pub band: Option<String>,
    pub status: Option<NodeStatus>,
    pub failed: bool,
}

/// Render the trees of a node table that pass `filter`, at most `limit` of them. An error names
/// what exists when a task or band is unknown, or when nothing passes the filter.
pub fn render(nodes: &[NodeRecord], filter: &Filter, limit: usize) -> Result<String, String> {
    for (what, wanted, have) in [
        ("task", &filter.task, nodes.iter().map(|n| n.task_id.as_str()).collect::<Vec<_>>()),
        ("band", &filter.band, nodes.iter().map(|n| n.band.as_str()).collect::<Vec<_>>()),
    ] {
        if let Some(w) = wanted.as_deref().filter(|w| !have.contains(w)) {
            let mut known: Vec<&str> = have;
            known.sort();
            known.dedup();
            let shown: Vec<&str> = known.iter().copied().take(10).collect();
            return Err(format!(
                "no tree of {what} `{w}` in this file; its {what}s: {}{}",
                shown.join(", "),
                if known.len() > 10 { ", …" } else { "" }
            ));
        }
    }
    // An evaluation runs each task recursive and flat: the mode is part of a tree's key.
    let mut trees: BTreeMap<TreeKey, Vec<&NodeRecord>> = BTreeMap::new();
    for n in nodes {
        trees.entry(n.tree_key()).or_default().push(n);
    }
    trees.retain(|key, t| {
        let root_score = t.iter().find(|n| n.parent_id.is_none()).map(|r| r.score).unwrap_or(0.0);
        filter.task.as_ref().is_none_or(|x| *x == key.task_id)
            && filter.group.is_none_or(|g| g == key.group)
            && filter.mode.is_none_or(|m| m == key.mode)
            && filter.band.as_ref().is_none_or(|b| t.iter().any(|n| &n.band == b))
            && filter.status.is_none_or(|s| t.iter().any(|n| n.status == s))
            && (!filter.failed || root_score < 1.0)
    });
    if trees.is_empty() {
        return Err(format!("no tree passes the filter ({} nodes in the file)", nodes.len()));
    }
    let mut out = String::new();
    let total = trees.len();
    for (TreeKey { iteration, mode, task_id: task, group }, t) in trees.into_iter().take(limit) {
        let depth = t.iter().map(|n| n.depth).max().unwrap_or(0);
        let root = t.iter().find(|n| n.parent_id.is_none()).copied();
        out.push_str(&format!(
            "task {task}{} · iteration {iteration} · {mode} tree {group} · root score {} · {} nodes · depth {depth}\n",
            t.first().map(|n| n.band.as_str()).filter(|b| !b.is_empty()).map(|b| format!(" ({b})")).unwrap_or_default(),
            root.map(|r| r.score).unwrap_or(0.0),
            t.len()
        ));
        if let Some(r) = root {
            render_node(&mut out, r, &t, 0);
        }
        out.push('\n');
    }
    if total > limit {
        out.push_str(&format!("… {} more trees (use --limit, --task, --mode, --band, --status, --failed)\n", total - limit));
    }
    Ok(out)
}

fn render_node(out: &mut String, n: &NodeRecord, tree: &[&NodeRecord], indent: usize) {
    let pad = "  ".repeat(indent);
    let extra = [
        n.local_reward.map(|v| format!(" R={v:.2}")),
        n.advantage.map(|v| format!(" A={v:+.2}")),
        n.depth_weight.map(|v| format!(" w={v:.2}")),
    ]
    .into_iter()
    .flatten()
    .collect::<String>();
    out.push_str(&format!(
        "{pad}● [{}] {}  — {} · score {} · {} steps · {} tokens{extra}\n",
        n.node_id, n.goal, n.status, n.score, n.steps, n.context_tokens
    ));
    let mut children: Vec<&NodeRecord> = tree.iter().copied().filter(|c| c.parent_id == Some(n.node_id)).collect();
    children.sort_by_key(|c| c.child_index);
    for (step, t) in n.turns.iter().enumerate() {
        let action = t.action.trim_end_matches(" <eos>");
        let obs = t.observation.trim_start_matches("<obs>").trim();
        out.push_str(&format!("{pad}  {action:<28} → {obs}\n"));
        for c in children.iter().filter(|c| c.spawn_step == Some(step as i32)) {
            render_node(out, c, tree, indent + 2);
        }
    }
}
