//! `rao serve`: a rao checkpoint behind an OpenAI-compatible chat-completions API, acting in its
//! environment's text form. A request's conversation must be one the environment would show
//! (`rao_envs::text::context_of`), so the model sees exactly the context it would see in a
//! rollout, and its reply is sampled with the environment's grammar: every reply is an action.
//! `policy: openai` pointed at it gives, greedy, the trees of the in-process policy.

use std::sync::Arc;

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
use crate::neural::{NeuralPolicy, load_policy};
use crate::rollout::LimitParams;

/// What a server answers with: a policy, its environment and its window.
pub struct Served {
    pub model: String,
    pub policy: Arc<rao_policy::Policy>,
    pub set: Arc<dyn TaskSet>,
    pub grammar: Arc<dyn Grammar>,
    /// Any episode of the set: the text form is the environment's, the same for every task.
    pub text_form: Arc<dyn Episode>,
    pub window: usize,
}

impl Served {
    pub fn new(model: String, policy: Arc<rao_policy::Policy>, set: Arc<dyn TaskSet>, limits: &LimitParams) -> Self {
        let grammar = set.grammar(limits.max_children as usize);
        let text_form = set.episode(0);
        Served { model, policy, set, grammar, text_form, window: limits.window }
    }

    /// The `tasks` and `checkpoint` inputs of a stage instance (e.g. an `evaluate`), with the
    /// window and launch limit of its `limits` params.
    pub async fn from_stage(ctx: &StageContext) -> anyhow::Result<Self> {
        let set = envs::load(ctx, "tasks").await?;
        let backend = serde_json::from_value(ctx.params.get("backend").cloned().unwrap_or(Value::Null)).unwrap_or_default();
        let policy = load_policy(ctx, "checkpoint", backend).await?;
        let limits: LimitParams = match ctx.params.get("limits") {
            Some(l) => serde_json::from_value(l.clone()).map_err(|e| anyhow::anyhow!("params.limits of `{}`: {e}", ctx.instance))?,
            None => LimitParams::default(),
        };
        Ok(Served::new(format!("{}/{}", ctx.pipeline, ctx.instance), Arc::new(policy), set, &limits))
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
        if context.len() >= self.window {
            return Err(format!("the conversation is {} tokens; the model's window is {}", context.len(), self.window));
        }
        let prompt_tokens = context.len();
        let max_new_tokens = self.window - prompt_tokens;
        let policy = NeuralPolicy::new(self.policy.clone(), self.grammar.clone(), self.set.vocab(), temperature);
        let mut out = policy.act(vec![Request { context, max_new_tokens, seed, model_context: vec![] }]).await;
        let mut tokens = out.pop().map(|r| r.tokens).unwrap_or_default();
        let finish_reason = if tokens.last() == Some(&EOS) { "stop" } else { "length" };
        let completion_tokens = tokens.len();
        tokens.retain(|&t| t != EOS);
        Ok(json!({
            "object": "chat.completion",
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": words(self.set.vocab(), &tokens)},
                "finish_reason": finish_reason,
            }],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
        }))
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
