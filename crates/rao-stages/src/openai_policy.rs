//! `policy: openai`: any model behind an OpenAI-compatible chat-completions endpoint acts as the
//! policy. Each live node's context goes out as a conversation in the environment's text form
//! (`rao_envs::text`), the reply's first line is read back as the action's tokens, and the trees
//! are the same node table as any rollout's. Replies are cached by the whole request (model,
//! messages, temperature, seed), so a rerun with the same seed sends nothing and gives the same
//! trees.
//!
//! What the trees hold: the action's environment tokens (the reply parsed). When the server returns
//! token log-probs (asked for unless the block says `logprobs: false`), the reply's log-prob —
//! the sum over every token the server generated, wrapping included — is recorded on the action's
//! first token and 0 on the rest, so a turn's log-probs sum to what the model gave its reply;
//! without them every log-prob is 0. The endpoint's own token ids are not recorded: these trees
//! serve evaluation, analysis and demonstrations, not a policy-gradient update of that model. A
//! reply that is not an action of
//! the environment, and a request that fails after its retries, become an empty action, which the
//! environment answers with `err syntax`: the node goes on, and the run never fails for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::BoxFuture;
use rao_agent::policy::{Request, Response, finish_action};
use rao_envs::Episode;
use rao_envs::text::{conversation, parse_reply};
use serde_json::json;

use crate::chat_api::ChatApi;

/// Most tokens a reply may take (one action on one line needs far fewer).
const MAX_REPLY_TOKENS: u32 = 64;

pub struct OpenAiPolicy {
    api: Arc<ChatApi>,
    /// Any episode of the task set: the text form (instructions, layout, words) is the
    /// environment's, the same for every task.
    text_form: Arc<dyn Episode>,
    temperature: f64,
    /// Requests made (a node's turn that asked the endpoint), replies that were not an action,
    /// and requests that failed after their retries (with the first one's error).
    pub asked: AtomicUsize,
    pub unusable: AtomicUsize,
    pub failed: AtomicUsize,
    first_failure: std::sync::OnceLock<String>,
    /// Replies whose token log-probs came back (and are recorded).
    pub with_logprobs: AtomicUsize,
}

impl OpenAiPolicy {
    pub fn new(api: Arc<ChatApi>, text_form: Arc<dyn Episode>, temperature: f64) -> Self {
        OpenAiPolicy {
            api,
            text_form,
            temperature,
            asked: AtomicUsize::new(0),
            unusable: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            first_failure: std::sync::OnceLock::new(),
            with_logprobs: AtomicUsize::new(0),
        }
    }

    async fn act_one(&self, r: Request) -> Response {
        if r.max_new_tokens == 0 {
            // The window is full: nothing to ask (the node overflows, as with any policy).
            return finish_action(vec![], 0, 0.0);
        }
        let Some(messages) = conversation(self.text_form.as_ref(), &r.context) else {
            self.unusable.fetch_add(1, Ordering::Relaxed);
            return finish_action(vec![], r.max_new_tokens, 0.0);
        };
        let mut body = json!({
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": MAX_REPLY_TOKENS,
            // Honoured by vLLM, SGLang, llama.cpp and OpenAI; part of the cache key either way.
            // Their APIs take a signed 64-bit seed: the same 64 bits, read as signed.
            "seed": api_seed(r.seed),
        });
        if self.api.endpoint.logprobs {
            body["logprobs"] = json!(true);
        }
        self.asked.fetch_add(1, Ordering::Relaxed);
        let (action, logprob) = match self.api.answer(body, |_| true).await {
            Ok(answer) => {
                let action = parse_reply(self.text_form.vocab(), &answer.text).unwrap_or_else(|_| {
                    self.unusable.fetch_add(1, Ordering::Relaxed);
                    vec![]
                });
                let logprob = answer.token_logprobs.map(|tokens| {
                    self.with_logprobs.fetch_add(1, Ordering::Relaxed);
                    tokens.iter().map(|t| t.logprob).sum::<f32>()
                });
                (action, logprob)
            }
            Err(e) => {
                note_failure(&e);
                let _ = self.first_failure.set(format!("{e:#}"));
                self.failed.fetch_add(1, Ordering::Relaxed);
                (vec![], None)
            }
        };
        let mut response = finish_action(action, r.max_new_tokens, 0.0);
        if let (Some(logprob), Some(first)) = (logprob, response.logprobs.first_mut()) {
            *first = logprob;
        }
        response
    }
}

/// A seed as the OpenAI API and vLLM take it: a signed 64-bit integer (vLLM refuses one above
/// 2⁶³ − 1). The same bits read as signed, so `rao serve` recovers the seed exactly; vLLM
/// reads −1 (u64::MAX here) as "no seed", a chance of one in 2⁶⁴.
pub fn api_seed(seed: u64) -> i64 {
    seed as i64
}

/// Failed requests are counted; the first is shown on stderr (the run goes on).
fn note_failure(e: &anyhow::Error) {
    static SHOWN: std::sync::Once = std::sync::Once::new();
    SHOWN.call_once(|| eprintln!("policy: openai: {e:#} (the node sees `err syntax` and goes on; further failures are counted)"));
}

impl rao_agent::Policy for OpenAiPolicy {
    fn act(&self, batch: Vec<Request>) -> BoxFuture<'_, Vec<Response>> {
        // Requests of one round go out together (the client's concurrency limit paces them).
        Box::pin(futures::future::join_all(batch.into_iter().map(|r| self.act_one(r))))
    }

    fn counters(&self) -> Vec<(&'static str, f64)> {
        let stats = self.api.stats();
        vec![
            ("openai_requests", stats.calls as f64),
            ("openai_cache_hits", stats.cache_hits as f64),
            ("openai_unusable_replies", self.unusable.load(Ordering::Relaxed) as f64),
            ("openai_failed_requests", self.failed.load(Ordering::Relaxed) as f64),
            ("openai_replies_with_logprobs", self.with_logprobs.load(Ordering::Relaxed) as f64),
        ]
    }

    fn unusable(&self) -> Option<String> {
        let (asked, failed) = (self.asked.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed));
        (asked > 0 && failed == asked).then(|| {
            format!(
                "every one of the {asked} requests to {} failed, so these trees measure no model; the first failure: {}",
                self.api.endpoint.base_url,
                self.first_failure.get().map_or("(not recorded)", String::as_str)
            )
        })
    }
}
