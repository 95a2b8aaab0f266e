//! Long-document aggregation (Oolong-style): a seeded session transcript several times larger
//! than the context window, and a question about the whole of it ("how many times did alice
//! roll?"). The document is not in the context: like a variable in a REPL it stays in the
//! environment, and a node reads slices of it (`read START COUNT`: the lines, then the question
//! again), splits its range among children who answer the same question on their slice
//! (`split K`), and answers with a number or with the sum of its children's answers
//! (`answer sum`). Numeric answers score 0.75^|error|.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::env::{Episode, Refusal, Step, StepOutput};
use crate::grammar::{Grammar, lark_choice};
use crate::node::{self, DIGITS, fixed_number, mode_and_depth_words, parse_node, prompt, read_fixed};
use crate::rng::Rng;
use crate::text;
use crate::vocab::{EOS, OBS, Tok, Vocab};

pub const SPEAKERS: [&str; 8] = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"];
pub const SPELLS: [&str; 8] = ["fireball", "heal", "shield", "bolt", "charm", "light", "frost", "haste"];
pub const FILLER: [&str; 6] = ["hmm", "yes", "no", "wait", "right", "nice"];
pub const LANGUAGE: &[&str] = &[
    "read", "split", "answer", "sum", "count", "anyone", "anything", "rolls", "casts", "says", "got", "none", "err", "syntax", "range",
    "depth", "children", "nodes", "self",
];
/// Digits of every number in an action or goal (line offsets and counts below 1000).
pub const WIDTH: usize = 3;
/// Tokens per document line (`SPEAKER VERB WORD`).
pub const LINE_TOKENS: usize = 3;
/// Tokens of a question (`WHO VERB WHAT`), which also ends every `read` observation.
pub const QUESTION_TOKENS: usize = 3;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DocConfig {
    pub speakers: usize,
    pub spells: usize,
    pub min_lines: u32,
    pub max_lines: u32,
    /// Draw each document's answer uniformly from 0..=min(lines, 10) and place that many
    /// matching lines among non-matching ones (instead of lines drawn independently, whose
    /// counts cluster at the likeliest value): short documents that teach counting itself.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub balanced_counts: bool,
}

impl Default for DocConfig {
    /// 160–320 lines: 480–960 tokens of document for a 96-token window.
    fn default() -> Self {
        DocConfig { speakers: 6, spells: 6, min_lines: 160, max_lines: 320, balanced_counts: false }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum Line {
    Roll { speaker: u8, value: u8 },
    Cast { speaker: u8, spell: u8 },
    Say { speaker: u8, word: u8 },
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum Verb {
    Rolls,
    Casts,
}

/// "How many lines where WHO VERB WHAT?" (`None`: anyone / anything).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Question {
    pub who: Option<u8>,
    pub verb: Verb,
    pub what: Option<u8>,
}

impl Question {
    pub fn matches(&self, line: &Line) -> bool {
        let (speaker, what) = match (self.verb, line) {
            (Verb::Rolls, Line::Roll { speaker, value }) => (*speaker, *value),
            (Verb::Casts, Line::Cast { speaker, spell }) => (*speaker, *spell),
            _ => return false,
        };
        self.who.is_none_or(|w| w == speaker) && self.what.is_none_or(|w| w == what)
    }

    pub fn count(&self, lines: &[Line]) -> u64 {
        lines.iter().filter(|l| self.matches(l)).count() as u64
    }
}

/// One task: a document and a question over all of it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DocTask {
    pub id: String,
    pub lines: Vec<Line>,
    pub question: Question,
    pub validation: bool,
}

/// The environment's vocabulary and action language.
#[derive(Debug, Clone)]
pub struct Lang {
    pub vocab: Vocab,
    pub config: DocConfig,
}

/// A decoded action.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Read { start: u64, count: u64 },
    Split(u64),
    AnswerSum,
    Answer(u64),
}

impl Lang {
    pub fn new(config: &DocConfig) -> Lang {
        assert!(config.speakers <= SPEAKERS.len() && config.spells <= SPELLS.len() && config.max_lines < 1000);
        let mut words: Vec<String> = mode_and_depth_words();
        words.extend(LANGUAGE.iter().chain(&DIGITS).map(|s| s.to_string()));
        words.extend(SPEAKERS[..config.speakers].iter().chain(&SPELLS[..config.spells]).chain(&FILLER).map(|s| s.to_string()));
        Lang { vocab: Vocab::new(words.iter().map(|s| s.as_str())), config: config.clone() }
    }

    fn t(&self, w: &str) -> Tok {
        self.vocab.id(w)
    }

    /// Interchangeable names: speakers, spells, filler words.
    pub fn name_groups(&self) -> Vec<Vec<Tok>> {
        let ids = |words: &[&str]| words.iter().map(|w| self.t(w)).collect();
        vec![ids(&SPEAKERS[..self.config.speakers]), ids(&SPELLS[..self.config.spells]), ids(&FILLER)]
    }

    pub fn verbs(&self) -> [Tok; 3] {
        [self.t("read"), self.t("split"), self.t("answer")]
    }

    pub fn line(&self, l: &Line) -> [Tok; LINE_TOKENS] {
        match *l {
            Line::Roll { speaker, value } => [self.t(SPEAKERS[speaker as usize]), self.t("rolls"), self.t(DIGITS[value as usize])],
            Line::Cast { speaker, spell } => [self.t(SPEAKERS[speaker as usize]), self.t("casts"), self.t(SPELLS[spell as usize])],
            Line::Say { speaker, word } => [self.t(SPEAKERS[speaker as usize]), self.t("says"), self.t(FILLER[word as usize])],
        }
    }

    /// Decode one line of a `read` observation.
    pub fn parse_line(&self, toks: &[Tok]) -> Option<Line> {
        let speaker = SPEAKERS.iter().position(|s| self.vocab.get(s) == Some(toks[0]))? as u8;
        let w = self.vocab.word(toks[2]);
        match self.vocab.word(toks[1]) {
            "rolls" => Some(Line::Roll { speaker, value: w.parse().ok()? }),
            "casts" => Some(Line::Cast { speaker, spell: SPELLS.iter().position(|s| *s == w)? as u8 }),
            "says" => Some(Line::Say { speaker, word: FILLER.iter().position(|s| *s == w)? as u8 }),
            _ => None,
        }
    }

    /// `count WHO VERB WHAT START COUNT`.
    pub fn goal(&self, q: &Question, start: u64, count: u64) -> Vec<Tok> {
        let who = q.who.map(|w| SPEAKERS[w as usize]).unwrap_or("anyone");
        let (verb, what) = match q.verb {
            Verb::Rolls => ("rolls", q.what.map(|w| DIGITS[w as usize]).unwrap_or("anything")),
            Verb::Casts => ("casts", q.what.map(|w| SPELLS[w as usize]).unwrap_or("anything")),
        };
        let mut g = vec![self.t("count"), self.t(who), self.t(verb), self.t(what)];
        g.extend(fixed_number(&self.vocab, start, WIDTH));
        g.extend(fixed_number(&self.vocab, count, WIDTH));
        g
    }

    pub fn parse_goal(&self, g: &[Tok]) -> Option<(Question, u64, u64)> {
        if g.len() != 4 + 2 * WIDTH || g[0] != self.t("count") {
            return None;
        }
        let who = match self.vocab.word(g[1]) {
            "anyone" => None,
            w => Some(SPEAKERS.iter().position(|s| *s == w)? as u8),
        };
        let verb = match self.vocab.word(g[2]) {
            "rolls" => Verb::Rolls,
            "casts" => Verb::Casts,
            _ => return None,
        };
        let what = match (verb, self.vocab.word(g[3])) {
            (_, "anything") => None,
            (Verb::Rolls, w) => Some(w.parse::<u8>().ok().filter(|d| *d < 10)?),
            (Verb::Casts, w) => Some(SPELLS.iter().position(|s| *s == w)? as u8),
        };
        let start = read_fixed(&self.vocab, &g[4..], WIDTH)?;
        let count = read_fixed(&self.vocab, &g[4 + WIDTH..], WIDTH)?;
        Some((Question { who, verb, what }, start, count))
    }

    pub fn encode(&self, a: &Action) -> Vec<Tok> {
        let n = |x: u64| fixed_number(&self.vocab, x, WIDTH);
        match *a {
            Action::Read { start, count } => [vec![self.t("read")], n(start), n(count)].concat(),
            Action::Split(k) => vec![self.t("split"), self.t(DIGITS[k as usize])],
            Action::AnswerSum => vec![self.t("answer"), self.t("sum")],
            Action::Answer(x) => [vec![self.t("answer")], n(x)].concat(),
        }
    }

    pub fn parse(&self, a: &[Tok]) -> Option<Action> {
        let (&verb, rest) = a.split_first()?;
        match self.vocab.word(verb) {
            "read" if rest.len() == 2 * WIDTH => {
                Some(Action::Read { start: read_fixed(&self.vocab, rest, WIDTH)?, count: read_fixed(&self.vocab, &rest[WIDTH..], WIDTH)? })
            }
            "split" if rest.len() == 1 => Some(Action::Split(self.vocab.digit_value(rest[0])?)),
            "answer" if rest == [self.t("sum")] => Some(Action::AnswerSum),
            "answer" if rest.len() == WIDTH => Some(Action::Answer(read_fixed(&self.vocab, rest, WIDTH)?)),
            _ => None,
        }
    }

    fn obs(&self, words: &[&str]) -> Vec<Tok> {
        std::iter::once(OBS).chain(words.iter().map(|w| self.t(w))).collect()
    }
}

/// Draw `n` tasks: each its own document and question.
pub fn synthesize(config: &DocConfig, n: usize, validation: bool, seed: u64) -> Vec<DocTask> {
    let mut rng = Rng::derive(seed, if validation { "longdoc/validation" } else { "longdoc/train" });
    (0..n)
        .map(|i| {
            let len = rng.range(config.min_lines as u64, config.max_lines as u64) as usize;
            let (lines, question) = if config.balanced_counts {
                let question = draw_question(config, &mut rng);
                (balanced_lines(config, &question, len, &mut rng), question)
            } else {
                let lines: Vec<Line> = (0..len).map(|_| draw_line(config, &mut rng)).collect();
                (lines, draw_question(config, &mut rng))
            };
            let id = format!("doc-{}{i}", if validation { "v" } else { "t" });
            DocTask { id, lines, question, validation }
        })
        .collect()
}

fn draw_line(config: &DocConfig, rng: &mut Rng) -> Line {
    let speaker = rng.below(config.speakers) as u8;
    match rng.below(10) {
        0..4 => Line::Roll { speaker, value: rng.below(10) as u8 },
        4..7 => Line::Cast { speaker, spell: rng.below(config.spells) as u8 },
        _ => Line::Say { speaker, word: rng.below(FILLER.len()) as u8 },
    }
}

/// Questions whose answers are tens, not zero or one: guessing small scores little.
fn draw_question(config: &DocConfig, rng: &mut Rng) -> Question {
    match rng.below(3) {
        0 => Question { who: Some(rng.below(config.speakers) as u8), verb: Verb::Rolls, what: None },
        1 => Question { who: None, verb: Verb::Casts, what: Some(rng.below(config.spells) as u8) },
        _ => Question { who: None, verb: Verb::Rolls, what: Some(rng.below(10) as u8) },
    }
}

/// `len` lines of which exactly k (uniform in 0..=min(len, 10)) match `q`, at random places.
fn balanced_lines(config: &DocConfig, q: &Question, len: usize, rng: &mut Rng) -> Vec<Line> {
    let k = rng.below(len.min(10) + 1);
    let mut lines: Vec<Line> = (0..len)
        .map(|_| {
            loop {
                let l = draw_line(config, rng);
                if !q.matches(&l) {
                    break l;
                }
            }
        })
        .collect();
    let mut places: Vec<usize> = (0..len).collect();
    rng.shuffle(&mut places);
    for &at in &places[..k] {
        let speaker = q.who.unwrap_or_else(|| rng.below(config.speakers) as u8);
        lines[at] = match q.verb {
            Verb::Rolls => Line::Roll { speaker, value: q.what.unwrap_or_else(|| rng.below(10) as u8) },
            Verb::Casts => Line::Cast { speaker, spell: q.what.expect("cast questions name a spell") },
        };
    }
    lines
}

/// The numeric score of an answer: 0.75^|error|.
pub fn score(answer: u64, exact: u64) -> f64 {
    0.75f64.powi(answer.abs_diff(exact).min(1000) as i32)
}

pub struct LongDocEpisode {
    pub lang: Arc<Lang>,
    pub task: DocTask,
}

impl LongDocEpisode {
    pub fn new(lang: Arc<Lang>, task: DocTask) -> Self {
        LongDocEpisode { lang, task }
    }
}

impl Episode for LongDocEpisode {
    fn vocab(&self) -> &Vocab {
        &self.lang.vocab
    }

    fn root_goal(&self) -> Vec<Tok> {
        self.lang.goal(&self.task.question, 0, self.task.lines.len() as u64)
    }

    fn prompt(&self, goal: &[Tok], depth: u32, recursive: bool) -> Vec<Tok> {
        prompt(&self.lang.vocab, goal, depth, recursive)
    }

    fn view(&self, ctx: &[Tok]) -> Option<node::NodeView> {
        parse_node(&self.lang.vocab, ctx, &self.lang.verbs())
    }

    fn instructions(&self, recursive: bool) -> String {
        let launch = "`split K` (K a digit, 2 or more) divides your lines into K equal ranges and launches one \
                      sub-agent per range with your question; each reports `got N` (its count, three digits) or \
                      `got none`. `answer sum` then answers the sum of their counts.";
        format!(
            "You answer questions about a long transcript that stays outside your context. Each line is \
             `SPEAKER rolls DIGIT`, `SPEAKER casts SPELL` or `SPEAKER says WORD`. Your goal `count WHO VERB WHAT START COUNT` \
             asks how many of the COUNT lines from line START on match `WHO VERB WHAT` (`anyone` and `anything` match \
             every speaker or object); START and COUNT are three digits each (`0 4 0` is forty).\n\
             Actions:\n\
             - `read START COUNT`: those lines (within your range; `err range` otherwise), then the question again.\n\
             - `answer N`: you are done; N is your count, three digits.\n\
             {}\n{}",
            text::recursion_help(recursive, launch),
            text::REPLY_FORMAT
        )
    }

    fn step(&self, goal: &[Tok], action: &[Tok], recursive: bool) -> StepOutput {
        self.step_with_results(goal, action, recursive, &[])
    }

    fn step_with_results(&self, goal: &[Tok], action: &[Tok], recursive: bool, children: &[Option<String>]) -> StepOutput {
        let lang = &self.lang;
        let Some((q, start, count)) = lang.parse_goal(goal) else { return StepOutput::observe(lang.obs(&["err", "syntax"])) };
        let finish = |n: u64| StepOutput { step: Step::Finish, counters: vec![], result: Some(n.to_string()) };
        match lang.parse(action) {
            None => StepOutput::observe(lang.obs(&["err", "syntax"])),
            Some(Action::Read { start: s, count: c }) => {
                if c == 0 || s < start || s + c > start + count {
                    return StepOutput::observe(lang.obs(&["err", "range"]));
                }
                let mut obs = vec![OBS];
                for l in &self.task.lines[s as usize..(s + c) as usize] {
                    obs.extend(lang.line(l));
                }
                // The question again, right before the reader answers: what to count sits next
                // to the lines (a small model counts "lines like the last three tokens" far more
                // easily than it recalls a question from the top of its context).
                obs.extend(&goal[1..1 + QUESTION_TOKENS]);
                StepOutput::observe(obs)
            }
            Some(Action::Split(k)) => {
                if !recursive {
                    return StepOutput::observe(self.refusal(Refusal::NotRecursive));
                }
                if k < 2 || k > count {
                    return StepOutput::observe(lang.obs(&["err", "range"]));
                }
                let goals = slices(start, count, k).into_iter().map(|(s, c)| lang.goal(&q, s, c)).collect();
                StepOutput { step: Step::Spawn(goals), counters: vec![], result: None }
            }
            Some(Action::AnswerSum) => finish(children.iter().map(|r| r.as_deref().and_then(|x| x.parse::<u64>().ok()).unwrap_or(0)).sum()),
            Some(Action::Answer(n)) => finish(n),
        }
    }

    fn receipt(&self, _score: f64, result: Option<&str>) -> Vec<Tok> {
        let v = &self.lang.vocab;
        match result.and_then(|r| r.parse::<u64>().ok()) {
            Some(n) => [vec![v.id("got")], fixed_number(v, n.min(999), WIDTH)].concat(),
            None => vec![v.id("got"), v.id("none")],
        }
    }

    fn refusal(&self, why: Refusal) -> Vec<Tok> {
        node::refusal(&self.lang.vocab, why)
    }

    /// 0.75^|answer − exact count over the node's own slice|; 0 without an answer.
    fn verify(&self, goal: &[Tok], finished: bool, result: Option<&str>, _subtree: &BTreeMap<String, i64>) -> f64 {
        let Some((q, start, count)) = self.lang.parse_goal(goal) else { return 0.0 };
        let end = ((start + count) as usize).min(self.task.lines.len());
        let exact = q.count(&self.task.lines[(start as usize).min(end)..end]);
        match (finished, result.and_then(|r| r.parse::<u64>().ok())) {
            (true, Some(answer)) => score(answer, exact),
            _ => 0.0,
        }
    }
}

/// `count` lines from `start` cut into `k` consecutive slices whose sizes differ by at most one.
pub fn slices(start: u64, count: u64, k: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut s = start;
    for i in 0..k {
        let c = count / k + u64::from(i < count % k);
        out.push((s, c));
        s += c;
    }
    out
}

/// Constrained decoding for the action language.
pub struct LongDocGrammar {
    lang: Arc<Lang>,
    max_children: u64,
}

impl LongDocGrammar {
    pub fn new(lang: Arc<Lang>, max_children: usize) -> Self {
        LongDocGrammar { lang, max_children: (max_children as u64).clamp(2, 9) }
    }
}

impl Grammar for LongDocGrammar {
    fn lark(&self, recursive: bool) -> Option<String> {
        // Fixed-width numbers, digit by digit: `read` takes two, `answer` one (or `sum`).
        let mut action =
            vec![format!(r#""read" (" " DIGIT){{{}}}"#, 2 * WIDTH), format!(r#""answer sum" | "answer" (" " DIGIT){{{WIDTH}}}"#)];
        if recursive {
            action.push(format!(r#""split " ({})"#, lark_choice(&DIGITS[2..=self.max_children as usize])));
        }
        Some(format!("start: ACTION\nACTION: {}\nDIGIT: {}\n", action.join(" | "), lark_choice(&DIGITS)))
    }

    fn allowed(&self, recursive: bool, _context: &[Tok], prefix: &[Tok]) -> Vec<Tok> {
        let v = &self.lang.vocab;
        let digits = || DIGITS.iter().map(|d| v.id(d)).collect::<Vec<_>>();
        let Some((&verb, rest)) = prefix.split_first() else {
            let mut first = vec![v.id("read"), v.id("answer")];
            if recursive {
                first.push(v.id("split"));
            }
            return first;
        };
        match (v.word(verb), rest.len()) {
            ("read", n) if n < 2 * WIDTH => digits(),
            ("split", 0) => (2..=self.max_children).map(|k| v.id(DIGITS[k as usize])).collect(),
            ("answer", 0) => [vec![v.id("sum")], digits()].concat(),
            ("answer", n) if n < WIDTH && rest[0] != v.id("sum") => digits(),
            _ => vec![EOS],
        }
    }
}

/// How the scripted expert behaves.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DocExpertConfig {
    /// Deepest level at which a node may still split.
    pub max_depth: u32,
    pub max_children: u64,
    /// Probability that a node too large to read splits (else it reads what fits and estimates).
    pub delegate: f64,
    /// Probability of a useless one-line read at each step.
    pub noise: f64,
    pub seed: u64,
}

impl Default for DocExpertConfig {
    fn default() -> Self {
        DocExpertConfig { max_depth: 2, max_children: 4, delegate: 1.0, noise: 0.0, seed: 0 }
    }
}

/// The scripted expert's next action for a node, from the node's own context and window.
/// Recursive: read a slice that fits and count; split a larger one into children and add up
/// their answers. Flat (or past the depth cap): read as many lines as fit, then estimate the
/// whole slice's count from the part it saw.
pub fn expert_action(lang: &Lang, cfg: &DocExpertConfig, ctx: &[Tok], window: usize) -> Vec<Tok> {
    let Some(node) = parse_node(&lang.vocab, ctx, &lang.verbs()) else { return lang.encode(&Action::Answer(0)) };
    let Some((q, start, count)) = lang.parse_goal(&node.goal) else { return lang.encode(&Action::Answer(0)) };
    let mut rng = Rng::new(cfg.seed ^ (ctx.len() as u64).wrapping_mul(0x2545_F491_4F6C_DD1D) ^ start << 32 ^ count);
    if node.turns.iter().any(|(a, _)| matches!(lang.parse(a), Some(Action::Split(_)))) {
        return lang.encode(&Action::AnswerSum);
    }
    // Lines read so far (each `read` observation is whole lines).
    let (mut seen, mut matched) = (0u64, 0u64);
    let mut next = start;
    for (a, obs) in &node.turns {
        if let (Some(Action::Read { start: s, count: c }), Some((&OBS, body))) = (lang.parse(a), obs.split_first()) {
            // Only reads that continue where the last one stopped count (noise reads do not).
            if s == next && body.len() == c as usize * LINE_TOKENS + QUESTION_TOKENS {
                seen += c;
                matched += body[..c as usize * LINE_TOKENS]
                    .chunks(LINE_TOKENS)
                    .filter_map(|l| lang.parse_line(l))
                    .filter(|l| q.matches(l))
                    .count() as u64;
                next = s + c;
            }
        }
    }
    let remaining = start + count - next.min(start + count);
    if remaining == 0 {
        return lang.encode(&Action::Answer(matched));
    }
    // Room for the next read: its action, its observation and the final answer.
    let used = ctx.len();
    let answer_cost = 1 + WIDTH + 1;
    let read_cost = 1 + 2 * WIDTH + 1 + 1 + QUESTION_TOKENS;
    let fits = window.saturating_sub(used + answer_cost + read_cost) / LINE_TOKENS;
    if node.turns.is_empty() && count as usize > fits && node.recursive && node.depth < cfg.max_depth && rng.chance(cfg.delegate) {
        let k = count.div_ceil(fits.max(1) as u64).clamp(2, cfg.max_children).min(count);
        return lang.encode(&Action::Split(k));
    }
    if cfg.noise > 0.0 && rng.chance(cfg.noise) && fits > 1 {
        return lang.encode(&Action::Read { start: start + rng.below(count as usize) as u64, count: 1 });
    }
    if fits == 0 {
        // Out of room: estimate the whole slice from the part seen.
        let estimate = if seen == 0 { 0 } else { (matched as f64 * count as f64 / seen as f64).round() as u64 };
        return lang.encode(&Action::Answer(estimate.min(999)));
    }
    lang.encode(&Action::Read { start: next, count: remaining.min(fits as u64) })
}
