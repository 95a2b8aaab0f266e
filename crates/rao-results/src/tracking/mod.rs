//! Export a run to the trackers teams already run: TensorBoard event files and an MLflow server.
//! Both get the same scalars (every loop metric per iteration, every evaluation number), the
//! pipeline's parameters and the run's HTML page. A failed export is the caller's warning,
//! never a failed run.

pub mod live;
pub mod mlflow;
pub mod tensorboard;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::compare::Metric;
use crate::results::RunResults;

/// Where a run is exported.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// A log directory: each run writes `DIR/PIPELINE/RUN_ID/events.out.tfevents.*`.
    TensorBoard(PathBuf),
    /// A tracking server; runs go to the experiment of that name.
    MlFlow { url: String, experiment: Option<String> },
}

impl Target {
    /// `http(s)://HOST:PORT` (MLflow) or `tensorboard:DIR` (relative to `base`).
    pub fn parse(s: &str, base: &Path) -> Result<Target, String> {
        if s.starts_with("http://") || s.starts_with("https://") {
            return Ok(Target::MlFlow { url: s.trim_end_matches('/').to_string(), experiment: None });
        }
        match s.split_once(':') {
            Some(("tensorboard" | "tb", dir)) if !dir.is_empty() => Ok(Target::TensorBoard(base.join(dir))),
            _ => Err(format!("`{s}` is not a tracker; use an MLflow server URL (`http://127.0.0.1:5000`) or `tensorboard:DIR`")),
        }
    }

    /// The `tracking:` block of a resolved pipeline (`{mlflow: URL, tensorboard: DIR, experiment: NAME}`).
    pub fn from_section(t: &Value, base: &Path) -> Vec<Target> {
        let mut out = Vec::new();
        if let Some(dir) = t["tensorboard"].as_str() {
            out.push(Target::TensorBoard(base.join(dir)));
        }
        if let Some(url) = t["mlflow"].as_str() {
            out.push(Target::MlFlow {
                url: url.trim_end_matches('/').to_string(),
                experiment: t["experiment"].as_str().map(str::to_string),
            });
        }
        out
    }

    pub fn describe(&self) -> String {
        match self {
            Target::TensorBoard(d) => format!("TensorBoard {}", d.display()),
            Target::MlFlow { url, .. } => format!("MLflow {url}"),
        }
    }
}

/// One scalar every tracker gets.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    /// `rollout/root_success`, `eval/rao/recursive/easy/success`: letters, digits and `_-. /` only.
    pub key: String,
    pub step: i64,
    pub value: f64,
    /// Seconds since the Unix epoch.
    pub time: f64,
}

/// A key trackers accept (MLflow: alphanumerics, `_ - . /` and spaces).
pub fn key(parts: &[&str]) -> String {
    parts
        .iter()
        .map(|p| p.chars().map(|c| if c.is_ascii_alphanumeric() || "_-. ".contains(c) { c } else { '_' }).collect::<String>())
        .collect::<Vec<_>>()
        .join("/")
}

/// Every loop metric at its iteration, every curve a stage recorded at its steps, and every
/// evaluation metric at the last iteration.
pub fn scalars(res: &RunResults) -> Vec<Scalar> {
    let mut out: Vec<Scalar> = Vec::new();
    for c in &res.curves {
        for p in &c.points {
            out.push(Scalar { key: key(&[&c.series, &c.metric]), step: p.iteration as i64, value: p.value, time: p.time });
        }
    }
    for c in &res.step_curves {
        for &(step, value) in &c.points {
            out.push(Scalar { key: key(&[&c.instance, &c.metric]), step: step as i64, value, time: c.time });
        }
    }
    let last = res.curves.iter().flat_map(|c| c.points.iter().map(|p| p.iteration)).max().unwrap_or(0) as i64;
    for e in &res.evaluations {
        for r in &e.rows {
            for m in Metric::ALL {
                out.push(Scalar {
                    key: key(&["eval", &r.label, r.mode.as_str(), &r.band, m.name()]),
                    step: last,
                    value: m.of(r),
                    time: e.finished_at,
                });
            }
        }
    }
    out.retain(|s| s.value.is_finite());
    out
}

/// The pipeline as it ran, flattened to `stages.rollout.params.mode = recursive`.
pub fn params(res: &RunResults) -> Vec<(String, String)> {
    crate::results::flatten(&res.resolved)
        .into_iter()
        .filter(|(k, _)| !k.starts_with("tracking") && k != "$schema")
        .map(|(k, v)| (k, if let Value::String(s) = v { s } else { v.to_string() }))
        .collect()
}

/// Export to one target; returns where the run is now (a directory or a run URL).
pub async fn export(target: &Target, res: &RunResults, page: &str) -> anyhow::Result<String> {
    let run = res.run.as_ref().ok_or_else(|| anyhow::anyhow!("no run record for these results: nothing to export"))?;
    match target {
        Target::TensorBoard(dir) => {
            let d = dir.join(&res.pipeline).join(&run.run_id);
            tensorboard::write_run(&d, res, run, page)?;
            Ok(d.display().to_string())
        }
        Target::MlFlow { url, experiment } => {
            let experiment = experiment.clone().unwrap_or_else(|| res.pipeline.clone());
            mlflow::export(url, &experiment, res, run, page).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_keys_keep_to_what_trackers_accept() {
        let base = Path::new("/p");
        assert_eq!(
            Target::parse("http://127.0.0.1:5000/", base).unwrap(),
            Target::MlFlow { url: "http://127.0.0.1:5000".into(), experiment: None }
        );
        assert_eq!(Target::parse("tensorboard:tb", base).unwrap(), Target::TensorBoard("/p/tb".into()));
        assert!(Target::parse("tb", base).unwrap_err().contains("tensorboard:DIR"));
        assert_eq!(key(&["rollout[shard=0]", "root_success"]), "rollout_shard_0_/root_success");
        assert_eq!(key(&["eval", "rao", "recursive", "160-239 lines", "success"]), "eval/rao/recursive/160-239 lines/success");
    }
}
