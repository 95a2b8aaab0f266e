//! `rao serve`: a rao checkpoint behind an OpenAI-compatible chat-completions API, acting in its
//! environment's text form. A request's conversation must be one the environment would show
//! (`rao_envs::text::context_of`), so the model sees exactly the context it would see in a
//! rollout, and its reply is sampled with the environment's grammar: every reply is an action.
//! `policy: openai` pointed at it gives, greedy, the trees of the in-process policy.
//!
//! With `max_batch` above 1, requests in flight together are answered together: one worker takes
//! every request waiting when it is free (up to `max_batch`) and samples them in one batched call
//! per temperature — the same batched, KV-cached pass an in-process rollout makes for its live
//! nodes — while the next requests queue for the following batch. With 1, each request is
//! sampled by itself as it comes, several at once on the CPU's cores. See [`default_max_batch`].

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::FutureExt as _;
use rao_agent::policy::{Request, Response as Reply};
use rao_core::Mode;
use rao_envs::Episode;
use rao_envs::grammar::Grammar;
use rao_envs::text::{ConversationContext, GOAL_LAYOUT, Message, context_of, conversation, words};
use rao_envs::vocab::{BOS, EOS, OBS, PAD, Tok};
use rao_pipeline::StageContext;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::envs::{self, TaskSet};
use crate::neural::{LoadedModel, NeuralPolicy, load_model};
use crate::rollout::LimitParams;
use crate::text_policy::TextPolicy;

/// The model behind a server: rao's own (acting in the environment's tokens) or a language model
/// acting in text through its chat template.
#[derive(Clone)]
enum Model {
    Compact { policy: Arc<rao_policy::Policy>, grammar: Arc<dyn Grammar>, window: usize },
    Text(Arc<TextPolicy>),
}

/// Why a request got no completion: what is wrong with it (400), or the model failed (500).
#[derive(Debug, Clone, PartialEq)]
pub enum ServeError {
    BadRequest(String),
    /// The request names a model this server does not serve (404, as OpenAI's API answers).
    NoSuchModel(String),
    Model(String),
}

impl From<String> for ServeError {
    fn from(message: String) -> Self {
        ServeError::BadRequest(message)
    }
}

impl From<&str> for ServeError {
    fn from(message: &str) -> Self {
        ServeError::BadRequest(message.to_string())
    }
}

/// Requests answered together at most when the model runs on a GPU backend: there one batched
/// pass costs about what one request's does (BENCHMARKS.md, "GPU: Qwen3-0.6B shape").
pub const GPU_MAX_BATCH: usize = 64;

/// How many requests a server answers together by default: [`GPU_MAX_BATCH`] on a GPU backend,
/// 1 on the CPU — measured there (BENCHMARKS.md, `bench_serve`), requests sampled each by itself,
/// two at a time on two cores, gave more tokens/s than batches, which pad every row to the
/// longest context (a language model's cached context included) and decode to the longest reply.
pub fn default_max_batch(policy: &rao_policy::Policy) -> usize {
    if rao_policy::kernels::serves(&policy.device) { 1 } else { GPU_MAX_BATCH }
}

impl Model {
    /// The model as a policy sampling at `temperature`.
    fn at(&self, temperature: f64) -> Box<dyn rao_agent::Policy> {
        match self {
            Model::Compact { policy, grammar, .. } => Box::new(NeuralPolicy::new(policy.clone(), grammar.clone(), temperature)),
            Model::Text(policy) => Box::new(policy.at_temperature(temperature)),
        }
    }
}

/// A request waiting for the batch worker.
struct Pending {
    request: Request,
    temperature: f64,
    reply: oneshot::Sender<Reply>,
}

/// What a server answers with: a model and its environment.
pub struct Served {
    pub model: String,
    acting: Model,
    pub set: Arc<dyn TaskSet>,
    /// Any episode of the set: the text form is the environment's, the same for every task.
    pub text_form: Arc<dyn Episode>,
    /// Tokens the model generated for all requests so far (its own tokens).
    pub completion_tokens: AtomicUsize,
    /// Batched sampling calls made so far (each answers one or more requests).
    pub batches: Arc<AtomicUsize>,
    max_batch: usize,
    /// The batch worker's queue, started by the first request (inside the server's runtime).
    queue: OnceLock<mpsc::Sender<Pending>>,
}

impl Served {
    pub fn new(model: String, policy: Arc<rao_policy::Policy>, set: Arc<dyn TaskSet>, limits: &LimitParams) -> Self {
        let max_batch = default_max_batch(&policy);
        let acting = Model::Compact { policy, grammar: set.grammar(limits.max_children as usize), window: limits.window };
        Served::with(model, acting, set, max_batch)
    }

    /// A checkpoint as loaded (`neural::load_model`): in text when it has a tokenizer (with a
    /// prefix cache of `prefix_cache_bytes`), the window then counted in its tokens.
    pub fn from_loaded(
        model: String,
        loaded: LoadedModel,
        set: Arc<dyn TaskSet>,
        limits: &LimitParams,
        prefix_cache_bytes: usize,
    ) -> anyhow::Result<Self> {
        Ok(match loaded.tokenizer {
            None => Served::new(model, Arc::new(loaded.policy), set, limits),
            Some(tokenizer) => {
                let max_batch = default_max_batch(&loaded.policy);
                let grammar = set.grammar(limits.max_children as usize);
                let policy = TextPolicy::new(Arc::new(loaded.policy), tokenizer, grammar.as_ref(), set.episode(0), 1.0, limits.window)?
                    .with_prefix_cache(prefix_cache_bytes);
                Served::with(model, Model::Text(Arc::new(policy)), set, max_batch)
            }
        })
    }

    fn with(model: String, acting: Model, set: Arc<dyn TaskSet>, max_batch: usize) -> Self {
        Served {
            model,
            acting,
            text_form: set.episode(0),
            set,
            completion_tokens: AtomicUsize::new(0),
            batches: Arc::default(),
            max_batch,
            queue: OnceLock::new(),
        }
    }

    /// Answer at most `max_batch` requests in one batched call (1: each request alone). Takes
    /// effect before the first request.
    pub fn with_max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self
    }

    /// Requests answered together at most.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// Sample `request`'s reply: by itself, or queued for the batch worker.
    async fn answer(&self, request: Request, temperature: f64) -> Result<Reply, ServeError> {
        if self.max_batch == 1 {
            self.batches.fetch_add(1, Ordering::Relaxed);
            let reply = AssertUnwindSafe(self.acting.at(temperature).act(vec![request])).catch_unwind().await;
            return reply.ok().and_then(|mut r| r.pop()).ok_or_else(|| ServeError::Model("the model failed on this request".into()));
        }
        let queue = self.queue.get_or_init(|| {
            // Room for a batch being answered and the next one filling up; beyond that a
            // request waits for room (no unbounded queue).
            let (tx, rx) = mpsc::channel(2 * self.max_batch);
            tokio::spawn(answer_batches(self.acting.clone(), rx, self.max_batch, self.batches.clone()));
            tx
        });
        let (reply, answered) = oneshot::channel();
        queue.send(Pending { request, temperature, reply }).await.map_err(|_| ServeError::Model("the model is not answering".into()))?;
        answered.await.map_err(|_| ServeError::Model("the model failed on this request's batch".into()))
    }

    /// The `tasks` and `checkpoint` inputs of a stage instance (e.g. an `evaluate`), with the
    /// window and launch limit of its `limits` params.
    pub async fn from_stage(ctx: &StageContext) -> anyhow::Result<Self> {
        let set = envs::load(ctx, "tasks").await?;
        let backend = serde_json::from_value(ctx.params.get("backend").cloned().unwrap_or(Value::Null)).unwrap_or_default();
        let loaded = load_model(ctx, "checkpoint", backend).await?;
        let limits: LimitParams = match ctx.params.get("limits") {
            Some(l) => serde_json::from_value(l.clone()).map_err(|e| anyhow::anyhow!("params.limits of `{}`: {e}", ctx.instance))?,
            None => LimitParams::default(),
        };
        // The instance's own prefix cache size (`rollout`'s and `evaluate`'s param), if it sets one.
        let cache_mb = match ctx.params.get("prefix_cache_mb") {
            Some(v) => {
                v.as_u64().ok_or_else(|| anyhow::anyhow!("params.prefix_cache_mb of `{}` is a number of MiB", ctx.instance))? as usize
            }
            None => crate::rollout::default_prefix_cache_mb(),
        };
        Served::from_loaded(format!("{}/{}", ctx.pipeline, ctx.instance), loaded, set, &limits, cache_mb.saturating_mul(1 << 20))
    }

    /// One chat completion, or what is wrong with the request.
    pub async fn complete(&self, body: &Value) -> Result<Value, ServeError> {
        match body.get("model") {
            None | Some(Value::Null) => {}
            Some(Value::String(name)) if *name == self.model => {}
            Some(Value::String(name)) => {
                return Err(ServeError::NoSuchModel(format!(
                    "the model `{name}` is not served here: this server serves `{}` (`GET /v1/models`)",
                    self.model
                )));
            }
            Some(_) => return Err(format!("`model` is a string: `{}`", self.model).into()),
        }
        let messages: Vec<Message> =
            serde_json::from_value(body.get("messages").cloned().unwrap_or(Value::Null)).map_err(|e| format!("`messages`: {e}"))?;
        let temperature = match body.get("temperature") {
            None | Some(Value::Null) => 1.0,
            Some(t) => t.as_f64().filter(|t| t.is_finite() && *t >= 0.0).ok_or("`temperature` is a number ≥ 0")?,
        };
        // Signed, as the OpenAI API takes it (rao's `policy: openai` sends its u64 seeds' bits
        // that way); a larger unsigned one is taken as it is.
        let seed = body.get("seed").and_then(|s| s.as_i64().map(|s| s as u64).or_else(|| s.as_u64())).unwrap_or(0);
        // Options a client may count on are honoured or refused, never ignored.
        if body.get("stream").is_some_and(|v| v != &Value::Bool(false) && !v.is_null()) {
            return Err("`stream`: streaming is not served; send `\"stream\": false` or leave it out".to_string().into());
        }
        if body.get("n").is_some_and(|v| v.as_u64() != Some(1) && !v.is_null()) {
            return Err("`n`: one completion per request (`\"n\": 1`)".to_string().into());
        }
        let max_tokens = match body.get("max_completion_tokens").or_else(|| body.get("max_tokens")) {
            None | Some(Value::Null) => usize::MAX / 4,
            Some(v) => {
                v.as_u64().filter(|n| *n >= 1).map(|n| n.min(usize::MAX as u64 / 4) as usize).ok_or("`max_tokens`: an integer ≥ 1")?
            }
        };
        let ConversationContext { tokens: context, recursive } = context_of(self.text_form.as_ref(), &messages)?;
        let mode = Mode::from_recursive(recursive);
        let (response, prompt_tokens) = match &self.acting {
            Model::Compact { window, .. } => {
                if context.len() >= *window {
                    return Err(format!("the conversation is {} tokens; the model's window is {window}", context.len()).into());
                }
                let (prompt_tokens, max_new_tokens) = (context.len(), (window - context.len()).min(max_tokens));
                (self.answer(Request { context, max_new_tokens, seed, mode, model_context: vec![] }, temperature).await?, prompt_tokens)
            }
            // The conversation rendered whole through the chat template (a client sends text).
            Model::Text(_) => {
                let request = Request { context, max_new_tokens: max_tokens, seed, mode, model_context: vec![] };
                let response = self.answer(request, temperature).await?;
                let fed = response.model.as_ref().map_or(0, |m| m.fed.len());
                (response, fed)
            }
        };
        let completion_tokens = response.model.as_ref().map_or(response.tokens.len(), |m| m.sampled.len());
        let logprobs = match body.get("logprobs") {
            Some(Value::Bool(true)) => self.token_logprobs(&response),
            _ => Value::Null,
        };
        self.completion_tokens.fetch_add(completion_tokens, Ordering::Relaxed);
        let mut tokens = response.tokens;
        let finish_reason = if tokens.last() == Some(&EOS) { "stop" } else { "length" };
        tokens.retain(|&t| t != EOS);
        Ok(json!({
            "object": "chat.completion",
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": words(self.set.vocab(), &tokens)},
                "finish_reason": finish_reason,
                "logprobs": logprobs,
            }],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
        }))
    }
}

/// How a request must look, as `GET /v1/environment` answers it and `rao serve --explain` prints it.
const LAYOUT: [&str; 3] = [
    "message 0, role `system`: the environment's instructions, recursive or flat, word for word (which one sets how the agent acts)",
    "message 1, role `user`: the goal, as `Goal: GOAL\\n(You are at depth D.)` (D = 0 for an agent no one launched)",
    "then in turn the agent's actions (role `assistant`) and the environment's observations (role `user`), as a rollout shows them; the reply is the next action",
];

impl Served {
    /// What a client needs to talk to this server: the environment, its two instructions, the
    /// message layout, its words, and a ready request (task 0, recursive, greedy).
    pub fn environment(&self) -> Value {
        let vocab = self.set.vocab();
        let words: Vec<&str> = (0..vocab.len() as Tok).filter(|t| !matches!(*t, PAD | BOS | EOS | OBS)).map(|t| vocab.word(t)).collect();
        json!({
            "model": self.model,
            "environment": self.set.env(),
            "tasks": self.set.len(),
            "instructions": {"recursive": self.text_form.instructions(true), "flat": self.text_form.instructions(false)},
            "layout": LAYOUT,
            "goal_layout": GOAL_LAYOUT,
            "words": words,
            "example": self.example(0, true),
        })
    }

    /// A request body this server answers: task `task`'s root agent, greedy. `None` past the last task.
    pub fn example(&self, task: usize, recursive: bool) -> Option<Value> {
        if task >= self.set.len() {
            return None;
        }
        let episode = self.set.episode(task);
        let messages = conversation(episode.as_ref(), &episode.prompt(&episode.root_goal(), 0, recursive))?;
        Some(json!({"model": self.model, "messages": messages, "temperature": 0}))
    }

    /// [`Served::environment`] for a person to read (`rao serve --explain`).
    pub fn explain(&self, base_url: &str) -> String {
        let mut out =
            format!("`{}` acts in the {} environment ({} tasks). A request's messages:\n", self.model, self.set.env(), self.set.len());
        for line in LAYOUT {
            out += &format!("  - {line}\n");
        }
        for recursive in [true, false] {
            let name = if recursive { "recursive" } else { "flat" };
            out += &format!("\nThe {name} instructions (message 0):\n{}\n", self.text_form.instructions(recursive));
        }
        out += &format!(
            "\nA ready request (task 0's root agent, greedy) and the whole description as JSON:\n  \
             curl -s {base_url}/environment/example | curl -s {base_url}/chat/completions -H 'Content-Type: application/json' -d @-\n  \
             curl -s {base_url}/environment\n\
             (`/environment/example?task=N&mode=flat` for another task or the flat agent.)\n"
        );
        out
    }

    /// `choices[0].logprobs` of a reply: every token the model sampled — the stop token
    /// included, so they sum to the log-prob of the whole reply — each with its behaviour
    /// log-prob (the masked, tempered distribution; 0 when greedy).
    fn token_logprobs(&self, response: &Reply) -> Value {
        let entry =
            |token: String, logprob: f32| json!({"token": token, "logprob": logprob, "bytes": token.as_bytes(), "top_logprobs": []});
        let content: Vec<Value> = match (&self.acting, &response.model) {
            (Model::Text(policy), Some(m)) => {
                m.sampled.iter().zip(&m.logprobs).map(|(&id, &lp)| entry(policy.token_text(id), lp)).collect()
            }
            _ => response.tokens.iter().zip(&response.logprobs).map(|(&t, &lp)| entry(self.set.vocab().word(t).to_string(), lp)).collect(),
        };
        json!({ "content": content })
    }
}

/// The batch worker: takes every request waiting (up to `max_batch`), answers them with one
/// sampling call per temperature, and replies to each; ends when the server is dropped. Each
/// request carries its own seed and window, so its reply does not depend on its batch-mates. A
/// call that panics fails only its own batch's requests.
async fn answer_batches(acting: Model, mut queue: mpsc::Receiver<Pending>, max_batch: usize, batches: Arc<AtomicUsize>) {
    while let Some(first) = queue.recv().await {
        let mut by_temperature: BTreeMap<u64, Vec<Pending>> = BTreeMap::new();
        by_temperature.entry(first.temperature.to_bits()).or_default().push(first);
        let mut taken = 1;
        while taken < max_batch {
            let Ok(next) = queue.try_recv() else { break };
            by_temperature.entry(next.temperature.to_bits()).or_default().push(next);
            taken += 1;
        }
        for (bits, waiting) in by_temperature {
            let temperature = f64::from_bits(bits);
            let (requests, replies): (Vec<Request>, Vec<_>) = waiting.into_iter().map(|p| (p.request, p.reply)).unzip();
            let policy = acting.at(temperature);
            batches.fetch_add(1, Ordering::Relaxed);
            // Dropping a batch's reply senders tells its requests that the call failed.
            if let Ok(responses) = AssertUnwindSafe(policy.act(requests)).catch_unwind().await {
                for (reply, response) in replies.into_iter().zip(responses) {
                    let _ = reply.send(response);
                }
            }
        }
    }
}

/// How long a connection may take to send a request head unless told otherwise (hyper's own
/// default, which takes effect only with a timer).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Serve `served` on `listener` until the process ends: `POST /v1/chat/completions`,
/// `GET /v1/models`. A connection that has not sent a whole request head within
/// `header_timeout` (of opening, or of its previous reply) is closed: a client that opens
/// connections and sends nothing, or a byte at a time, would otherwise hold them for ever.
pub async fn serve(listener: tokio::net::TcpListener, served: Arc<Served>, header_timeout: Duration) -> std::io::Result<()> {
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/v1/environment", get(environment))
        .route("/v1/environment/example", get(example))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(served);
    let service = hyper_util::service::TowerToHyperService::new(app);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Out of file descriptors and the like: wait for connections to close, keep serving.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        tokio::spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(header_timeout);
            // A connection's errors (closed early, timed out, not HTTP) end that connection only.
            let _ = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
        });
    }
}

/// A body that is not JSON (or lacks `Content-Type: application/json`) is answered like every
/// other refusal, as an OpenAI-style JSON error, not axum's plain-text rejection.
async fn chat(State(served): State<Arc<Served>>, body: Result<Json<Value>, JsonRejection>) -> Response {
    let body = match body {
        Ok(Json(body)) => body,
        Err(rejection) => return (rejection.status(), error_body(rejection.body_text(), "invalid_request_error")).into_response(),
    };
    match served.complete(&body).await {
        Ok(v) => Json(v).into_response(),
        Err(ServeError::BadRequest(message)) => bad_request(message),
        Err(ServeError::NoSuchModel(message)) => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": {"message": message, "type": "invalid_request_error", "code": "model_not_found"}})),
        )
            .into_response(),
        Err(ServeError::Model(message)) => (StatusCode::INTERNAL_SERVER_ERROR, error_body(message, "server_error")).into_response(),
    }
}

async fn models(State(served): State<Arc<Served>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{"id": served.model, "object": "model", "owned_by": "rao"}]}))
}

async fn environment(State(served): State<Arc<Served>>) -> Json<Value> {
    Json(served.environment())
}

/// `?task=N` (default 0) and `mode=recursive|flat` (default recursive).
async fn example(State(served): State<Arc<Served>>, uri: axum::http::Uri) -> Response {
    let (mut task, mut recursive) = (0usize, true);
    for pair in uri.query().unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("task", n)) => match n.parse() {
                Ok(n) => task = n,
                Err(_) => return bad_request(format!("`task={n}`: a task's index, 0 to {}", served.set.len().saturating_sub(1))),
            },
            Some(("mode", "recursive")) => recursive = true,
            Some(("mode", "flat")) => recursive = false,
            _ => return bad_request(format!("`{pair}`: this route takes `task=N` and `mode=recursive` or `mode=flat`")),
        }
    }
    match served.example(task, recursive) {
        Some(body) => Json(body).into_response(),
        None => bad_request(format!("`task={task}`: the tasks are 0 to {}", served.set.len().saturating_sub(1))),
    }
}

/// Unknown paths and methods get the same JSON errors as everything else (axum's are empty).
async fn not_found(uri: axum::http::Uri) -> Response {
    let message = format!("no route {}: rao serves POST /v1/chat/completions, GET /v1/models and GET /v1/environment", uri.path());
    (StatusCode::NOT_FOUND, error_body(message, "invalid_request_error")).into_response()
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let message =
        format!("{method} is not served at {}: rao serves POST /v1/chat/completions, GET /v1/models and GET /v1/environment", uri.path());
    (StatusCode::METHOD_NOT_ALLOWED, error_body(message, "invalid_request_error")).into_response()
}

fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, error_body(message, "invalid_request_error")).into_response()
}

fn error_body(message: String, kind: &str) -> Json<Value> {
    Json(json!({"error": {"message": message, "type": kind}}))
}
