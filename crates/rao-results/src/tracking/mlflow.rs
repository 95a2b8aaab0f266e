//! MLflow over its REST API: one MLflow run per rao run (found again by the `rao.run_id` tag, so
//! exporting twice does not duplicate it), parameters, every scalar with its step, tags saying
//! what ran, and the HTML report as an artifact (through the server's artifact proxy).

use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::results::{RunInfo, RunResults};
use crate::tracking::{params, scalars};

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

pub async fn export(url: &str, experiment: &str, res: &RunResults, run: &RunInfo, page: &str) -> anyhow::Result<String> {
    let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).timeout(Duration::from_secs(60)).build()?;
    let api = Api { http, base: url.to_string() };
    let exp = api.experiment_id(experiment).await?;
    let filter = format!("tags.`rao.run_id` = '{}'", run.run_id.replace('\'', ""));
    let found =
        api.call(reqwest::Method::POST, "runs/search", Some(&json!({"experiment_ids": [exp], "filter": filter, "max_results": 1}))).await?;
    if let Some(id) = found["runs"][0]["info"]["run_id"].as_str() {
        return Ok(format!("{url}/#/experiments/{exp}/runs/{id} (exported before)"));
    }
    let tags = json!([
        {"key": "rao.run_id", "value": run.run_id},
        {"key": "rao.pipeline", "value": res.pipeline},
        {"key": "rao.status", "value": run.status},
        {"key": "rao.code_version", "value": run.code_version},
        {"key": "rao.overrides", "value": res.overrides.join(" ")},
        {"key": "mlflow.source.name", "value": res.file},
    ]);
    let created = api
        .call(
            reqwest::Method::POST,
            "runs/create",
            Some(&json!({"experiment_id": exp, "run_name": run.run_id, "start_time": millis(run.started_at), "tags": tags})),
        )
        .await?;
    let info = &created["run"]["info"];
    let id = info["run_id"].as_str().context("no run id in MLflow's answer")?.to_string();
    let params: Vec<Value> =
        params(res).into_iter().map(|(k, v)| json!({"key": k, "value": v.chars().take(MAX_PARAM_VALUE).collect::<String>()})).collect();
    for chunk in params.chunks(PARAMS_PER_BATCH) {
        api.call(reqwest::Method::POST, "runs/log-batch", Some(&json!({"run_id": id, "params": chunk}))).await?;
    }
    let metrics: Vec<Value> =
        scalars(res).into_iter().map(|s| json!({"key": s.key, "value": s.value, "timestamp": millis(s.time), "step": s.step})).collect();
    for chunk in metrics.chunks(METRICS_PER_BATCH) {
        api.call(reqwest::Method::POST, "runs/log-batch", Some(&json!({"run_id": id, "metrics": chunk}))).await?;
    }
    upload_report(&api, info["artifact_uri"].as_str().unwrap_or(""), page).await?;
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
