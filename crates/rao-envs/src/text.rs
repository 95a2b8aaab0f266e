//! Environments in text, for language models: a node's context as a chat conversation (the
//! environment's instructions, the goal, then each action as the assistant's turn and each
//! observation as the user's), and a model's reply read back as an action. One definition serves
//! both forms: the text is the environment's own words, so a text action parses to exactly the
//! tokens the compact policy would have produced, and back.

use crate::env::Episode;
use crate::node::NodeView;
use crate::vocab::{BOS, EOS, OBS, PAD, Tok, Vocab};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

/// One chat message, as OpenAI-compatible APIs and chat templates take it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    fn new(role: Role, content: String) -> Self {
        Message { role, content }
    }
}

/// Tokens as text: the words separated by spaces, markers (`<bos>`, `<eos>`, `<obs>`) left out.
pub fn words(vocab: &Vocab, toks: &[Tok]) -> String {
    toks.iter().filter(|&&t| !matches!(t, PAD | BOS | EOS | OBS)).map(|&t| vocab.word(t)).collect::<Vec<_>>().join(" ")
}

/// A node's context as a conversation, or `None` if it is not one (no prompt).
pub fn conversation(episode: &dyn Episode, ctx: &[Tok]) -> Option<Vec<Message>> {
    let NodeView { recursive, depth, goal, turns } = episode.view(ctx)?;
    let vocab = episode.vocab();
    let mut out = vec![
        Message::new(Role::System, episode.instructions(recursive)),
        Message::new(Role::User, format!("Goal: {}\n(You are at depth {depth}.)", words(vocab, &goal))),
    ];
    for (action, observation) in turns {
        out.push(Message::new(Role::Assistant, words(vocab, &action)));
        if !observation.is_empty() {
            out.push(Message::new(Role::User, words(vocab, &observation)));
        }
    }
    Some(out)
}

/// A node's context read back from its conversation, and whether the node acts recursively
/// (which instructions its system message gave).
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationContext {
    pub tokens: Vec<Tok>,
    pub recursive: bool,
}

/// The node context a conversation of this environment stands for: the inverse of
/// [`conversation`], checked by rendering it back. Anything else is refused saying which message
/// differs, what this environment would show there and what the request has.
pub fn context_of(episode: &dyn Episode, messages: &[Message]) -> Result<ConversationContext, String> {
    let [system, first, rest @ ..] = messages else {
        return Err(format!(
            "a conversation starts with two messages, the environment's instructions (role `system`) and the goal \
             (role `user`, `{GOAL_LAYOUT}`); the request has {} message(s)",
            messages.len()
        ));
    };
    let recursive = instructions_of(episode, system)?;
    if first.role != Role::User {
        return Err(format!("message 1 is the goal, role `user`; the request's has role `{}`", first.role.name()));
    }
    let layout = || format!("message 1 is the goal as `{GOAL_LAYOUT}`; the request has {}", quoted(&first.content));
    let goal_text = first.content.strip_prefix("Goal: ").ok_or_else(layout)?;
    let (goal_words, depth) = goal_text.split_once("\n(You are at depth ").ok_or_else(layout)?;
    let depth: u32 = depth.strip_suffix(".)").and_then(|d| d.parse().ok()).ok_or_else(layout)?;
    let ids = |at: usize, text: &str| {
        word_ids(episode.vocab(), text).map_err(|e| match e {
            ReplyError::UnknownWord(_) => format!("message {at}: {e} (`GET /v1/environment` lists its words)"),
            ReplyError::Empty => format!("message {at}: {e}"),
        })
    };
    let mut ctx = episode.prompt(&ids(1, goal_words)?, depth, recursive);
    for (at, m) in rest.iter().enumerate().map(|(i, m)| (i + 2, m)) {
        match m.role {
            Role::Assistant => {
                ctx.extend(ids(at, &m.content)?);
                ctx.push(EOS);
            }
            Role::User => {
                ctx.push(OBS);
                ctx.extend(ids(at, &m.content)?);
            }
            Role::System => return Err(format!("message {at}: only message 0 is the system's")),
        }
    }
    let back = conversation(episode, &ctx).ok_or("not a conversation of this environment")?;
    match back.iter().zip(messages).position(|(a, b)| a != b) {
        None if back.len() == messages.len() => Ok(ConversationContext { tokens: ctx, recursive }),
        Some(at) => Err(format!(
            "message {at} is not what this environment would show there: it would show {} (role `{}`), the request has {} \
             (role `{}`)",
            quoted(&back[at].content),
            back[at].role.name(),
            quoted(&messages[at].content),
            messages[at].role.name()
        )),
        None if back.len() > messages.len() => Err(format!(
            "the conversation ends at message {}: this environment would show {} (role `{}`) after it",
            messages.len() - 1,
            quoted(&back[messages.len()].content),
            back[messages.len()].role.name()
        )),
        None => Err(format!("message {}: this environment shows no message there", back.len())),
    }
}

/// How a goal message reads (`GOAL` the goal's words, `D` the agent's depth, 0 for a root agent).
pub const GOAL_LAYOUT: &str = "Goal: GOAL\n(You are at depth D.)";

/// Which instructions a system message gives: recursive (`true`) or flat, or why it gives neither.
fn instructions_of(episode: &dyn Episode, system: &Message) -> Result<bool, String> {
    if system.role != Role::System {
        return Err(format!("message 0 is the environment's instructions, role `system`; the request's has role `{}`", system.role.name()));
    }
    let (recursive, flat) = (episode.instructions(true), episode.instructions(false));
    if system.content == recursive {
        return Ok(true);
    }
    if system.content == flat {
        return Ok(false);
    }
    // Say where it leaves the instructions it follows longest.
    let common = |a: &str| a.chars().zip(system.content.chars()).take_while(|(x, y)| x == y).count();
    let (name, want) = if common(&flat) > common(&recursive) { ("flat", &flat) } else { ("recursive", &recursive) };
    let at = common(want);
    Err(format!(
        "message 0 is not this environment's instructions (recursive or flat, word for word: `GET /v1/environment` gives \
         both); it leaves the {name} ones at character {at}: they go on {}, the request has {}",
        quoted(&want.chars().skip(at).collect::<String>()),
        quoted(&system.content.chars().skip(at).collect::<String>())
    ))
}

/// Text quoted for an error, cut after 80 characters.
fn quoted(text: &str) -> String {
    const MAX: usize = 80;
    let cut: String = text.chars().take(MAX).collect();
    let more = if text.chars().count() > MAX { "…" } else { "" };
    format!("{:?}", cut + more)
}

impl Role {
    /// The role's name in chat APIs.
    pub fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// Why a reply is not an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    Empty,
    /// A word the environment does not know (quoted as the reply wrote it).
    UnknownWord(String),
}

impl std::fmt::Display for ReplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplyError::Empty => write!(f, "the reply holds no action"),
            ReplyError::UnknownWord(w) => write!(f, "`{w}` is not a word of this environment"),
        }
    }
}

/// A model's reply as an action (without `<eos>`): its first line with words, words separated by
/// spaces (a comma may touch the word before it). What chat models wrap an answer in is set
/// aside: code-fence lines, backticks or quotes around the action, an `Action:` label. Whether
/// the words make a valid action is the environment's to say, as for any action.
pub fn parse_reply(vocab: &Vocab, reply: &str) -> Result<Vec<Tok>, ReplyError> {
    let line = reply
        .lines()
        .map(|l| l.trim())
        .filter(|l| !l.starts_with("```"))
        .map(|l| l.strip_prefix("Action:").or_else(|| l.strip_prefix("action:")).unwrap_or(l))
        .map(|l| l.trim().trim_matches(|c| c == '`' || c == '"' || c == '\'').trim())
        .find(|l| !l.is_empty())
        .ok_or(ReplyError::Empty)?;
    word_ids(vocab, line)
}

/// The tokens of environment words separated by spaces (a comma may touch the word before it);
/// markers such as `<eos>` are not words.
fn word_ids(vocab: &Vocab, text: &str) -> Result<Vec<Tok>, ReplyError> {
    text.replace(',', " , ")
        .split_whitespace()
        .map(|w| vocab.get(w).filter(|t| !matches!(*t, PAD | BOS | EOS | OBS)).ok_or_else(|| ReplyError::UnknownWord(w.to_string())))
        .collect()
}

/// What the instructions of every environment say about sub-agents and refusals.
pub fn recursion_help(recursive: bool, launch: &str) -> String {
    if recursive {
        format!(
            "You may delegate: {launch} Each sub-agent is a copy of you that starts fresh with only its own goal, \
             works while you wait, and reports back when it finishes. A launch is refused with `err depth`, \
             `err children`, `err nodes` (too deep, too many children, too many agents in all) or `err self` \
             (a sub-agent with your own goal)."
        )
    } else {
        "You work alone: there are no sub-agents.".to_string()
    }
}

/// The reply format, the same for every environment.
pub const REPLY_FORMAT: &str = "Reply with exactly one action on one line and nothing else. Write words and \
numbers exactly as shown, separated by single spaces; numbers are written digit by digit (twelve is `1 2`). \
An action that does not parse is answered with `err syntax`.";
