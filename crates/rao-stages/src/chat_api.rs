//! One client for OpenAI-compatible chat-completions endpoints (vLLM, SGLang, llama.cpp server,
//! ollama, hosted APIs), shared by the LLM judge and the `openai` policy: timeouts, retries with
//! backoff on 5xx/429/network errors, a concurrency limit, and a cache of answers keyed by the
//! hash of the whole request. The API key is read from the environment variable the pipeline
//! names and never written anywhere.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatEndpoint {
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
    /// Ask for the log-prob of each generated token (`policy: openai` records them; the judge
    /// does not ask). Set `false` for a server that refuses the field.
    #[serde(default = "default_logprobs")]
    pub logprobs: bool,
    /// Answer cache directory (relative to the pipeline file).
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
fn default_logprobs() -> bool {
    true
}
fn default_cache() -> String {
    ".rao/chat-cache".into()
}

/// Most of an error answer's body that is read: enough for any server's message.
const MAX_ERROR_BODY: usize = 16 * 1024;

/// `: MESSAGE` from an error answer's body — `error.message`, `message` or `detail` of a JSON
/// body (OpenAI, vLLM, SGLang, FastAPI), else its text — cut to 500 characters, control
/// characters escaped; empty when the body says nothing.
pub(crate) async fn server_says(mut resp: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        match resp.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk[..chunk.len().min(MAX_ERROR_BODY - body.len())]),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&body);
    let message = match serde_json::from_str::<Value>(&text) {
        Ok(v) => [&v["error"]["message"], &v["message"], &v["detail"], &v["error"]]
            .into_iter()
            .find_map(|m| m.as_str().map(str::to_string).or_else(|| (!m.is_null()).then(|| m.to_string())))
            .unwrap_or_else(|| text.to_string()),
        Err(_) => text.to_string(),
    };
    let message: String = message
        .trim()
        .chars()
        .take(500)
        .flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] })
        .collect();
    if message.is_empty() { String::new() } else { format!(": the server says {message}") }
}

/// An endpoint's answer: the first choice's content and, when the server returned them, the
/// log-prob of each token it generated (`choices[0].logprobs.content`, in its own tokens).
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, Deserialize)]
pub struct Answer {
    /// (`answer`: how caches before log-probs wrote it.)
    #[serde(alias = "answer")]
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_logprobs: Option<Vec<TokenLogprob>>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
}

impl Answer {
    /// The answer of a parsed reply body, or what is missing from it. Log-probs that are absent,
    /// null or malformed are left out (a server need not return them); a non-finite or positive
    /// one makes the whole list unusable.
    fn of_reply(v: &Value) -> Option<Answer> {
        let choice = &v["choices"][0];
        let text = choice["message"]["content"].as_str()?.to_string();
        let token_logprobs = choice["logprobs"]["content"].as_array().and_then(|tokens| {
            tokens
                .iter()
                .map(|t| {
                    let logprob = t["logprob"].as_f64().filter(|l| l.is_finite() && *l <= 0.0)? as f32;
                    Some(TokenLogprob { token: t["token"].as_str()?.to_string(), logprob })
                })
                .collect::<Option<Vec<_>>>()
        });
        Some(Answer { text, token_logprobs })
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct ApiStats {
    /// HTTP requests sent (retries included).
    pub calls: usize,
    pub cache_hits: usize,
}

pub struct ChatApi {
    pub endpoint: ChatEndpoint,
    client: reqwest::Client,
    key: Option<String>,
    cache: PathBuf,
    permits: tokio::sync::Semaphore,
    stats: Mutex<ApiStats>,
}

impl ChatApi {
    /// `base_dir`: where a relative `cache_dir` lives (the pipeline file's directory).
    pub fn new(endpoint: ChatEndpoint, base_dir: &Path) -> anyhow::Result<Self> {
        anyhow::ensure!(
            endpoint.timeout_s.is_finite() && endpoint.timeout_s > 0.0 && endpoint.timeout_s <= 86_400.0,
            "timeout_s must be a positive number of seconds, at most a day (got {})",
            endpoint.timeout_s
        );
        let client = reqwest::Client::builder().timeout(Duration::from_secs_f64(endpoint.timeout_s)).build()?;
        let key = std::env::var(&endpoint.api_key_env).ok();
        let cache = base_dir.join(&endpoint.cache_dir);
        std::fs::create_dir_all(&cache)?;
        let permits = tokio::sync::Semaphore::new(endpoint.concurrency.max(1));
        Ok(ChatApi { endpoint, client, key, cache, permits, stats: Mutex::new(ApiStats::default()) })
    }

    pub fn stats(&self) -> ApiStats {
        *self.stats.lock()
    }

    /// The first choice's message content for `body` (`model` is filled in). `accept` says
    /// whether an answer is usable: an unusable one is an error and is not cached.
    pub async fn complete(&self, body: Value, accept: impl Fn(&str) -> bool) -> anyhow::Result<String> {
        Ok(self.answer(body, accept).await?.text)
    }

    /// As `complete`, with the token log-probs when the server returned them (ask for them with
    /// `"logprobs": true` in `body`).
    pub async fn answer(&self, mut body: Value, accept: impl Fn(&str) -> bool) -> anyhow::Result<Answer> {
        body["model"] = Value::String(self.endpoint.model.clone());
        let hash = blake3::hash(body.to_string().as_bytes()).to_hex().to_string();
        let cached = self.cache.join(format!("{hash}.json"));
        if let Ok(text) = std::fs::read_to_string(&cached)
            && let Ok(answer) = serde_json::from_str::<Answer>(&text)
            && accept(&answer.text)
        {
            self.stats.lock().cache_hits += 1;
            return Ok(answer);
        }
        let _permit = self.permits.acquire().await.expect("the semaphore is never closed");
        let url = format!("{}/chat/completions", self.endpoint.base_url.trim_end_matches('/'));
        let mut last_err = String::new();
        for attempt in 0..=self.endpoint.retries {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 * (1 << (attempt - 1).min(5)))).await;
            }
            let mut req = self.client.post(&url).json(&body);
            if let Some(k) = &self.key {
                req = req.bearer_auth(k);
            }
            self.stats.lock().calls += 1;
            match req.send().await {
                Ok(resp) if resp.status().is_success() => {
                    let v: Value = match resp.json().await {
                        Ok(v) => v,
                        Err(e) => {
                            last_err = format!("the answer is not JSON: {e}");
                            continue;
                        }
                    };
                    let Some(answer) = Answer::of_reply(&v) else {
                        last_err = "the answer has no choices[0].message.content".into();
                        continue;
                    };
                    anyhow::ensure!(accept(&answer.text), "{url} answered something unusable: {:.200}", answer.text);
                    let tmp = cached.with_extension("tmp");
                    std::fs::write(&tmp, serde_json::to_string(&answer)?)?;
                    std::fs::rename(&tmp, &cached)?;
                    return Ok(answer);
                }
                Ok(resp) if resp.status().is_server_error() || resp.status().as_u16() == 429 => {
                    let status = resp.status();
                    last_err = format!("HTTP {status}{}", server_says(resp).await)
                }
                Ok(resp) => {
                    let status = resp.status();
                    anyhow::bail!("{url} answered HTTP {status} (not retried){}", server_says(resp).await)
                }
                // reqwest's errors name the URL, never the headers: the key stays out of logs.
                Err(e) => last_err = e.to_string(),
            }
        }
        anyhow::bail!("{url} failed after {} attempts: {last_err}", self.endpoint.retries + 1)
    }
}
