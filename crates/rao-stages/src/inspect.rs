//! `rao inspect`: an execution tree in the terminal — goals, actions, receipts and scores,
//! indented by depth.

use std::collections::BTreeMap;

use rao_core::NodeRecord;

/// Render the trees of a node table; `task`/`group` filter, `limit` caps the number of trees.
pub fn render(nodes: &[NodeRecord], task: Option<&str>, group: Option<i32>, limit: usize) -> String {
    // A tree is (task, iteration, mode, group): an evaluation runs each task recursive and flat.
    let mut trees: BTreeMap<(String, i32, String, i32), Vec<&NodeRecord>> = BTreeMap::new();
    for n in nodes {
        if task.is_some_and(|t| t != n.task_id) || group.is_some_and(|g| g != n.group) {
            continue;
        }
        trees.entry((n.task_id.clone(), n.iteration, n.mode.clone(), n.group)).or_default().push(n);
    }
    let mut out = String::new();
    let total = trees.len();
    for ((task, iteration, mode, group), t) in trees.into_iter().take(limit) {
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
        out.push_str(&format!("… {} more trees (use --limit, --task, --group)\n", total - limit));
    }
    out
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
