//! Multi-hop search (DeepDive-style): a seeded knowledge graph of entities and typed relations,
//! and chain questions — "the R3 of the R2 of the R1 of E", 2 to 6 hops. `search E R` returns a
//! page with the fact buried among distractor facts (every hop costs many context tokens), `spawn`
//! hands a sub-chain to a child whose answer comes back in its receipt, `answer X` ends the node.
//! Each hop needs the previous one's answer: recursion cannot parallelise here, it only keeps
//! each node's context small.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::env::{Episode, Refusal, Step, StepOutput};
use crate::grammar::{Grammar, lark_choice, lark_up_to};
use crate::node::{self, mode_and_depth_words, parse_node, prompt};
use crate::rng::Rng;
use crate::text;
use crate::vocab::{EOS, OBS, Tok, Vocab};

pub const RELATIONS: [&str; 8] = ["mentor", "rival", "sibling", "employer", "neighbor", "friend", "partner", "teacher"];
pub const LANGUAGE: &[&str] = &["search", "spawn", "answer", "got", "none", "err", "syntax", "depth", "children", "nodes", "self"];
/// Tokens per fact on a page (`SUBJECT RELATION OBJECT`).
pub const FACT_TOKENS: usize = 3;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GraphConfig {
    pub entities: usize,
    pub relations: usize,
    /// Distractor facts on every page besides the one asked for: the entity's other relations
    /// (at most `relations - 1`).
    pub distractors: usize,
}

impl Default for GraphConfig {
    /// A page is 1 + 3·8 + 2 = 27 tokens: at a 96-token window a flat agent holds two hops, not three.
    fn default() -> Self {
        GraphConfig { entities: 48, relations: 8, distractors: 7 }
    }
}

/// The knowledge graph: `edges[entity][relation]` is the related entity.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Graph {
    pub config: GraphConfig,
    pub seed: u64,
    pub names: Vec<String>,
    pub edges: Vec<Vec<u16>>,
}

/// Pronounceable, distinct entity names (`bado`, `kemi`, …), a fixed function of the seed.
fn entity_names(n: usize, rng: &mut Rng) -> Vec<String> {
    let (cons, vows) = ("bdfgklmnprstvz".as_bytes(), "aeiou".as_bytes());
    let mut syllables = Vec::new();
    for &c in cons {
        for &v in vows {
            syllables.push(format!("{}{}", c as char, v as char));
        }
    }
    let mut all: Vec<String> = syllables.iter().flat_map(|a| syllables.iter().map(move |b| format!("{a}{b}"))).collect();
    rng.shuffle(&mut all);
    all.truncate(n);
    all
}

pub fn generate(config: &GraphConfig, seed: u64) -> Graph {
    assert!(config.relations <= RELATIONS.len() && config.distractors < config.relations);
    assert!(config.entities >= 4 && config.entities < 4900);
    let mut rng = Rng::derive(seed, "multihop/graph");
    let names = entity_names(config.entities, &mut rng);
    let edges = (0..config.entities)
        .map(|e| {
            (0..config.relations)
                .map(|_| {
                    let mut o = rng.below(config.entities - 1);
                    if o >= e {
                        o += 1;
                    }
                    o as u16
                })
                .collect()
        })
        .collect();
    Graph { config: config.clone(), seed, names, edges }
}

impl Graph {
    /// Follow `relations` (applied first to last) from `entity`.
    pub fn follow(&self, entity: usize, relations: &[usize]) -> usize {
        relations.iter().fold(entity, |e, &r| self.edges[e][r] as usize)
    }
}

/// One chain question: start entity and relations in the order they apply.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HopTask {
    pub id: String,
    pub entity: usize,
    pub relations: Vec<usize>,
    pub validation: bool,
}

impl HopTask {
    pub fn hops(&self) -> usize {
        self.relations.len()
    }
}

/// `n` questions per hop count in `hops` (inclusive). Validation questions start from the
/// other half of the entities, so their first hops are never seen in training.
pub fn synthesize(graph: &Graph, hops: (usize, usize), n: usize, validation: bool, seed: u64) -> Vec<HopTask> {
    let mut rng = Rng::derive(seed, if validation { "multihop/validation" } else { "multihop/train" });
    let half = graph.config.entities / 2;
    let mut out = Vec::new();
    for k in hops.0..=hops.1 {
        for i in 0..n {
            let entity = if validation { half + rng.below(graph.config.entities - half) } else { rng.below(half) };
            let relations = (0..k).map(|_| rng.below(graph.config.relations)).collect();
            out.push(HopTask { id: format!("hop{k}-{}{i}", if validation { "v" } else { "t" }), entity, relations, validation });
        }
    }
    out
}

/// The vocabulary and action language of one graph.
#[derive(Debug, Clone)]
pub struct Lang {
    pub vocab: Vocab,
    pub graph: Graph,
    first_entity: Tok,
    first_relation: Tok,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Search(usize, usize),
    /// A sub-question: relations in the order they apply, from the entity.
    Spawn(usize, Vec<usize>),
    Answer(usize),
}

impl Lang {
    pub fn new(graph: Graph) -> Lang {
        let mut words: Vec<String> = mode_and_depth_words();
        words.extend(LANGUAGE.iter().map(|s| s.to_string()));
        let mut vocab = Vocab::new(words.iter().map(|s| s.as_str()));
        let first_relation = vocab.len() as Tok;
        for r in &RELATIONS[..graph.config.relations] {
            vocab.add(r);
        }
        let first_entity = vocab.len() as Tok;
        for n in &graph.names {
            vocab.add(n);
        }
        Lang { vocab, graph, first_entity, first_relation }
    }

    pub fn entity(&self, t: Tok) -> Option<usize> {
        (t >= self.first_entity && ((t - self.first_entity) as usize) < self.graph.names.len()).then(|| (t - self.first_entity) as usize)
    }

    pub fn relation(&self, t: Tok) -> Option<usize> {
        (t >= self.first_relation && t < self.first_entity).then(|| (t - self.first_relation) as usize)
    }

    pub fn entity_tok(&self, e: usize) -> Tok {
        self.first_entity + e as Tok
    }

    pub fn relation_tok(&self, r: usize) -> Tok {
        self.first_relation + r as Tok
    }

    /// Interchangeable names: entities, relations.
    pub fn name_groups(&self) -> Vec<Vec<Tok>> {
        vec![
            (0..self.graph.names.len()).map(|e| self.entity_tok(e)).collect(),
            (0..self.graph.config.relations).map(|r| self.relation_tok(r)).collect(),
        ]
    }

    pub fn verbs(&self) -> [Tok; 3] {
        [self.vocab.id("search"), self.vocab.id("spawn"), self.vocab.id("answer")]
    }

    /// `R_k … R_1 E`: the outermost relation first, as the question reads.
    pub fn goal(&self, entity: usize, relations: &[usize]) -> Vec<Tok> {
        relations.iter().rev().map(|&r| self.relation_tok(r)).chain([self.entity_tok(entity)]).collect()
    }

    /// The inverse of [`Lang::goal`]: (entity, relations in the order they apply).
    pub fn parse_goal(&self, g: &[Tok]) -> Option<(usize, Vec<usize>)> {
        let (&last, rels) = g.split_last()?;
        let entity = self.entity(last)?;
        let mut relations: Vec<usize> = rels.iter().map(|&t| self.relation(t)).collect::<Option<_>>()?;
        if relations.is_empty() {
            return None;
        }
        relations.reverse();
        Some((entity, relations))
    }

    pub fn encode(&self, a: &Action) -> Vec<Tok> {
        match a {
            Action::Search(e, r) => vec![self.vocab.id("search"), self.entity_tok(*e), self.relation_tok(*r)],
            Action::Spawn(e, rels) => [vec![self.vocab.id("spawn")], self.goal(*e, rels)].concat(),
            Action::Answer(e) => vec![self.vocab.id("answer"), self.entity_tok(*e)],
        }
    }

    pub fn parse(&self, a: &[Tok]) -> Option<Action> {
        let (&verb, rest) = a.split_first()?;
        match (self.vocab.word(verb), rest) {
            ("search", [e, r]) => Some(Action::Search(self.entity(*e)?, self.relation(*r)?)),
            ("answer", [e]) => Some(Action::Answer(self.entity(*e)?)),
            ("spawn", g) => self.parse_goal(g).map(|(e, rels)| Action::Spawn(e, rels)),
            _ => None,
        }
    }

    /// The page for `search e r`: the entity's page — the fact asked for among `distractors`
    /// other facts about `e`, in an order fixed by the graph's seed and the query — and then the
    /// query itself, `e r`, for the reader to complete: its next action names the object (in
    /// `answer X` or `search X …`), found by matching the relation on the page. Ending on the
    /// query puts it next to where the answer is written, so a two-layer policy can learn the
    /// lookup as an induction step (without it, 1,500 steps of one-hop demonstrations left the
    /// gate at 0.10: the policy could not find the query 28 tokens back).
    pub fn page(&self, e: usize, r: usize) -> Vec<Tok> {
        let g = &self.graph;
        let mut rng = Rng::derive(g.seed ^ ((e as u64) << 8 | r as u64), "multihop/page");
        let mut others: Vec<usize> = (0..g.config.relations).filter(|&o| o != r).collect();
        rng.shuffle(&mut others);
        let mut facts = vec![r];
        facts.extend(others.into_iter().take(g.config.distractors));
        rng.shuffle(&mut facts);
        let mut out = vec![OBS];
        for rel in facts {
            out.extend([self.entity_tok(e), self.relation_tok(rel), self.entity_tok(g.edges[e][rel] as usize)]);
        }
        out.extend([self.entity_tok(e), self.relation_tok(r)]);
        out
    }

    fn obs(&self, words: &[&str]) -> Vec<Tok> {
        std::iter::once(OBS).chain(words.iter().map(|w| self.vocab.id(w))).collect()
    }
}

pub struct MultiHopEpisode {
    pub lang: Arc<Lang>,
    pub task: HopTask,
}

impl MultiHopEpisode {
    pub fn new(lang: Arc<Lang>, task: HopTask) -> Self {
        MultiHopEpisode { lang, task }
    }
}

impl Episode for MultiHopEpisode {
    fn vocab(&self) -> &Vocab {
        &self.lang.vocab
    }

    fn root_goal(&self) -> Vec<Tok> {
        self.lang.goal(self.task.entity, &self.task.relations)
    }

    fn prompt(&self, goal: &[Tok], depth: u32, recursive: bool) -> Vec<Tok> {
        prompt(&self.lang.vocab, goal, depth, recursive)
    }

    fn view(&self, ctx: &[Tok]) -> Option<node::NodeView> {
        parse_node(&self.lang.vocab, ctx, &self.lang.verbs())
    }

    fn instructions(&self, recursive: bool) -> String {
        let launch = "`spawn R_k ... R_1 ENTITY` launches a sub-agent that answers that chain; it reports \
                      `got ENTITY` (its answer) or `got none`.";
        format!(
            "You answer chain questions over a knowledge graph of entities and relations. Your goal \
             `R_k ... R_2 R_1 ENTITY` asks for the R_k of ... of the R_2 of the R_1 of ENTITY.\n\
             Actions:\n\
             - `search ENTITY RELATION`: the entity's page, facts `SUBJECT RELATION OBJECT`, then `ENTITY RELATION` again.\n\
             - `answer ENTITY`: you are done; ENTITY is your answer.\n\
             {}\n{}",
            text::recursion_help(recursive, launch),
            text::REPLY_FORMAT
        )
    }

    fn step(&self, goal: &[Tok], action: &[Tok], recursive: bool) -> StepOutput {
        let lang = &self.lang;
        match lang.parse(action) {
            None => StepOutput::observe(lang.obs(&["err", "syntax"])),
            Some(Action::Search(e, r)) => StepOutput::observe(lang.page(e, r)),
            Some(Action::Answer(e)) => StepOutput { step: Step::Finish, counters: vec![], result: Some(lang.graph.names[e].clone()) },
            Some(Action::Spawn(e, rels)) => {
                if !recursive {
                    return StepOutput::observe(self.refusal(Refusal::NotRecursive));
                }
                let child = lang.goal(e, &rels);
                if child == goal {
                    return StepOutput::observe(self.refusal(Refusal::SelfSpawn));
                }
                StepOutput { step: Step::Spawn(vec![child]), counters: vec![], result: None }
            }
        }
    }

    fn receipt(&self, _score: f64, result: Option<&str>) -> Vec<Tok> {
        let v = &self.lang.vocab;
        vec![v.id("got"), result.and_then(|r| v.get(r)).filter(|&t| self.lang.entity(t).is_some()).unwrap_or(v.id("none"))]
    }

    fn refusal(&self, why: Refusal) -> Vec<Tok> {
        node::refusal(&self.lang.vocab, why)
    }

    /// 1 iff the node answered the true end of its own chain.
    fn verify(&self, goal: &[Tok], finished: bool, result: Option<&str>, _subtree: &BTreeMap<String, i64>) -> f64 {
        let Some((e, rels)) = self.lang.parse_goal(goal) else { return 0.0 };
        let truth = &self.lang.graph.names[self.lang.graph.follow(e, &rels)];
        if finished && result == Some(truth.as_str()) { 1.0 } else { 0.0 }
    }
}

/// Constrained decoding for the action language.
pub struct MultiHopGrammar {
    lang: Arc<Lang>,
    /// Longest sub-question a `spawn` may ask.
    max_hops: usize,
}

impl MultiHopGrammar {
    pub fn new(lang: Arc<Lang>, max_hops: usize) -> Self {
        MultiHopGrammar { lang, max_hops }
    }
}

impl Grammar for MultiHopGrammar {
    fn lark(&self, recursive: bool) -> Option<String> {
        let l = &self.lang;
        let mut action = vec![r#""search " ENTITY " " RELATION"#.to_string(), r#""answer " ENTITY"#.into()];
        if recursive {
            action.push(format!(r#""spawn " RELATION {} " " ENTITY"#, lark_up_to(r#"" " RELATION"#, self.max_hops.max(1) - 1)));
        }
        Some(format!(
            "start: ACTION\nACTION: {}\nRELATION: {}\nENTITY: {}\n",
            action.join(" | "),
            lark_choice(&RELATIONS[..l.graph.config.relations]),
            lark_choice(&l.graph.names)
        ))
    }

    fn allowed(&self, recursive: bool, _context: &[Tok], prefix: &[Tok]) -> Vec<Tok> {
        let l = &self.lang;
        let entities = || (0..l.graph.names.len()).map(|e| l.entity_tok(e)).collect::<Vec<_>>();
        let relations = || (0..l.graph.config.relations).map(|r| l.relation_tok(r)).collect::<Vec<_>>();
        let Some((&verb, rest)) = prefix.split_first() else {
            let mut first = vec![l.vocab.id("search"), l.vocab.id("answer")];
            if recursive {
                first.push(l.vocab.id("spawn"));
            }
            return first;
        };
        match (l.vocab.word(verb), rest.len()) {
            ("search", 0) | ("answer", 0) => entities(),
            ("search", 1) => relations(),
            ("spawn", 0) => relations(),
            ("spawn", n) if l.entity(rest[n - 1]).is_none() => {
                if n < self.max_hops {
                    [relations(), entities()].concat()
                } else {
                    entities()
                }
            }
            _ => vec![EOS],
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HopExpertConfig {
    pub max_depth: u32,
    /// Probability that a node of two or more hops hands all but its last hop to a child.
    pub delegate: f64,
    /// Probability of a useless search at each step.
    pub noise: f64,
    pub seed: u64,
}

impl Default for HopExpertConfig {
    fn default() -> Self {
        HopExpertConfig { max_depth: 6, delegate: 1.0, noise: 0.0, seed: 0 }
    }
}

/// The scripted expert's next action. Recursive: delegate all hops but the last to a child, then
/// search the last hop from the child's answer. Flat (or not delegating): search hop after hop,
/// reading each answer off its page.
pub fn expert_action(lang: &Lang, cfg: &HopExpertConfig, ctx: &[Tok]) -> Vec<Tok> {
    let fallback = lang.encode(&Action::Answer(0));
    let Some(node) = parse_node(&lang.vocab, ctx, &lang.verbs()) else { return fallback };
    let Some((entity, rels)) = lang.parse_goal(&node.goal) else { return fallback };
    let mut rng = Rng::new(cfg.seed ^ (ctx.len() as u64).wrapping_mul(0x2545_F491_4F6C_DD1D) ^ entity as u64);
    // What this node knows: answers of its children and the facts on its pages.
    let mut known: BTreeMap<(usize, Vec<usize>), usize> = BTreeMap::new();
    let mut facts: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    let mut spawned = false;
    for (a, obs) in &node.turns {
        match lang.parse(a) {
            Some(Action::Spawn(e, sub)) => {
                spawned = true;
                if let [OBS, got, x] = obs[..]
                    && lang.vocab.word(got) == "got"
                    && let Some(x) = lang.entity(x)
                {
                    known.insert((e, sub), x);
                }
            }
            Some(Action::Search(..)) => {
                for f in obs.get(1..).unwrap_or(&[]).chunks(FACT_TOKENS) {
                    if let [s, r, o] = *f
                        && let (Some(s), Some(r), Some(o)) = (lang.entity(s), lang.relation(r), lang.entity(o))
                    {
                        facts.insert((s, r), o);
                    }
                }
            }
            _ => {}
        }
    }
    if cfg.noise > 0.0 && rng.chance(cfg.noise) {
        return lang.encode(&Action::Search(rng.below(lang.graph.config.entities), rng.below(lang.graph.config.relations)));
    }
    let k = rels.len();
    // Where the chain stands: the longest known prefix (a child's answer, then pages).
    let mut done = 0;
    let mut at = entity;
    for j in (1..k).rev() {
        if let Some(&x) = known.get(&(entity, rels[..j].to_vec())) {
            (done, at) = (j, x);
            break;
        }
    }
    while done < k {
        match facts.get(&(at, rels[done])) {
            Some(&x) => {
                at = x;
                done += 1;
            }
            None => break,
        }
    }
    if done == k {
        return lang.encode(&Action::Answer(at));
    }
    if done == 0 && k > 1 && !spawned && node.recursive && node.depth < cfg.max_depth && rng.chance(cfg.delegate) {
        return lang.encode(&Action::Spawn(entity, rels[..k - 1].to_vec()));
    }
    lang.encode(&Action::Search(at, rels[done]))
}
