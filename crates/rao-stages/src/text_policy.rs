//! A language model acting in text. A node's context becomes a chat conversation (the
//! environment's text form, `rao_envs::text`) rendered through the model's own chat template; the
//! reply is sampled under the environment's action grammar over the model's vocabulary
//! (`TextGrammar`, llguidance) and read back as the environment's action. The model's tokens
//! are kept exactly as fed and sampled (token in, token out): a node's next prompt is its own
//! earlier tokens plus what the template adds for the new observation, never a re-tokenised
//! rendering of the whole conversation, and the tree records those ids for training.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use futures::future::BoxFuture;
use rao_agent::{ModelTokens, Request, Response};
use rao_envs::Episode;
use rao_envs::grammar::Grammar;
use rao_envs::text::{Message, Role, conversation, parse_reply, words};
use rao_envs::vocab::{EOS, Tok};
use rao_policy::hf::TextTokenizer;
use rao_policy::hf::chat::ChatTemplate;
use rao_policy::hf::constraint::TextGrammar;
use rao_policy::prefix_cache::PrefixCache;
use rao_policy::{Policy, SampleRequest, Sequence};
use serde_json::json;

/// `model:` and the first 16 hex digits of the blake3 of `tokenizer.json`: the trees'
/// `token_space`, so an update never mixes ids of different tokenizers.
pub fn token_space(tokenizer: &TextTokenizer) -> String {
    format!("model:{}", &blake3::hash(tokenizer.source().as_bytes()).to_hex()[..16])
}

/// The environment's action grammar in text (`Grammar::lark`) over the model's vocabulary, ended
/// by its first stop token: what a text policy samples under and its update scores with.
pub fn text_grammar(policy: &Policy, tokenizer: &TextTokenizer, env_grammar: &dyn Grammar) -> anyhow::Result<TextGrammar> {
    let stop = *policy.stop_tokens.first().ok_or_else(|| anyhow::anyhow!("the model has no stop token"))?;
    let lark = |recursive| env_grammar.lark(recursive).ok_or_else(|| anyhow::anyhow!(rao_envs::grammar::NO_TEXT_FORM));
    TextGrammar::new(tokenizer.token_bytes()?, stop, policy.cfg.vocab, &lark(false)?, &lark(true)?)
}

/// How a chat template continues a conversation: rendered once at the start, checked for the
/// two properties token-in-token-out needs.
struct Continuation {
    /// What the template writes after the stop token that ends an assistant turn (`"\n"` for
    /// ChatML): the model samples the stop token, the next turn starts after this.
    after_stop: String,
}

impl Continuation {
    fn new(template: &ChatTemplate, stop_text: &str) -> anyhow::Result<Self> {
        let marker = "ASSISTANT-REPLY";
        let probe = |msgs: &[(&str, &str)], generation_prompt: bool| {
            let v: Vec<_> = msgs.iter().map(|(r, c)| json!({"role": r, "content": c})).collect();
            template.render(&json!(v), generation_prompt)
        };
        let turn = probe(&[("system", "S"), ("user", "U"), ("assistant", marker)], false)?;
        let end = format!("{marker}{stop_text}");
        let at = turn.rfind(&end).ok_or_else(|| {
            anyhow::anyhow!(
                "the chat template does not end an assistant turn with the stop token `{stop_text}`; rao continues a \
                 conversation from the tokens the model sampled, so the reply's stop token must be the template's turn end"
            )
        })?;
        Ok(Continuation { after_stop: turn[at + end.len()..].to_string() })
    }
}

/// An environment's text form for one model: conversations rendered through its chat template
/// and tokenized as the model acts on them. Shared by the policy acting and by the warm start,
/// whose demonstrations are the same token sequences a rollout of the same actions records.
pub struct TextForm {
    pub tokenizer: Arc<TextTokenizer>,
    /// Any episode of the environment (its instructions and how to read a node's context).
    episode: Arc<dyn Episode>,
    continuation: Continuation,
    /// The token that ends a reply.
    stop: Tok,
}

impl TextForm {
    pub fn new(tokenizer: Arc<TextTokenizer>, episode: Arc<dyn Episode>, stop: Tok) -> anyhow::Result<Self> {
        let template = tokenizer.chat.as_ref().ok_or_else(|| anyhow::anyhow!("the model's tokenizer has no chat template"))?;
        let continuation = Continuation::new(template, &tokenizer.decode(&[stop], false)?)?;
        Ok(TextForm { tokenizer, episode, continuation, stop })
    }

    fn render(&self, messages: &[Message], generation_prompt: bool) -> anyhow::Result<String> {
        let template = self.tokenizer.chat.as_ref().expect("checked in new");
        template.render(&serde_json::to_value(messages)?, generation_prompt)
    }

    /// The tokens to feed before a node's next action, its context being `context` (the
    /// environment's tokens): the whole rendered prompt before its first action, then only what
    /// the template adds for the newest observation (its user turn and the opened assistant
    /// turn), after the stop token the model sampled.
    pub fn to_feed(&self, context: &[Tok], first: bool) -> anyhow::Result<Vec<u32>> {
        let messages = conversation(self.episode.as_ref(), context).ok_or_else(|| anyhow::anyhow!("a node context without a prompt"))?;
        if first {
            return self.tokenizer.encode(&self.render(&messages, true)?, false);
        }
        let text = match messages.last() {
            Some(m) if m.role == Role::User => {
                // The newest observation rendered after the system message alone: the template's
                // text for one user turn, whatever it does to earlier assistant turns.
                let system = &messages[..1];
                let head = self.render(system, false)?;
                let with = self.render(&[system[0].clone(), m.clone()], true)?;
                let turn = with.strip_prefix(head.as_str()).ok_or_else(|| {
                    anyhow::anyhow!("the chat template renders a system message differently once a user message follows it")
                })?;
                format!("{}{turn}", self.continuation.after_stop)
            }
            // No observation since the last action: the assistant turn is opened again.
            _ => {
                let head = self.render(&messages, false)?;
                let with = self.render(&messages, true)?;
                format!("{}{}", self.continuation.after_stop, with.strip_prefix(head.as_str()).unwrap_or_default())
            }
        };
        self.tokenizer.encode(&text, false)
    }

    /// How many of a first prompt's tokens (`fed`, for the node's `context`) are its system
    /// message alone — the instructions every node of its mode starts with, worth caching once.
    /// 0 where the template's tokens for the system message are not a prefix of the prompt's.
    pub fn system_prefix(&self, context: &[Tok], fed: &[u32]) -> usize {
        let head = conversation(self.episode.as_ref(), context)
            .and_then(|m| m.first().cloned())
            .and_then(|system| self.render(&[system], false).ok())
            .and_then(|text| self.tokenizer.encode(&text, false).ok());
        match head {
            Some(head) if head.len() < fed.len() && fed.starts_with(&head) => head.len(),
            _ => 0,
        }
    }

    /// An action in the environment's tokens as the model's reply: its words, and the stop
    /// token where the action ends (`<eos>`).
    pub fn reply(&self, action: &[Tok]) -> anyhow::Result<Vec<u32>> {
        let mut reply = self.tokenizer.encode(&words(self.episode.vocab(), action), false)?;
        if action.last() == Some(&EOS) {
            reply.push(self.stop);
        }
        Ok(reply)
    }

    /// A node's sequence in the environment's tokens (prompt, then each action and observation)
    /// as the model's tokens: what a rollout of the same actions feeds it, each action written in
    /// words and ended by the stop token. For demonstrations (log-probs 0).
    pub fn sequence(&self, s: &Sequence) -> anyhow::Result<Sequence> {
        let n = s.tokens.len();
        let mut i = s.generated.iter().position(|g| *g).unwrap_or(n);
        let mut context = s.tokens[..i].to_vec();
        let mut out = Sequence { tokens: vec![], generated: vec![], old_logprobs: vec![], ..s.clone() };
        let push = |out: &mut Sequence, toks: &[u32], generated: bool| {
            out.tokens.extend(toks);
            out.generated.extend(std::iter::repeat_n(generated, toks.len()));
            out.old_logprobs.extend(std::iter::repeat_n(0.0, toks.len()));
        };
        while i < n {
            let feed = self.to_feed(&context, out.tokens.is_empty())?;
            push(&mut out, &feed, false);
            let start = i;
            while i < n && s.generated[i] {
                i += 1;
            }
            let action = &s.tokens[start..i];
            push(&mut out, &self.reply(action)?, true);
            context.extend(action);
            let start = i;
            while i < n && !s.generated[i] {
                i += 1;
            }
            context.extend(&s.tokens[start..i]);
        }
        Ok(out)
    }
}

/// A Hugging Face model's checkpoint as the runtime's policy, acting in text.
pub struct TextPolicy {
    policy: Arc<Policy>,
    form: Arc<TextForm>,
    grammar: Arc<TextGrammar>,
    space: Arc<str>,
    temperature: f64,
    /// The node's window, in the model's tokens.
    window: usize,
    /// Replies that did not read as an action (impossible under the grammar; counted).
    pub unusable: AtomicUsize,
    /// Keys and values of the nodes' contexts so far: each action prefills only what is new.
    cache: Arc<Mutex<PrefixCache>>,
}

impl TextPolicy {
    /// One of the model's tokens as text (its stop token included: `<|im_end|>`).
    pub fn token_text(&self, id: u32) -> String {
        self.form.tokenizer.decode(&[id], false).unwrap_or_default()
    }

    /// `grammar` is the environment's action grammar (its `lark` text form is compiled over the
    /// tokenizer's vocabulary), `text_form` any episode of the environment.
    pub fn new(
        policy: Arc<Policy>,
        tokenizer: Arc<TextTokenizer>,
        env_grammar: &dyn Grammar,
        text_form: Arc<dyn Episode>,
        temperature: f64,
        window: usize,
    ) -> anyhow::Result<Self> {
        let grammar = text_grammar(&policy, &tokenizer, env_grammar)?;
        Ok(TextPolicy {
            space: token_space(&tokenizer).into(),
            form: Arc::new(TextForm::new(tokenizer, text_form, grammar.stop())?),
            policy,
            grammar: Arc::new(grammar),
            temperature,
            window,
            unusable: AtomicUsize::new(0),
            cache: Arc::default(),
        })
    }

    /// The same policy with a prefix cache of `bytes` (keys and values of the nodes' contexts).
    pub fn with_prefix_cache(mut self, bytes: usize) -> Self {
        self.cache = Arc::new(Mutex::new(PrefixCache::new(bytes)));
        self
    }

    /// The same policy sampling at another temperature (sharing the model, grammar and form).
    pub fn at_temperature(&self, temperature: f64) -> TextPolicy {
        TextPolicy {
            policy: self.policy.clone(),
            form: self.form.clone(),
            grammar: self.grammar.clone(),
            space: self.space.clone(),
            temperature,
            window: self.window,
            unusable: AtomicUsize::new(0),
            cache: self.cache.clone(),
        }
    }

    /// The action grammar over the model's vocabulary (what training masks with, too).
    pub fn grammar(&self) -> &TextGrammar {
        &self.grammar
    }
}

impl rao_agent::Policy for TextPolicy {
    fn act(&self, batch: Vec<Request>) -> BoxFuture<'_, Vec<Response>> {
        Box::pin(async move {
            // What each node is fed; a node whose observation does not fit is not fed at all.
            let mut fed: Vec<Vec<u32>> = Vec::with_capacity(batch.len());
            let mut reqs: Vec<SampleRequest> = Vec::new();
            let mut rows: Vec<Option<usize>> = Vec::with_capacity(batch.len());
            let mut shared: Vec<usize> = Vec::new();
            for r in &batch {
                let feed = self.form.to_feed(&r.context, r.model_context.is_empty()).unwrap_or_else(|e| {
                    note_failure(&e);
                    Vec::new()
                });
                let Some(req) = sample_request(r, &feed, self.window) else {
                    fed.push(Vec::new());
                    rows.push(None);
                    continue;
                };
                rows.push(Some(reqs.len()));
                shared.push(if r.model_context.is_empty() { self.form.system_prefix(&r.context, &feed) } else { 0 });
                reqs.push(req);
                fed.push(feed);
            }
            let (policy, grammar, temperature, cache) = (self.policy.clone(), self.grammar.clone(), self.temperature, self.cache.clone());
            let sampled = tokio::task::spawn_blocking(move || {
                let mut cache = cache.lock();
                policy.sample_cached(&reqs, &shared, grammar.as_ref(), temperature, &mut cache)
            })
            .await
            .expect("sampling panicked");
            rows.into_iter()
                .zip(fed)
                .map(|(row, fed)| {
                    let (sampled, logprobs) = row.map(|i| sampled[i].clone()).unwrap_or_default();
                    let tokens = action_of(&self.form, self.grammar.stop(), &sampled, &self.unusable);
                    let logprobs_env = vec![0.0; tokens.len()];
                    Response {
                        tokens,
                        logprobs: logprobs_env,
                        model: Some(ModelTokens { space: self.space.clone(), fed, sampled, logprobs }),
                    }
                })
                .collect()
        })
    }

    fn version(&self) -> i32 {
        self.policy.version
    }

    fn counters(&self) -> Vec<(&'static str, f64)> {
        let stats = self.cache.lock().stats;
        vec![
            ("text_unusable_replies", self.unusable.load(Ordering::Relaxed) as f64),
            ("prefix_cache_hits", stats.hits as f64),
            ("prefix_cache_misses", stats.misses as f64),
            ("prefix_cache_reused_tokens", stats.reused_tokens as f64),
            ("prefilled_tokens", stats.prefilled_tokens as f64),
        ]
    }

    fn counts_own_window(&self) -> bool {
        true
    }
}

/// The environment's action for a sampled reply: its words and `<eos>` when it ended with the
/// stop token, nothing (the window ran out: an overflow) when it did not. A reply that does not
/// read as an action (impossible under the grammar) is counted in `unusable` and acts as `<eos>`.
pub fn action_of(form: &TextForm, stop: u32, sampled: &[u32], unusable: &AtomicUsize) -> Vec<Tok> {
    let Some((&last, reply)) = sampled.split_last() else { return vec![] };
    if last != stop {
        return vec![];
    }
    let mut action =
        form.tokenizer.decode(reply, false).ok().and_then(|text| parse_reply(form.episode.vocab(), &text).ok()).unwrap_or_else(|| {
            unusable.fetch_add(1, Ordering::Relaxed);
            vec![]
        });
    action.push(EOS);
    action
}

/// What the model is asked for a node: its tokens so far and `fed`, with what is left of the
/// window for the reply; `None` when nothing is fed or the window is already full (an overflow).
fn sample_request(r: &Request, fed: &[u32], window: usize) -> Option<SampleRequest> {
    let used = r.model_context.len() + fed.len();
    (!fed.is_empty() && used < window).then(|| SampleRequest {
        context: [r.model_context.as_slice(), fed].concat(),
        max_new_tokens: window - used,
        seed: r.seed,
        recursive: r.mode.is_recursive(),
    })
}

fn note_failure(e: &anyhow::Error) {
    static SHOWN: std::sync::Once = std::sync::Once::new();
    SHOWN.call_once(|| eprintln!("policy: text: {e:#} (the node ends; further failures are not shown)"));
}

/// The scripted expert's actions in a language model's tokens, decoded through that model
/// (teacher forcing, `Policy::force`): the expert's behaviour at the text window — its turns
/// rendered and counted exactly as the model's own would be — and at the model's compute cost.
/// What `policy: paced_expert` is for a checkpoint that acts in text: the ceiling of a text table.
pub struct TextPacedExpert {
    expert: Arc<dyn rao_agent::Policy>,
    policy: Arc<Policy>,
    form: Arc<TextForm>,
    space: Arc<str>,
    window: usize,
    cache: Arc<Mutex<PrefixCache>>,
}

impl TextPacedExpert {
    /// The same expert with a prefix cache of `bytes`.
    pub fn with_prefix_cache(mut self, bytes: usize) -> Self {
        self.cache = Arc::new(Mutex::new(PrefixCache::new(bytes)));
        self
    }

    pub fn new(
        expert: Arc<dyn rao_agent::Policy>,
        policy: Arc<Policy>,
        tokenizer: Arc<TextTokenizer>,
        episode: Arc<dyn Episode>,
        window: usize,
    ) -> anyhow::Result<Self> {
        let stop = *policy.stop_tokens.first().ok_or_else(|| anyhow::anyhow!("the model has no stop token"))?;
        Ok(TextPacedExpert {
            space: token_space(&tokenizer).into(),
            form: Arc::new(TextForm::new(tokenizer, episode, stop)?),
            expert,
            policy,
            window,
            cache: Arc::default(),
        })
    }
}

impl rao_agent::Policy for TextPacedExpert {
    fn act(&self, batch: Vec<Request>) -> BoxFuture<'_, Vec<Response>> {
        Box::pin(async move {
            let mut reqs = Vec::new();
            let mut replies = Vec::new();
            let mut rows: Vec<Option<(usize, Vec<u32>)>> = Vec::with_capacity(batch.len());
            let actions = self.expert.act(batch.clone()).await;
            for (r, action) in batch.iter().zip(&actions) {
                let fed = self.form.to_feed(&r.context, r.model_context.is_empty());
                let reply = self.form.reply(&action.tokens);
                let (Ok(fed), Ok(reply)) = (fed, reply) else {
                    rows.push(None);
                    continue;
                };
                let Some(req) = sample_request(r, &fed, self.window) else {
                    rows.push(None);
                    continue;
                };
                rows.push(Some((reqs.len(), fed.clone())));
                reqs.push(req);
                replies.push(reply);
            }
            let (policy, cache) = (self.policy.clone(), self.cache.clone());
            let forced = tokio::task::spawn_blocking(move || {
                let mut cache = cache.lock();
                policy.force_cached(&reqs, &replies, &mut cache)
            })
            .await
            .expect("forced decoding panicked");
            rows.into_iter()
                .zip(actions)
                .map(|(row, action)| {
                    let Some((i, fed)) = row else {
                        let none = ModelTokens { space: self.space.clone(), ..Default::default() };
                        return Response { tokens: vec![], logprobs: vec![], model: Some(none) };
                    };
                    let (sampled, logprobs) = forced[i].clone();
                    // The window ran out before the reply's stop token: an overflow.
                    let fits = sampled.last() == self.policy.stop_tokens.first();
                    let tokens = if fits { action.tokens } else { vec![] };
                    Response {
                        logprobs: vec![0.0; tokens.len()],
                        tokens,
                        model: Some(ModelTokens { space: self.space.clone(), fed, sampled, logprobs }),
                    }
                })
                .collect()
        })
    }

    fn counts_own_window(&self) -> bool {
        true
    }
}
