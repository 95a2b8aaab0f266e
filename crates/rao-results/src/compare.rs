//! `rao compare`: pipelines (variants) side by side, each over one or more seeds — the parameters
//! that differ, and every evaluation metric with a 95% interval and a test against the first
//! pipeline. Pure computation over results already in the store.

use serde::Serialize;
use serde_json::Value;

use rao_core::Mode;
use rao_stages::evaluate::EvalRow;

use crate::results::StageMetric;
use crate::stats;

/// The evaluation metrics compared, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    Success,
    MeanScore,
    MeanDepth,
    MeanNodes,
    StepsPerTask,
    TokensPerTask,
    OverflowRate,
    SecondsPerTask,
}

impl Metric {
    pub const ALL: [Metric; 8] = [
        Metric::Success,
        Metric::MeanScore,
        Metric::MeanDepth,
        Metric::MeanNodes,
        Metric::StepsPerTask,
        Metric::TokensPerTask,
        Metric::OverflowRate,
        Metric::SecondsPerTask,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Metric::Success => "success",
            Metric::MeanScore => "mean_score",
            Metric::MeanDepth => "mean_depth",
            Metric::MeanNodes => "mean_nodes",
            Metric::StepsPerTask => "steps_per_task",
            Metric::TokensPerTask => "tokens_per_task",
            Metric::OverflowRate => "overflow_rate",
            Metric::SecondsPerTask => "seconds_per_task",
        }
    }
    /// The range every value lies in: counts, sizes and times are never negative, rates and
    /// scores (partial credit) never above 1 (an interval over seeds is clipped to it).
    pub fn range(self) -> (f64, f64) {
        match self {
            Metric::Success | Metric::MeanScore | Metric::OverflowRate => (0.0, 1.0),
            _ => (0.0, f64::INFINITY),
        }
    }
    pub fn parse(s: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.name() == s)
    }
    pub fn of(self, r: &EvalRow) -> f64 {
        match self {
            Metric::Success => r.success,
            Metric::MeanScore => r.mean_score,
            Metric::MeanDepth => r.mean_depth,
            Metric::MeanNodes => r.mean_nodes,
            Metric::StepsPerTask => r.steps_per_task,
            Metric::TokensPerTask => r.tokens_per_task,
            Metric::OverflowRate => r.overflow_rate,
            Metric::SecondsPerTask => r.seconds_per_task,
        }
    }
}

/// An evaluate instance: its stage, and the loop iteration it measured where the stage is in a
/// loop (a point of a learning curve, `heldout@10`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct EvalPoint {
    pub stage: String,
    pub iteration: Option<u32>,
}

impl std::fmt::Display for EvalPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.iteration {
            Some(i) => write!(f, "{}@{i}", self.stage),
            None => f.write_str(&self.stage),
        }
    }
}

/// One seed of one pipeline: its evaluations as found in the store.
#[derive(Debug, Clone)]
pub struct SeedRun {
    pub seed: u64,
    /// (evaluate instance, its rows).
    pub evaluations: Vec<(EvalPoint, Vec<EvalRow>)>,
    /// Evaluate instances not in the store, and the command that produces them.
    pub missing: Vec<EvalPoint>,
    pub command: String,
    /// Metrics of training stages asked for (`rollout.root_success`, `warmstart.steps`).
    pub training: Vec<(String, StageMetric)>,
}

/// A loop stage's metric over the iterations of one seed of one pipeline (a training curve).
#[derive(Debug, Clone, Serialize)]
pub struct TrainingCurve {
    pub arm: usize,
    pub seed: u64,
    /// `rollout.root_success`: the stage (instance name without its iteration) and the metric.
    pub name: String,
    /// (iteration, value), in order.
    pub points: Vec<(u32, f64)>,
}

/// A metric of a stage run once (a warm start's `steps`) for one seed of one pipeline.
#[derive(Debug, Clone, Serialize)]
pub struct StageValue {
    pub arm: usize,
    pub seed: u64,
    /// `warmstart.steps`: the stage and the metric.
    pub name: String,
    /// `None`: the stage is not in the store.
    pub value: Option<f64>,
}

/// One pipeline file (a variant, usually) over its seeds.
#[derive(Debug, Clone)]
pub struct Arm {
    pub file: String,
    pub name: String,
    /// The pipeline after variants and overrides (of its first seed).
    pub resolved: Value,
    pub runs: Vec<SeedRun>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ParamDiff {
    pub path: String,
    /// One per arm (`None`: not set there).
    pub values: Vec<Option<Value>>,
}

/// One metric of one (evaluation, mode, band) for one arm.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// The evaluate stage, and the loop iteration it measured (none outside loops).
    pub evaluation: String,
    pub iteration: Option<u32>,
    pub mode: Mode,
    pub band: String,
    pub metric: Metric,
    pub arm: usize,
    pub label: String,
    /// Seeds that have this row, and their values.
    pub seeds: Vec<u64>,
    pub per_seed: Vec<f64>,
    /// Mean over seeds.
    pub value: f64,
    /// 95%: Wilson for one seed's success, t over seeds for several; `None` where neither applies.
    pub ci: Option<(f64, f64)>,
    /// Two-sided test against the first arm's cell (none for the first arm).
    pub p: Option<f64>,
    pub test: Option<&'static str>,
}

impl Cell {
    /// The evaluate instance it comes from (`evaluate`, `heldout@10`).
    pub fn point(&self) -> EvalPoint {
        EvalPoint { stage: self.evaluation.clone(), iteration: self.iteration }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Missing {
    /// Which of the compared files (its index): two may share a `name:`.
    pub arm: usize,
    pub pipeline: String,
    pub seed: u64,
    pub instances: Vec<String>,
    pub command: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub pipelines: Vec<(String, String, Vec<u64>)>,
    pub params: Vec<ParamDiff>,
    pub cells: Vec<Cell>,
    pub training: Vec<TrainingCurve>,
    pub stage_values: Vec<StageValue>,
    pub missing: Vec<Missing>,
}

/// Every training metric read, with its arm and seed.
fn training_of(arms: &[Arm]) -> impl Iterator<Item = (usize, u64, &String, &StageMetric)> {
    arms.iter().enumerate().flat_map(|(arm, a)| a.runs.iter().flat_map(move |r| r.training.iter().map(move |(n, m)| (arm, r.seed, n, m))))
}

pub fn compare(arms: &[Arm], metrics: &[Metric]) -> Comparison {
    let keys = row_keys(arms);
    let mut cells = Vec::new();
    for key in &keys {
        for &metric in metrics {
            let first = cell(&arms[0], 0, key, metric);
            for (a, arm) in arms.iter().enumerate() {
                let Some(mut c) = (if a == 0 { first.clone() } else { cell(arm, a, key, metric) }) else { continue };
                if let (true, Some(base)) = (a > 0, &first) {
                    (c.p, c.test) = test(base, &c, arms, key);
                }
                cells.push(c);
            }
        }
    }
    // A metric that equals success everywhere (scores of 0 or 1) adds nothing.
    let redundant = |m: Metric| m == Metric::MeanScore && rows_of(arms).all(|r| (r.mean_score - r.success).abs() < 1e-9);
    cells.retain(|c| !redundant(c.metric));
    Comparison {
        pipelines: arms.iter().map(|a| (a.name.clone(), a.file.clone(), a.runs.iter().map(|r| r.seed).collect())).collect(),
        params: param_diffs(arms),
        cells,
        training: training_of(arms)
            .filter_map(|(arm, seed, name, m)| match m {
                StageMetric::Curve(points) => Some(TrainingCurve { arm, seed, name: name.clone(), points: points.clone() }),
                StageMetric::Once(_) => None,
            })
            .collect(),
        stage_values: training_of(arms)
            .filter_map(|(arm, seed, name, m)| match m {
                StageMetric::Once(value) => Some(StageValue { arm, seed, name: name.clone(), value: *value }),
                StageMetric::Curve(_) => None,
            })
            .collect(),
        missing: arms
            .iter()
            .enumerate()
            .flat_map(|(arm, a)| {
                a.runs.iter().filter(|r| !r.missing.is_empty()).map(move |r| Missing {
                    arm,
                    pipeline: a.name.clone(),
                    seed: r.seed,
                    instances: r.missing.iter().map(EvalPoint::to_string).collect(),
                    command: r.command.clone(),
                })
            })
            .collect(),
    }
}

type Key = (EvalPoint, Mode, String);

fn rows_of(arms: &[Arm]) -> impl Iterator<Item = &EvalRow> {
    arms.iter().flat_map(|a| a.runs.iter().flat_map(|r| r.evaluations.iter().flat_map(|(_, rows)| rows.iter())))
}

/// (evaluation instance, mode, band) in order of first appearance.
fn row_keys(arms: &[Arm]) -> Vec<Key> {
    let mut keys: Vec<Key> = Vec::new();
    for a in arms {
        for r in &a.runs {
            for (inst, rows) in &r.evaluations {
                for row in rows {
                    let k = (inst.clone(), row.mode, row.band.clone());
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
            }
        }
    }
    keys
}

fn rows_for<'a>(arm: &'a Arm, key: &Key) -> Vec<(u64, &'a EvalRow)> {
    arm.runs
        .iter()
        .filter_map(|r| {
            let rows = &r.evaluations.iter().find(|(i, _)| *i == key.0)?.1;
            Some((r.seed, rows.iter().find(|x| x.mode == key.1 && x.band == key.2)?))
        })
        .collect()
}

fn cell(arm: &Arm, a: usize, key: &Key, metric: Metric) -> Option<Cell> {
    let rows = rows_for(arm, key);
    let (_, first) = rows.first()?;
    let per_seed: Vec<f64> = rows.iter().map(|(_, r)| metric.of(r)).collect();
    let value = per_seed.iter().sum::<f64>() / per_seed.len() as f64;
    let ci = match (rows.len(), metric) {
        (1, Metric::Success) => Some((first.ci_low, first.ci_high)),
        (1, _) => None,
        _ => stats::t_interval(&per_seed).map(|(_, lo, hi)| {
            let (min, max) = metric.range();
            (lo.max(min), hi.min(max))
        }),
    };
    Some(Cell {
        evaluation: key.0.stage.clone(),
        iteration: key.0.iteration,
        mode: key.1,
        band: key.2.clone(),
        metric,
        arm: a,
        label: first.label.clone(),
        seeds: rows.iter().map(|(s, _)| *s).collect(),
        per_seed,
        value,
        ci,
        p: None,
        test: None,
    })
}

/// Welch over seeds where both sides have two or more; for success otherwise Fisher's exact
/// test on the tasks pooled over seeds.
fn test(base: &Cell, c: &Cell, arms: &[Arm], key: &Key) -> (Option<f64>, Option<&'static str>) {
    if base.per_seed.len() >= 2 && c.per_seed.len() >= 2 {
        return (stats::welch(&base.per_seed, &c.per_seed), Some("welch"));
    }
    if c.metric != Metric::Success {
        return (None, None);
    }
    let pooled = |arm: &Arm| -> (u64, u64) {
        rows_for(arm, key).iter().fold((0, 0), |(k, n), (_, r)| (k + (r.success * r.tasks as f64).round() as u64, n + r.tasks as u64))
    };
    let ((k1, n1), (k2, n2)) = (pooled(&arms[base.arm]), pooled(&arms[c.arm]));
    (stats::fisher_exact(k1, n1, k2, n2), Some("fisher"))
}

/// Dotted paths whose values differ between arms (`name` included; `$schema` not).
fn param_diffs(arms: &[Arm]) -> Vec<ParamDiff> {
    let flat: Vec<Vec<(String, Value)>> = arms.iter().map(|a| crate::results::flatten(&a.resolved)).collect();
    let mut paths: Vec<String> = Vec::new();
    for f in &flat {
        for (p, _) in f {
            if !paths.contains(p) && p != "$schema" {
                paths.push(p.clone());
            }
        }
    }
    paths
        .into_iter()
        .filter_map(|p| {
            let values: Vec<Option<Value>> = flat.iter().map(|f| f.iter().find(|(q, _)| *q == p).map(|(_, v)| v.clone())).collect();
            values.iter().any(|v| *v != values[0]).then_some(ParamDiff { path: p, values })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(nodes: f64, success: f64) -> EvalRow {
        EvalRow {
            label: "rao".into(),
            mode: Mode::Recursive,
            band: "hard".into(),
            tasks: 40,
            success,
            mean_score: success,
            ci_low: 0.0,
            ci_high: 1.0,
            mean_depth: 1.0,
            mean_nodes: nodes,
            steps_per_task: 1.0,
            tokens_per_task: 1.0,
            overflow_rate: 0.0,
            seconds_per_task: 0.1,
        }
    }

    /// Two seeds far apart give a t interval wider than the mean on each side: it is clipped to
    /// what the metric can be (no negative node counts, no success above 1).
    #[test]
    fn intervals_over_seeds_stay_within_what_a_metric_can_be() {
        let runs = [(1, 1.0, 0.95), (2, 10.0, 1.0)]
            .map(|(seed, nodes, success)| SeedRun {
                seed,
                evaluations: vec![(EvalPoint { stage: "evaluate".into(), iteration: None }, vec![row(nodes, success)])],
                missing: vec![],
                command: String::new(),
                training: vec![],
            })
            .to_vec();
        let arm = Arm { file: "p.yaml".into(), name: "p".into(), resolved: Value::Null, runs };
        let cmp = compare(&[arm], &[Metric::MeanNodes, Metric::Success]);
        let ci = |m: Metric| cmp.cells.iter().find(|c| c.metric == m).unwrap().ci.unwrap();
        let (t_nodes, t_success) = (stats::t_interval(&[1.0, 10.0]).unwrap(), stats::t_interval(&[0.95, 1.0]).unwrap());
        assert!(t_nodes.1 < 0.0 && t_success.2 > 1.0, "the raw intervals cross the bounds: {t_nodes:?} {t_success:?}");
        assert_eq!(ci(Metric::MeanNodes), (0.0, t_nodes.2));
        assert_eq!(ci(Metric::Success), (t_success.1, 1.0));
    }
}
