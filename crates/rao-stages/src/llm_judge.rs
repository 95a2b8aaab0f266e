//! An LLM judge over an OpenAI-compatible chat-completions endpoint: a rubric prompt with the
//! node's goal, actions and result; a JSON verdict back. Timeouts, retries with backoff, a
//! concurrency limit, and a cache keyed by the hash of the judged content. The API key is read
//! from the environment variable the pipeline names and never written anywhere.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rao_core::NodeRecord;
use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LlmJudgeParams {
    /// Base URL of the API, e.g. `http://127.0.0.1:8000/v1` (`/chat/completions` is appended).
    pub base_url: String,
    pub model: String,
    /// Name of the environment variable holding the API key (the key itself never appears in files).
    #[serde(default = "default_key_env")]
    pub api_key_env: String,
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Requests in flight at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Verdict cache directory (relative to the pipeline file).
    #[serde(default = "default_cache")]
    pub cache_dir: String,
}

fn default_key_env() -> String {
    "OPENAI_API_KEY".into()
}
fn default_timeout() -> f64 {
    30.0
}
fn default_retries() -> u32 {
    3
}
fn default_concurrency() -> usize {
    4
}
fn default_cache() -> String {
    ".rao/judge-cache".into()
}

#[derive(Debug, Default, Clone, Copy)]
pub struct JudgeStats {
    pub calls: usize,
    pub cache_hits: usize,
}

pub struct LlmJudge {
    cfg: LlmJudgeParams,
    client: reqwest::Client,
    key: Option<String>,
    cache: PathBuf,
}

const RUBRIC: &str = "You grade one step of an agent's work. Given its goal, its actions with the environment's \
observations, and how it ended, decide whether the agent achieved its goal. Answer with JSON only: \
{\"score\": <number between 0 and 1>, \"reason\": \"<one sentence>\"}.";

impl LlmJudge {
    /// `cache` is used when the params' cache_dir is relative and no base dir is known.
    pub fn new(cfg: LlmJudgeParams, cache: PathBuf) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder().timeout(Duration::from_secs_f64(cfg.timeout_s)).build()?;
        let key = std::env::var(&cfg.api_key_env).ok();
        let cache = if PathBuf::from(&cfg.cache_dir).is_absolute() { PathBuf::from(&cfg.cache_dir) } else { cache };
        std::fs::create_dir_all(&cache)?;
        Ok(LlmJudge { cfg, client, key, cache })
    }

    pub fn with_cache_dir(mut self, dir: PathBuf) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        self.cache = dir;
        Ok(self)
    }

    /// What the judge sees of a node.
    pub fn render(n: &NodeRecord) -> String {
        let mut s = format!("Goal: {}\nActions:\n", n.goal);
        for t in &n.turns {
            s.push_str(&format!("- {} -> {}\n", t.action.trim_end_matches(" <eos>"), t.observation.trim_start_matches("<obs>").trim()));
        }
        s.push_str(&format!("Ended: {}\n", n.status));
        if let Some(r) = &n.result {
            s.push_str(&format!("Result: {r}\n"));
        }
        s
    }

    /// Score every node (replacing `score`, setting `judge`), `concurrency` requests at a time.
    pub async fn score_nodes(self: &Arc<Self>, nodes: &mut [NodeRecord]) -> anyhow::Result<JudgeStats> {
        let stats = Arc::new(std::sync::Mutex::new(JudgeStats::default()));
        let permits = Arc::new(tokio::sync::Semaphore::new(self.cfg.concurrency.max(1)));
        let handles: Vec<_> = nodes
            .iter()
            .map(|n| {
                let (me, stats, permits, content) = (self.clone(), stats.clone(), permits.clone(), Self::render(n));
                tokio::spawn(async move {
                    let _permit = permits.acquire_owned().await.expect("semaphore open");
                    me.judge(&content, &stats).await
                })
            })
            .collect();
        for (n, h) in nodes.iter_mut().zip(handles) {
            n.score = h.await??;
            n.judge = Some(format!("llm:{}", self.cfg.model));
        }
        let s = *stats.lock().unwrap();
        Ok(s)
    }

    async fn judge(&self, content: &str, stats: &std::sync::Mutex<JudgeStats>) -> anyhow::Result<f64> {
        let hash = blake3::hash(format!("{}\n{}\n{}", self.cfg.model, RUBRIC, content).as_bytes()).to_hex().to_string();
        let cached = self.cache.join(format!("{hash}.json"));
        if let Ok(text) = std::fs::read_to_string(&cached)
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
            && let Some(s) = v["score"].as_f64()
        {
            stats.lock().unwrap().cache_hits += 1;
            return Ok(s);
        }
        let body = serde_json::json!({
            "model": self.cfg.model,
            "temperature": 0,
            "messages": [{"role": "system", "content": RUBRIC}, {"role": "user", "content": content}],
        });
        let url = format!("{}/chat/completions", self.cfg.base_url.trim_end_matches('/'));
        let mut last_err = String::new();
        for attempt in 0..=self.cfg.retries {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 * (1 << (attempt - 1).min(5)))).await;
            }
            let mut req = self.client.post(&url).json(&body);
            if let Some(k) = &self.key {
                req = req.bearer_auth(k);
            }
            stats.lock().unwrap().calls += 1;
            match req.send().await {
                Ok(resp) if resp.status().is_success() => {
                    let v: serde_json::Value = resp.json().await?;
                    let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
                    let score =
                        parse_verdict(text).ok_or_else(|| anyhow::anyhow!("the judge's answer is not a JSON verdict: {text:.200}"))?;
                    let tmp = cached.with_extension("tmp");
                    std::fs::write(&tmp, serde_json::json!({"score": score, "answer": text}).to_string())?;
                    std::fs::rename(&tmp, &cached)?;
                    return Ok(score);
                }
                Ok(resp) if resp.status().is_server_error() || resp.status().as_u16() == 429 => {
                    last_err = format!("HTTP {}", resp.status())
                }
                Ok(resp) => anyhow::bail!("judge endpoint {url} answered HTTP {} (not retried)", resp.status()),
                // reqwest's errors name the URL, never the headers: the key stays out of logs.
                Err(e) => last_err = e.to_string(),
            }
        }
        anyhow::bail!("judge endpoint {url} failed after {} attempts: {last_err}", self.cfg.retries + 1)
    }
}

/// `{"score": x, ...}` anywhere in the answer; clamped to [0, 1].
pub fn parse_verdict(text: &str) -> Option<f64> {
    let start = text.find('{')?;
    let end = text.rfind('}')?;
    let v: serde_json::Value = serde_json::from_str(text.get(start..=end)?).ok()?;
    v["score"].as_f64().map(|s| s.clamp(0.0, 1.0))
}
