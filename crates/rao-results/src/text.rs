//! The evaluation summary for a terminal: one row per (evaluation, mode, band), under 110 columns.

use rao_stages::evaluate::EvalRow;

/// `score` appears only where some root scores are partial (e.g. 0.75^|error| for counts); where
/// scores are 0 or 1 it would repeat `success`.
pub fn eval_table(rows: &[EvalRow]) -> String {
    let partial = rows.iter().any(|r| (r.mean_score - r.success).abs() > 1e-9);
    let w = rows.iter().map(|r| r.label.len()).chain([5]).max().unwrap_or(5).min(24);
    let b = rows.iter().map(|r| r.band.len()).chain([4]).max().unwrap_or(4).min(16);
    let score_head = if partial { format!(" {:>6}", "score") } else { String::new() };
    let mut s = format!(
        "{:<w$} {:<9} {:<b$} {:>5} {:>7} {:>12}{score_head} {:>5} {:>6} {:>7} {:>8} {:>7}\n",
        "label", "mode", "band", "tasks", "success", "95% CI", "depth", "nodes", "tokens", "overflow", "s/task"
    );
    for r in rows {
        let score = if partial { format!(" {:>6.2}", r.mean_score) } else { String::new() };
        s.push_str(&format!(
            "{:<w$} {:<9} {:<b$} {:>5} {:>7.2} {:>12}{score} {:>5.2} {:>6.1} {:>7.0} {:>8.2} {:>7.3}\n",
            r.label,
            r.mode,
            r.band,
            r.tasks,
            r.success,
            format!("[{:.2}, {:.2}]", r.ci_low, r.ci_high),
            r.mean_depth,
            r.mean_nodes,
            r.tokens_per_task,
            r.overflow_rate,
            r.seconds_per_task
        ));
    }
    s
}

/// Each stage's instances, time and outputs: the report of a pipeline without evaluations.
pub fn stage_table(costs: &[crate::results::StageCost]) -> String {
    let w = costs.iter().map(|c| c.stage.len()).chain([5]).max().unwrap_or(5).min(32);
    let k = costs.iter().map(|c| c.kind.len()).chain([4]).max().unwrap_or(4).min(16);
    let mut s = format!("{:<w$}  {:<k$}  {:>9}  {:>8}  {:>9}  outputs\n", "stage", "kind", "instances", "time", "bytes");
    for c in costs {
        s += &format!(
            "{:<w$}  {:<k$}  {:>9}  {:>7.1}s  {:>9}  {}\n",
            c.stage,
            c.kind,
            c.instances,
            c.seconds,
            c.bytes,
            c.outputs.join(", ")
        );
    }
    s
}
