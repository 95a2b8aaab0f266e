//! `rao serve`: a rao checkpoint behind an OpenAI-compatible chat-completions API, acting in its
//! environment's text form. A request's conversation must be one the environment would show
//! (`rao_envs::text::context_of`), so the model sees exactly the context it would see in a
//! rollout, and its reply is sampled with the environment's grammar: every reply is an action.
//! `policy: openai` pointed at it gives, greedy, the trees of the in-process policy.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rao_agent::Policy as _;
use rao_agent::policy::Request;
use rao_envs::Episode;
use rao_envs::grammar::Grammar;
use rao_envs::text::{Message, context_of, words};
use rao_envs::vocab::EOS;
use rao_pipeline::StageContext;
use serde_json::{Value, json};

use crate::envs::{self, TaskSet};
use crate::neural::{LoadedModel, NeuralPolicy, load_model};
use crate::rollout::LimitParams;
use crate::text_policy::TextPolicy;

/// The model behind a server: rao's own (acting in the environment's tokens) or a language model
/// acting in text through its chat template.
enum Model {
    Compact { policy: Arc<rao_policy::Policy>, grammar: Arc<dyn Grammar>, window: usize },
    Text(TextPolicy),
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
}

impl Served {
    pub fn new(model: String, policy: Arc<rao_policy::Policy>, set: Arc<dyn TaskSet>, limits: &LimitParams) -> Self {
        let acting = Model::Compact { policy, grammar: set.grammar(limits.max_children as usize), window: limits.window };
        Served::with(model, acting, set)
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
                let grammar = set.grammar(limits.max_children as usize);
                let policy = TextPolicy::new(Arc::new(loaded.policy), tokenizer, grammar.as_ref(), set.episode(0), 1.0, limits.window)?
                    .with_prefix_cache(prefix_cache_bytes);
                Served::with(model, Model::Text(policy), set)
            }
        })
    }

    fn with(model: String, acting: Model, set: Arc<dyn TaskSet>) -> Self {
        Served { model, acting, text_form: set.episode(0), set, completion_tokens: AtomicUsize::new(0) }
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
    pub async fn complete(&self, body: &Value) -> Result<Value, String> {
        let messages: Vec<Message> =
            serde_json::from_value(body.get("messages").cloned().unwrap_or(Value::Null)).map_err(|e| format!("`messages`: {e}"))?;
        let temperature = match body.get("temperature") {
            None | Some(Value::Null) => 1.0,
            Some(t) => t.as_f64().filter(|t| t.is_finite() && *t >= 0.0).ok_or("`temperature` is a number ≥ 0")?,
        };
        let seed = body.get("seed").and_then(Value::as_u64).unwrap_or(0);
        let context = context_of(self.text_form.as_ref(), &messages)?;
        let (response, prompt_tokens) = match &self.acting {
            Model::Compact { policy, grammar, window } => {
                if context.len() >= *window {
                    return Err(format!("the conversation is {} tokens; the model's window is {window}", context.len()));
                }
                let (prompt_tokens, max_new_tokens) = (context.len(), window - context.len());
                let policy = NeuralPolicy::new(policy.clone(), grammar.clone(), self.set.vocab(), temperature);
                (policy.act(vec![Request { context, max_new_tokens, seed, model_context: vec![] }]).await.pop(), prompt_tokens)
            }
            // The conversation rendered whole through the chat template (a client sends text).
            Model::Text(policy) => {
                let request = Request { context, max_new_tokens: usize::MAX / 4, seed, model_context: vec![] };
                let response = policy.at_temperature(temperature).act(vec![request]).await.pop();
                let fed = response.as_ref().and_then(|r| r.model.as_ref()).map_or(0, |m| m.fed.len());
                (response, fed)
            }
        };
        let response = response.unwrap_or_default();
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

impl Served {
    /// `choices[0].logprobs` of a reply: every token the model sampled — the stop token
    /// included, so they sum to the log-prob of the whole reply — each with its behaviour
    /// log-prob (the masked, tempered distribution; 0 when greedy).
    fn token_logprobs(&self, response: &rao_agent::policy::Response) -> Value {
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

/// Serve `served` on `listener` until the process ends: `POST /v1/chat/completions`,
/// `GET /v1/models`.
pub async fn serve(listener: tokio::net::TcpListener, served: Arc<Served>) -> std::io::Result<()> {
    let app = Router::new().route("/v1/chat/completions", post(chat)).route("/v1/models", get(models)).with_state(served);
    axum::serve(listener, app).await
}

async fn chat(State(served): State<Arc<Served>>, body: Option<Json<Value>>) -> Response {
    let Some(Json(body)) = body else { return bad_request("the body is not JSON".into()) };
    match served.complete(&body).await {
        Ok(v) => Json(v).into_response(),
        Err(message) => bad_request(message),
    }
}

async fn models(State(served): State<Arc<Served>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{"id": served.model, "object": "model", "owned_by": "rao"}]}))
}

fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({"error": {"message": message, "type": "invalid_request_error"}}))).into_response()
}
