//! MLflow over its REST API: one MLflow run per rao run (found again by the `rao.run_id` tag, so
//! exporting twice does not duplicate it), parameters, every scalar with its step, tags saying
//! what ran, and the HTML report as an artifact (through the server's artifact proxy).

use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::results::{RunInfo, RunResults};
use crate::tracking::{Scalar, params, scalars};

/// MLflow's limits per `log-batch` request and per parameter value.
const PARAMS_PER_BATCH: usize = 100;
const METRICS_PER_BATCH: usize = 1000;
const MAX_PARAM_VALUE: usize = 6000;

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        let url = format!("{}/api/2.0/mlflow/{path}", self.base);
        let mut req = self.http.request(method, &url);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.with_context(|| format!("MLflow at {} did not answer", self.base))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            bail!("MLflow {path}: HTTP {status}: {}", text.chars().take(300).collect::<String>());
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn experiment_id(&self, name: &str) -> anyhow::Result<String> {
        let url = format!("experiments/get-by-name?experiment_name={}", urlencode(name));
        match self.call(reqwest::Method::GET, &url, None).await {
            Ok(v) => v["experiment"]["experiment_id"].as_str().map(str::to_string).context("no experiment id in MLflow's answer"),
            Err(e) if e.to_string().contains("RESOURCE_DOES_NOT_EXIST") => {
                let v = self.call(reqwest::Method::POST, "experiments/create", Some(&json!({"name": name}))).await?;
                v["experiment_id"].as_str().map(str::to_string).context("no experiment id in MLflow's answer")
            }
            Err(e) => Err(e),
        }
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

fn millis(secs: f64) -> i64 {
    (secs * 1000.0) as i64
}

fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).timeout(Duration::from_secs(60)).build()?)
}

/// The MLflow run of a rao run, if one was made (by a live export or an earlier one): its id
/// and status.
async fn find(api: &Api, exp: &str, rao_run: &str) -> anyhow::Result<Option<(String, String)>> {
    let filter = format!("tags.`rao.run_id` = '{}'", rao_run.replace('\'', ""));
    let found =
        api.call(reqwest::Method::POST, "runs/search", Some(&json!({"experiment_ids": [exp], "filter": filter, "max_results": 1}))).await?;
    let info = &found["runs"][0]["info"];
    Ok(info["run_id"].as_str().map(|id| (id.to_string(), info["status"].as_str().unwrap_or("").to_string())))
}

async fn log_metrics(api: &Api, id: &str, scalars: &[Scalar]) -> anyhow::Result<()> {
    let metrics: Vec<Value> =
        scalars.iter().map(|s| json!({"key": s.key, "value": s.value, "timestamp": millis(s.time), "step": s.step})).collect();
    for chunk in metrics.chunks(METRICS_PER_BATCH) {
        api.call(reqwest::Method::POST, "runs/log-batch", Some(&json!({"run_id": id, "metrics": chunk}))).await?;
    }
    Ok(())
}

/// A run logged to while it goes: made when the rao run starts (status RUNNING), given each
/// point as it comes; [`export`] completes and closes it at the end.
pub struct LiveRun {
    api: Api,
    id: String,
}

impl LiveRun {
    pub async fn start(url: &str, experiment: &str, pipeline: &str, rao_run: &str, started_at: f64) -> anyhow::Result<Self> {
        let api = Api { http: client()?, base: url.to_string() };
        let exp = api.experiment_id(experiment).await?;
        let tags = json!([{"key": "rao.run_id", "value": rao_run}, {"key": "rao.pipeline", "value": pipeline}]);
        let created = api
            .call(
                reqwest::Method::POST,
                "runs/create",
                Some(&json!({"experiment_id": exp, "run_name": rao_run, "start_time": millis(started_at), "tags": tags})),
            )
            .await?;
        let id = created["run"]["info"]["run_id"].as_str().context("no run id in MLflow's answer")?.to_string();
        Ok(LiveRun { api, id })
    }

    pub async fn log(&self, scalars: &[Scalar]) -> anyhow::Result<()> {
        log_metrics(&self.api, &self.id, scalars).await
    }
}

pub async fn export(url: &str, experiment: &str, res: &RunResults, run: &RunInfo, page: &str) -> anyhow::Result<String> {
    let api = Api { http: client()?, base: url.to_string() };
    let exp = api.experiment_id(experiment).await?;
    let mut scalars = scalars(res);
    let id = match find(&api, &exp, &run.run_id).await? {
        // Made while the run went: the points it has already are not logged again.
        Some((id, status)) if status == "RUNNING" => {
            let got = api.call(reqwest::Method::GET, &format!("runs/get?run_id={}", urlencode(&id)), None).await?;
            let latest: std::collections::HashMap<String, i64> = got["run"]["data"]["metrics"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .filter_map(|m| Some((m["key"].as_str()?.to_string(), m["step"].as_i64().unwrap_or(0))))
                .collect();
            scalars.retain(|s| latest.get(&s.key).is_none_or(|&step| s.step > step));
            id
        }
        Some((id, _)) => return Ok(format!("{url}/#/experiments/{exp}/runs/{id} (exported before)")),
        None => {
            let created = api
                .call(
                    reqwest::Method::POST,
                    "runs/create",
                    Some(&json!({"experiment_id": exp, "run_name": run.run_id, "start_time": millis(run.started_at), "tags": [{"key": "rao.run_id", "value": run.run_id}]})),
                )
                .await?;
            created["run"]["info"]["run_id"].as_str().context("no run id in MLflow's answer")?.to_string()
        }
    };
    let tags = json!([
        {"key": "rao.pipeline", "value": res.pipeline},
        {"key": "rao.status", "value": run.status},
        {"key": "rao.code_version", "value": run.code_version},
        {"key": "rao.overrides", "value": res.overrides.join(" ")},
        {"key": "mlflow.source.name", "value": res.file},
    ]);
    api.call(reqwest::Method::POST, "runs/log-batch", Some(&json!({"run_id": id, "tags": tags}))).await?;
    let params: Vec<Value> =
        params(res).into_iter().map(|(k, v)| json!({"key": k, "value": v.chars().take(MAX_PARAM_VALUE).collect::<String>()})).collect();
    for chunk in params.chunks(PARAMS_PER_BATCH) {
        api.call(reqwest::Method::POST, "runs/log-batch", Some(&json!({"run_id": id, "params": chunk}))).await?;
    }
    log_metrics(&api, &id, &scalars).await?;
    let got = api.call(reqwest::Method::GET, &format!("runs/get?run_id={}", urlencode(&id)), None).await?;
    upload_report(&api, got["run"]["info"]["artifact_uri"].as_str().unwrap_or(""), page).await?;
    let status = match run.status.as_str() {
        "succeeded" => "FINISHED",
        "cancelled" => "KILLED",
        _ => "FAILED",
    };
    let end = run.finished_at.unwrap_or(run.started_at);
    api.call(reqwest::Method::POST, "runs/update", Some(&json!({"run_id": id, "status": status, "end_time": millis(end)}))).await?;
    Ok(format!("{url}/#/experiments/{exp}/runs/{id}"))
}

/// `report.html` through the server's artifact proxy (`mlflow server` serves artifacts by default).
async fn upload_report(api: &Api, artifact_uri: &str, page: &str) -> anyhow::Result<()> {
    let Some(path) = artifact_uri.strip_prefix("mlflow-artifacts:/") else {
        bail!(
            "the run's artifacts go to `{artifact_uri}`, which this server does not proxy; start it with artifact serving (the default) to get report.html"
        );
    };
    let url = format!("{}/api/2.0/mlflow-artifacts/artifacts/{}/report.html", api.base, path.trim_start_matches('/'));
    let resp = api.http.put(&url).header("Content-Type", "text/html").body(page.to_string()).send().await?;
    if !resp.status().is_success() {
        bail!("uploading report.html: HTTP {}", resp.status());
    }
    Ok(())
}
