//! Everything the store says about one run of a pipeline as given: the run that produced its
//! evaluations, every evaluation, the metric every instance recorded (per loop iteration: the
//! learning curves), and what each stage cost.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context;
use rao_core::{Mode, TreeKey};
use rao_pipeline::plan::State;
use rao_pipeline::{Compiled, Store};
use rao_stages::evaluate::EvalRow;
use rao_stages::kinds::EVALUATE;
use rao_store::manifest::{self, Manifest};
use serde::Serialize;
use serde_json::Value;

use crate::compare::EvalPoint;

/// The run record's facts a report shows.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    pub run_id: String,
    pub status: String,
    pub started_at: f64,
    pub finished_at: Option<f64>,
    /// Empty for runs recorded before rao kept it.
    pub code_version: String,
    pub executor: String,
}

/// One finished instance and what its manifest says.
#[derive(Debug, Clone)]
pub struct Instance {
    pub name: String,
    pub stage: String,
    pub kind: String,
    pub manifest: Manifest,
}

impl Instance {
    /// `k` of a loop-body instance `stage@k` (or `stage@k[key=value]`).
    pub fn iteration(&self) -> Option<u32> {
        iteration_of(&self.name)
    }
    /// The instance name without its iteration: what one learning curve follows.
    pub fn series(&self) -> String {
        series_of(&self.name)
    }
}

/// The loop iteration of an instance name (`rollout@3` → 3; `evaluate` → none).
pub fn iteration_of(name: &str) -> Option<u32> {
    let rest = name.split_once('@')?.1;
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// An instance name without its iteration: what one learning curve follows.
pub fn series_of(name: &str) -> String {
    match name.split_once('@') {
        Some((stage, rest)) => format!("{stage}{}", rest.trim_start_matches(|c: char| c.is_ascii_digit())),
        None => name.to_string(),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    pub instance: String,
    pub fingerprint: String,
    /// When it finished (seconds since the Unix epoch).
    pub finished_at: f64,
    pub rows: Vec<EvalRow>,
    /// Trees per maximum depth, per mode.
    pub depths: BTreeMap<Mode, BTreeMap<i32, usize>>,
}

/// One metric of one loop-body stage over the iterations.
#[derive(Debug, Clone, Serialize)]
pub struct Curve {
    pub series: String,
    pub metric: String,
    pub points: Vec<Point>,
}

/// A curve a stage recorded while it ran (the warm start's loss and gate checks), by step.
#[derive(Debug, Clone, Serialize)]
pub struct StepCurve {
    pub instance: String,
    pub metric: String,
    pub points: Vec<(u64, f64)>,
    /// When the instance finished (seconds since the Unix epoch).
    pub time: f64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Point {
    pub iteration: u32,
    pub value: f64,
    /// When the instance finished (seconds since the Unix epoch).
    pub time: f64,
}

/// Wall-clock the instances of one stage took when they ran (cached ones included: what these
/// results cost to produce).
#[derive(Debug, Clone, Serialize)]
pub struct StageCost {
    pub stage: String,
    pub kind: String,
    pub instances: usize,
    pub seconds: f64,
    /// The stage's outputs (names) and their files' bytes, over its instances.
    pub outputs: Vec<String>,
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResults {
    pub pipeline: String,
    pub file: String,
    pub store: String,
    pub seed: u64,
    pub overrides: Vec<String>,
    /// The pipeline after variants and overrides (what ran).
    pub resolved: Value,
    pub run: Option<RunInfo>,
    pub evaluations: Vec<Evaluation>,
    pub curves: Vec<Curve>,
    /// Curves recorded within the stages outside loops, per step.
    pub step_curves: Vec<StepCurve>,
    /// Metrics of instances outside loops (the warm start's gate, …): (instance, metric, value).
    pub metrics: Vec<(String, String, f64)>,
    pub costs: Vec<StageCost>,
    /// Instances not in the store for the file as given, with why.
    pub missing: Vec<(String, String)>,
}

impl RunResults {
    /// The results of the pipeline as given (`run == None`: found by fingerprint, whichever run
    /// produced them), or of a past run by id (`latest`: the last one started).
    pub async fn load(c: &Compiled, store: &Store, run: Option<&str>) -> anyhow::Result<Self> {
        let (named, mut missing, record) = match run {
            Some(id) => {
                // Checked first: a run id is one name, never a path out of `runs/`.
                let checked = rao_pipeline::run_record::read(store, &c.name, id).await?;
                let record: Value = checked
                    .map(|r| serde_json::to_value(r).expect("a run record serialises"))
                    .with_context(|| format!("no run `{id}` of `{}` in {}: run the pipeline first", c.name, store.url()))?;
                let (named, missing) = instances_of_record(&record);
                (named, missing, Some(record))
            }
            None => {
                let rows = rao_pipeline::plan::rows(c, store).await?;
                let fingerprints: BTreeMap<String, String> =
                    rows.iter().filter_map(|r| Some((r.instance.clone(), r.fingerprint.clone()?))).collect();
                let mut named = Vec::new();
                let mut missing = Vec::new();
                for r in rows {
                    match (&r.state, &r.fingerprint) {
                        (State::Done, Some(fp)) => named.push((r.instance, r.stage, r.kind, fp.clone())),
                        (state, _) => {
                            let why = if r.reasons.is_empty() { format!("{state:?}").to_lowercase() } else { r.reasons.join("; ") };
                            missing.push((r.instance, why));
                        }
                    }
                }
                // The run that produced the evaluations; a pipeline without any: its results.
                let mut wanted: BTreeSet<String> = named.iter().filter(|n| n.2 == EVALUATE).map(|n| n.3.clone()).collect();
                if wanted.is_empty() {
                    wanted = named.iter().map(|n| n.3.clone()).collect();
                }
                let record = producing_run(store, &c.name, &wanted, &fingerprints).await?;
                (named, missing, record)
            }
        };
        let mut instances = Vec::new();
        for (name, stage, kind, fp) in named {
            match manifest::read(store, &fp).await?.done() {
                Some(manifest) => instances.push(Instance { name, stage, kind, manifest }),
                // A past run's results that `rao gc` (or a person) removed since.
                None => missing.push((name, "removed since".into())),
            }
        }
        let mut evaluations = Vec::new();
        // A loop body's evaluations (`every: N`) are learning curves, not results of the run.
        for i in instances.iter().filter(|i| i.kind == EVALUATE && i.iteration().is_none()) {
            evaluations.push(load_evaluation(store, i).await?);
        }
        // A past run's own settings; else the file's as given, which the results were found by
        // (redacted as a record is), whichever run produced them.
        let past = record.as_ref().filter(|_| run.is_some());
        let resolved = match past {
            Some(r) => r["resolved"].clone(),
            None => serde_json::to_value(c.resolved.for_record())?,
        };
        // A past run's file as it ran: another file may share the pipeline's name (and so its
        // runs), or this one may have moved since.
        let file = past.and_then(|r| r["file"].as_str()).map_or_else(|| c.file.display().to_string(), str::to_string);
        Ok(RunResults {
            pipeline: c.name.clone(),
            file,
            store: store.url().to_string(),
            seed: resolved["seed"].as_u64().unwrap_or(0),
            overrides: past
                .and_then(|r| serde_json::from_value(r["overrides"].clone()).ok())
                .unwrap_or_else(|| rao_plan::secrets::redact_overrides(&c.overrides)),
            run: record.as_ref().map(run_info),
            resolved,
            evaluations,
            curves: curves(&instances),
            step_curves: instances
                .iter()
                .filter(|i| i.iteration().is_none())
                .flat_map(|i| {
                    i.manifest.curves.iter().map(|(metric, points)| StepCurve {
                        instance: i.name.clone(),
                        metric: metric.clone(),
                        points: points.clone(),
                        time: i.manifest.finished_at,
                    })
                })
                .collect(),
            metrics: instances
                .iter()
                .filter(|i| i.iteration().is_none())
                .flat_map(|i| i.manifest.metrics.iter().map(move |(m, v)| (i.name.clone(), m.clone(), *v)))
                .collect(),
            costs: costs(&instances),
            missing,
        })
    }
}

/// The evaluations of the pipeline as given (instance, rows; one per iteration of an evaluation in
/// a loop), and the evaluate instances that are not in the store — without reading trees or any
/// other instance (what `compare` needs).
pub async fn evaluations(c: &Compiled, store: &Store) -> anyhow::Result<(Vec<(EvalPoint, Vec<EvalRow>)>, Vec<EvalPoint>)> {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for r in rao_pipeline::plan::rows(c, store).await?.into_iter().filter(|r| r.kind == EVALUATE) {
        let rows = match (&r.state, &r.fingerprint) {
            (State::Done, Some(fp)) => match manifest::read(store, fp).await?.done() {
                Some(m) => store.get_json::<Vec<EvalRow>>(&format!("{}/summary.json", m.output_prefix("report"))).await?,
                None => None,
            },
            _ => None,
        };
        let point = EvalPoint { stage: r.stage, iteration: r.iteration };
        match rows {
            Some(rows) => found.push((point, rows)),
            None => missing.push(point),
        }
    }
    Ok((found, missing))
}

/// One metric of one stage as its manifests record it: a stage run once has a value (`None`: not
/// in the store), one inside a loop a value per iteration (an iteration not in the store is absent).
#[derive(Debug, Clone, PartialEq)]
pub enum StageMetric {
    Once(Option<f64>),
    Curve(Vec<(u32, f64)>),
}

/// The metrics `names` asks for (`rollout.root_success`: a stage — for a loop stage its instance
/// name without the iteration — and a metric its manifests record), in the order asked. A stage
/// the pipeline does not have, or a metric none of its finished instances records, is an error
/// naming what there is.
pub async fn stage_metrics(c: &Compiled, store: &Store, names: &[String]) -> anyhow::Result<Vec<(String, StageMetric)>> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let rows = rao_pipeline::plan::rows(c, store).await?;
    let mut out = Vec::new();
    for name in names {
        let Some((stage, metric)) = name.rsplit_once('.') else {
            anyhow::bail!("--training {name}: give a stage and one of its metrics, e.g. `rollout.root_success` or `warmstart.steps`");
        };
        let of_stage: Vec<_> = rows.iter().filter(|r| series_of(&r.instance) == stage).collect();
        if of_stage.is_empty() {
            let mut known: Vec<String> = rows.iter().map(|r| series_of(&r.instance)).collect();
            known.sort_unstable();
            known.dedup();
            anyhow::bail!("--training {name}: {} has no stage `{stage}`; its stages: {}", c.file.display(), known.join(", "));
        }
        let (mut points, mut recorded) = (Vec::new(), BTreeSet::new());
        for r in &of_stage {
            let (State::Done, Some(fp)) = (&r.state, &r.fingerprint) else { continue };
            let Some(m) = manifest::read(store, fp).await?.done() else { continue };
            recorded.extend(m.metrics.keys().cloned());
            if let Some(v) = m.metrics.get(metric) {
                points.push((r.iteration, *v));
            }
        }
        if points.is_empty() && !recorded.is_empty() {
            let known: Vec<String> = recorded.into_iter().collect();
            anyhow::bail!("--training {name}: `{stage}` records no metric `{metric}`; it records {}", known.join(", "));
        }
        let value = match of_stage.iter().any(|r| r.iteration.is_some()) {
            true => {
                let mut curve: Vec<(u32, f64)> = points.into_iter().filter_map(|(k, v)| Some((k?, v))).collect();
                curve.sort_by_key(|(k, _)| *k);
                StageMetric::Curve(curve)
            }
            false => StageMetric::Once(points.first().map(|(_, v)| *v)),
        };
        out.push((name.clone(), value));
    }
    Ok(out)
}

type Named = (String, String, String, String);

fn instances_of_record(record: &Value) -> (Vec<Named>, Vec<(String, String)>) {
    let mut named = Vec::new();
    let mut missing = Vec::new();
    for inst in record["instances"].as_array().into_iter().flatten() {
        let s = |k: &str| inst[k].as_str().unwrap_or("").to_string();
        match (s("status").as_str(), inst["fingerprint"].as_str()) {
            ("done" | "cached", Some(fp)) => named.push((s("name"), s("stage"), s("kind"), fp.to_string())),
            (status, _) => {
                missing.push((s("name"), format!("{status}{}", inst["reason"].as_str().map(|r| format!(": {r}")).unwrap_or_default())))
            }
        }
    }
    (named, missing)
}

fn run_info(r: &Value) -> RunInfo {
    let s = |k: &str| r[k].as_str().unwrap_or("").to_string();
    RunInfo {
        run_id: s("run_id"),
        status: s("status"),
        started_at: r["started_at"].as_f64().unwrap_or(0.0),
        finished_at: r["finished_at"].as_f64(),
        code_version: s("code_version"),
        executor: s("executor"),
    }
}

/// The newest run of the pipeline as given (`fingerprints`, by instance) that computed (else:
/// used) one of these results (its evaluations; a pipeline without any, all its results). A run whose instances had other fingerprints ran other
/// settings, though it may share an evaluation that does not depend on what changed (an
/// expert's), or be another file's with the same pipeline name.
async fn producing_run(
    store: &Store,
    pipeline: &str,
    results: &BTreeSet<String>,
    fingerprints: &BTreeMap<String, String>,
) -> anyhow::Result<Option<Value>> {
    if results.is_empty() {
        return Ok(None);
    }
    let mut best: Option<(bool, f64, Value)> = None;
    for (key, _) in store.list(&format!("runs/{pipeline}/")).await? {
        if key.ends_with("/latest.json") {
            continue;
        }
        let Some(r) = store.get_json::<Value>(&key).await? else { continue };
        let instances = r["instances"].as_array().map(Vec::as_slice).unwrap_or_default();
        let same_settings = instances.iter().all(|i| {
            let theirs = i["fingerprint"].as_str();
            i["name"].as_str().and_then(|n| fingerprints.get(n)).is_none_or(|ours| theirs.is_none_or(|t| t == ours))
        });
        if !same_settings {
            continue;
        }
        let mut computed = false;
        let mut used = false;
        for i in instances {
            if i["fingerprint"].as_str().is_some_and(|fp| results.contains(fp)) {
                used |= matches!(i["status"].as_str(), Some("done" | "cached"));
                computed |= i["status"] == "done";
            }
        }
        let rank = (computed, r["started_at"].as_f64().unwrap_or(0.0));
        if used && best.as_ref().is_none_or(|(c, t, _)| rank > (*c, *t)) {
            best = Some((rank.0, rank.1, r));
        }
    }
    Ok(best.map(|(_, _, r)| r))
}

async fn load_evaluation(store: &Store, i: &Instance) -> anyhow::Result<Evaluation> {
    let prefix = i.manifest.output_prefix("report");
    let rows: Vec<EvalRow> = store.get_json(&format!("{prefix}/summary.json")).await?.unwrap_or_default();
    let mut depths: BTreeMap<Mode, BTreeMap<i32, usize>> = BTreeMap::new();
    if let Some(bytes) = store.get_opt(&format!("{prefix}/trees.parquet")).await? {
        let nodes = rao_core::parquet_io::nodes_from_parquet(bytes)?;
        let mut deepest: BTreeMap<TreeKey, i32> = BTreeMap::new();
        for n in &nodes {
            let d = deepest.entry(n.tree_key()).or_insert(0);
            *d = (*d).max(n.depth);
        }
        for (tree, d) in deepest {
            *depths.entry(tree.mode).or_default().entry(d).or_default() += 1;
        }
    }
    Ok(Evaluation {
        instance: i.name.clone(),
        fingerprint: i.manifest.fingerprint.clone(),
        finished_at: i.manifest.finished_at,
        rows,
        depths,
    })
}

fn curves(instances: &[Instance]) -> Vec<Curve> {
    let mut by: BTreeMap<(String, String), Vec<Point>> = BTreeMap::new();
    let mut order: Vec<(String, String)> = Vec::new();
    for i in instances {
        let Some(k) = i.iteration() else { continue };
        for (metric, v) in &i.manifest.metrics {
            let key = (i.series(), metric.clone());
            if !by.contains_key(&key) {
                order.push(key.clone());
            }
            by.entry(key).or_default().push(Point { iteration: k, value: *v, time: i.manifest.finished_at });
        }
    }
    order
        .into_iter()
        .map(|key| {
            let mut points = by.remove(&key).unwrap_or_default();
            points.sort_by_key(|p| p.iteration);
            Curve { series: key.0, metric: key.1, points }
        })
        .collect()
}

fn costs(instances: &[Instance]) -> Vec<StageCost> {
    let mut out: Vec<StageCost> = Vec::new();
    for i in instances {
        let secs = (i.manifest.finished_at - i.manifest.started_at).max(0.0);
        let bytes: u64 = i.manifest.outputs.values().flatten().map(|f| f.size).sum();
        let c = match out.iter().position(|c| c.stage == i.stage) {
            Some(c) => &mut out[c],
            None => {
                let (stage, kind) = (i.stage.clone(), i.kind.clone());
                out.push(StageCost { stage, kind, instances: 0, seconds: 0.0, outputs: Vec::new(), bytes: 0 });
                out.last_mut().expect("just pushed")
            }
        };
        c.instances += 1;
        c.seconds += secs;
        c.bytes += bytes;
        for name in i.manifest.outputs.keys() {
            if !c.outputs.contains(name) {
                c.outputs.push(name.clone());
            }
        }
    }
    out
}

/// A pipeline as dotted paths to its leaves: `stages.train.stages.rollout.params.mode`; the
/// values of credential-looking keys (`api_token`, …) read `<redacted>`.
pub fn flatten(v: &Value) -> Vec<(String, Value)> {
    fn go(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, x) in m {
                    go(&if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") }, x, out);
                }
            }
            _ => {
                let key = prefix.rsplit('.').next().unwrap_or(prefix);
                let shown = if rao_plan::secrets::looks_secret(key) { Value::String("<redacted>".into()) } else { v.clone() };
                out.push((prefix.to_string(), shown));
            }
        }
    }
    let mut out = Vec::new();
    go("", v, &mut out);
    out
}
