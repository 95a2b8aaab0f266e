//! `policy: engine`: a language model served by an inference engine (vLLM, or any server with
//! vLLM's token-id completions API) acts in text, token in and token out. Each node's context is
//! rendered exactly as the in-process text policy renders it (`TextForm`: the model's chat
//! template, only what is new fed after each action), sent as token ids to `/v1/completions`,
//! and the reply is constrained by the environment's action grammar through the engine's
//! structured outputs (`structured_outputs.grammar`, Lark). The sampled ids and their log-probs
//! come back as ids (`return_token_ids`) and are recorded as an in-process rollout records them,
//! in the checkpoint's token space, so `update` trains on these trees unchanged.
//!
//! Log-probs: vLLM applies the grammar's mask before computing them, in either log-prob mode;
//! `--logprobs-mode processed_logprobs` also applies the temperature, so the recorded log-probs
//! are those of the distribution sampled (what CISPO's ratio needs). At temperature 1 both modes
//! give the same numbers.
//!
//! Versions: the checkpoint's own weights are what the engine serves, or the stage fails
//! (`engine_version`): LoRA adapters are loaded into every server under a versioned name, and
//! every answer must come from that name.
//!
//! Several servers: requests are spread over them in turn; a request that finds its server
//! gone, or gets 5xx/429, goes to the next one (up to `retries` passes over all of them). A
//! request that fails anyway, or that a server refuses (4xx), fails the stage: a tree with a
//! missing turn is not a rollout of this policy.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use rao_agent::{ModelTokens, Request, Response};
use rao_envs::grammar::Grammar;
use rao_policy::Policy;
use rao_policy::hf::TextTokenizer;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::engine_launch::EngineLaunch;
use crate::engine_version::{self, ServedVersion};
use crate::openai_policy::api_seed;
use crate::text_policy::{TextForm, action_of, token_space};

/// Where the engine is and what to ask it for.
#[derive(Debug, Clone, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EngineEndpoints {
    /// Base URLs of servers someone runs, e.g. `["http://127.0.0.1:8000/v1"]` (`/completions`
    /// is appended). Or `launch`: rao starts them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
    /// Servers rao starts on a model's directory for this run, and stops when the run ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<EngineLaunch>,
    /// The name the servers serve the model under (`--served-model-name`, or an adapter's name).
    pub model: String,
    /// Seconds one request may take.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// Passes over every server a request may make before the stage fails.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Requests in flight at once, over all servers.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Where adapter versions are written for the servers to load (a folder every server can
    /// read: local engines read the default, a folder under the system's temporary directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter_dir: Option<std::path::PathBuf>,
}

fn default_timeout() -> f64 {
    120.0
}
fn default_retries() -> u32 {
    3
}
fn default_concurrency() -> usize {
    64
}

impl EngineEndpoints {
    /// What `rao validate` refuses: no server, a URL that is not http(s), a timeout that is no
    /// duration.
    /// The folder adapter versions are written to.
    pub fn adapter_root(&self) -> std::path::PathBuf {
        self.adapter_dir.clone().unwrap_or_else(|| std::env::temp_dir().join("rao-adapters"))
    }

    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        match (&self.launch, self.urls.is_empty()) {
            (None, true) => out.push(
                "no servers: give `urls` of servers someone runs (e.g. `[\"http://127.0.0.1:8000/v1\"]`), or `launch: {model: DIR}` for rao to start them".into(),
            ),
            (Some(_), false) => out.push("give `urls` or `launch`, not both".into()),
            (Some(l), true) => out.extend(l.problems()),
            (None, false) => {}
        }
        for u in &self.urls {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                out.push(format!("`{u}` is not an http:// or https:// URL"));
            }
        }
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0 && self.timeout_s <= 86_400.0) {
            out.push(format!("timeout_s must be a positive number of seconds, at most a day (got {})", self.timeout_s));
        }
        out
    }
}

pub struct EnginePolicy {
    endpoints: EngineEndpoints,
    /// The name requests ask for: the base model's, or the checkpoint's adapter version.
    served: ServedVersion,
    client: reqwest::Client,
    form: Arc<TextForm>,
    /// The action grammar in Lark, flat and recursive.
    lark: [String; 2],
    stop: u32,
    space: Arc<str>,
    temperature: f64,
    window: usize,
    version: i32,
    permits: tokio::sync::Semaphore,
    /// Requests sent (each try counts), answered, retried on another server, failed for good.
    next: AtomicUsize,
    sent: AtomicUsize,
    retried: AtomicUsize,
    reloads: AtomicUsize,
    failed: AtomicUsize,
    pub unusable: AtomicUsize,
    first_failure: std::sync::OnceLock<String>,
}

impl EnginePolicy {
    /// `policy`: the checkpoint's model as loaded in rao (its stop token, version and adapters,
    /// which every server is made to serve); `tokenizer`: its tokenizer, the same files the
    /// engine serves.
    #[allow(clippy::too_many_arguments)]
    pub async fn connect(
        endpoints: EngineEndpoints,
        policy: &Policy,
        tokenizer: Arc<TextTokenizer>,
        env_grammar: &dyn Grammar,
        text_form: Arc<dyn rao_envs::Episode>,
        temperature: f64,
        window: usize,
    ) -> anyhow::Result<Self> {
        if let Some(p) = endpoints.problems().first() {
            anyhow::bail!("engine: {p}");
        }
        let stop = *policy.stop_tokens.first().ok_or_else(|| anyhow::anyhow!("the model has no stop token"))?;
        let lark = |recursive| env_grammar.lark(recursive).ok_or_else(|| anyhow::anyhow!(rao_envs::grammar::NO_TEXT_FORM));
        let client = reqwest::Client::builder().timeout(Duration::from_secs_f64(endpoints.timeout_s)).build()?;
        let served = engine_version::serve(&client, &endpoints.urls, &endpoints.model, policy, &endpoints.adapter_root()).await?;
        Ok(EnginePolicy {
            served,
            permits: tokio::sync::Semaphore::new(endpoints.concurrency.max(1)),
            endpoints,
            client,
            space: token_space(&tokenizer).into(),
            form: Arc::new(TextForm::new(tokenizer, text_form, stop)?),
            lark: [lark(false)?, lark(true)?],
            stop,
            temperature,
            window,
            version: policy.version,
            next: AtomicUsize::new(0),
            sent: AtomicUsize::new(0),
            retried: AtomicUsize::new(0),
            reloads: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            unusable: AtomicUsize::new(0),
            first_failure: std::sync::OnceLock::new(),
        })
    }

    async fn act_one(&self, r: Request) -> Response {
        // No reply: the node overflows (as in process when its window is full).
        let no_reply = |fed| Response { tokens: vec![], logprobs: vec![], model: Some(self.tokens(fed, vec![], vec![])) };
        let fed = match self.form.to_feed(&r.context, r.model_context.is_empty()) {
            Ok(fed) => fed,
            Err(e) => {
                self.fail(format!("{e:#}"));
                return no_reply(vec![]);
            }
        };
        let used = r.model_context.len() + fed.len();
        if fed.is_empty() || used >= self.window {
            return no_reply(fed);
        }
        let prompt = [r.model_context.as_slice(), fed.as_slice()].concat();
        let body = json!({
            "model": self.served.model,
            "prompt": prompt,
            "max_tokens": self.window - used,
            "temperature": self.temperature,
            "seed": api_seed(r.seed),
            "logprobs": 0,
            "return_token_ids": true,
            "skip_special_tokens": false,
            "structured_outputs": {"grammar": self.lark[usize::from(r.mode.is_recursive())]},
        });
        match self.complete(&body).await {
            Ok((sampled, logprobs)) => {
                let tokens = action_of(&self.form, self.stop, &sampled, &self.unusable);
                Response { logprobs: vec![0.0; tokens.len()], tokens, model: Some(self.tokens(fed, sampled, logprobs)) }
            }
            Err(e) => {
                self.fail(e);
                no_reply(fed)
            }
        }
    }

    /// The model name requests ask for (the adapter version's, or the base model's).
    pub fn served_model(&self) -> &str {
        &self.served.model
    }

    fn tokens(&self, fed: Vec<u32>, sampled: Vec<u32>, logprobs: Vec<f32>) -> ModelTokens {
        ModelTokens { space: self.space.clone(), fed, sampled, logprobs }
    }

    fn fail(&self, why: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let _ = self.first_failure.set(why);
    }

    /// The sampled ids and their log-probs, from the first server that answers.
    async fn complete(&self, body: &Value) -> Result<(Vec<u32>, Vec<f32>), String> {
        let _permit = self.permits.acquire().await.expect("the semaphore is never closed");
        let servers = self.endpoints.urls.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let mut last_err = String::new();
        let mut reloaded = Vec::new();
        let mut attempt = 0;
        while attempt < servers * (self.endpoints.retries as usize + 1) {
            if attempt > 0 {
                self.retried.fetch_add(1, Ordering::Relaxed);
                if attempt % servers == 0 {
                    // Every server failed this pass: back off before the next.
                    tokio::time::sleep(Duration::from_millis(250 << (attempt / servers - 1).min(5))).await;
                }
            }
            let server = (first + attempt) % servers;
            let url = format!("{}/completions", self.endpoints.urls[server].trim_end_matches('/'));
            self.sent.fetch_add(1, Ordering::Relaxed);
            match self.client.post(&url).json(body).send().await {
                Ok(resp) if resp.status().is_success() => {
                    let v: Value = resp.json().await.map_err(|e| format!("{url}: the answer is not JSON: {e}"))?;
                    if v["model"].as_str() != Some(&self.served.model) {
                        return Err(format!("{url} answered as model {}, not the version asked for (`{}`)", v["model"], self.served.model));
                    }
                    return sampled_of(&v).ok_or_else(|| format!("{url}: the answer has no choices[0].token_ids with their logprobs"));
                }
                Ok(resp) if resp.status().is_server_error() || resp.status().as_u16() == 429 => {
                    last_err = format!("{url} answered HTTP {}{}", resp.status(), crate::chat_api::server_says(resp).await)
                }
                Ok(resp) => {
                    let status = resp.status();
                    let says = crate::chat_api::server_says(resp).await;
                    // The adapter version was unloaded (by a stage of a newer version): load it
                    // again and ask the same server once more.
                    if let Some(dir) = &self.served.adapter
                        && engine_version::is_unknown_model(status.as_u16(), &says)
                        && !reloaded.contains(&server)
                    {
                        let base = &self.endpoints.urls[server];
                        engine_version::load(&self.client, base, &self.served.model, dir).await.map_err(|e| format!("{e:#}"))?;
                        self.reloads.fetch_add(1, Ordering::Relaxed);
                        reloaded.push(server);
                        continue;
                    }
                    return Err(format!("{url} answered HTTP {status}{says}"));
                }
                Err(e) => last_err = e.to_string(),
            }
            attempt += 1;
        }
        Err(format!("no server answered after {} tries: {last_err}", servers * (self.endpoints.retries as usize + 1)))
    }
}

/// `choices[0].token_ids` and `choices[0].logprobs.token_logprobs` of a completion, of equal
/// length, every log-prob finite and ≤ 0 (a forced token's is 0).
fn sampled_of(v: &Value) -> Option<(Vec<u32>, Vec<f32>)> {
    let choice = &v["choices"][0];
    let ids: Vec<u32> = choice["token_ids"].as_array()?.iter().map(|t| u32::try_from(t.as_u64()?).ok()).collect::<Option<_>>()?;
    let logprobs: Vec<f32> = choice["logprobs"]["token_logprobs"]
        .as_array()?
        .iter()
        .map(|l| l.as_f64().filter(|l| l.is_finite() && *l <= 0.0).map(|l| l as f32))
        .collect::<Option<_>>()?;
    (ids.len() == logprobs.len()).then_some((ids, logprobs))
}

impl rao_agent::Policy for EnginePolicy {
    fn act(&self, batch: Vec<Request>) -> BoxFuture<'_, Vec<Response>> {
        Box::pin(futures::future::join_all(batch.into_iter().map(|r| self.act_one(r))))
    }

    fn version(&self) -> i32 {
        self.version
    }

    fn counters(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("engine_requests", self.sent.load(Ordering::Relaxed) as f64),
            ("engine_retries", self.retried.load(Ordering::Relaxed) as f64),
            ("engine_adapter_reloads", self.reloads.load(Ordering::Relaxed) as f64),
            ("engine_failed_requests", self.failed.load(Ordering::Relaxed) as f64),
            ("text_unusable_replies", self.unusable.load(Ordering::Relaxed) as f64),
        ]
    }

    fn counts_own_window(&self) -> bool {
        true
    }

    fn unusable(&self) -> Option<String> {
        let failed = self.failed.load(Ordering::Relaxed);
        (failed > 0).then(|| {
            let gone: String = crate::engine_launch::exited(&self.endpoints.urls).iter().map(|g| format!("; {g}")).collect();
            format!(
                "{failed} request(s) to the engine failed, so some trees miss turns of this policy; the first failure: {}{gone}",
                self.first_failure.get().map_or("(not recorded)", String::as_str)
            )
        })
    }
}
