//! The paper's other two regimes through the same runtime: long-document aggregation (the input
//! is many times the window) and multi-hop search (sequential hops, each costing a page of
//! context). Seeded generation, hand-checked verifiers, the experts' success flat vs recursive,
//! context overflow, and every expert action accepted by the environment's grammar.

use rao_core::tree::{Mode, NodeStatus};
use std::collections::BTreeMap;
use std::sync::Arc;

use rao_agent::{Batcher, Limits, Policy, RunMeta, ScriptedPolicy, TreeSpec, run_trees};
use rao_core::NodeRecord;
use rao_envs::grammar::Grammar;
use rao_envs::longdoc::{self, DocConfig, DocExpertConfig, Line, LongDocEpisode, LongDocGrammar, Question, Verb};
use rao_envs::multihop::{self, GraphConfig, HopExpertConfig, MultiHopEpisode, MultiHopGrammar};
use rao_envs::{Episode, Step, Tok};

async fn run(policy: Arc<dyn Policy>, episodes: Vec<Arc<dyn Episode>>, recursive: bool, limits: Limits) -> Vec<Vec<NodeRecord>> {
    let b = Batcher::start(policy);
    let trees = episodes
        .into_iter()
        .enumerate()
        .map(|(i, episode)| TreeSpec { episode, task_id: format!("t{i}"), group: 0, mode: Mode::from_recursive(recursive), seed: 1 })
        .collect();
    let out = run_trees(&b, trees, limits, RunMeta::default()).await;
    b.close();
    out
}

fn mean_root_score(trees: &[Vec<NodeRecord>]) -> f64 {
    trees.iter().map(|t| t[0].score).sum::<f64>() / trees.len() as f64
}

/// Every token of every action in `trees` was allowed by `grammar` after the tokens before it.
fn grammar_accepts(trees: &[Vec<NodeRecord>], grammar: &dyn Grammar, recursive: bool) {
    for node in trees.iter().flatten() {
        let mut context = node.prompt_ids.clone();
        for turn in &node.turns {
            for (i, &t) in turn.completion_ids.iter().enumerate() {
                let allowed: Vec<Tok> = grammar.allowed(recursive, &context, &turn.completion_ids[..i]);
                assert!(allowed.contains(&t), "`{}`: token {i} not allowed by the grammar", turn.action);
            }
            context.extend(turn.completion_ids.iter().chain(&turn.observation_ids));
        }
    }
}

fn doc_limits(recursive: bool) -> Limits {
    // The reference settings of the long-document regime: max depth 2, root budget 15.
    if recursive { Limits { max_depth: 2, max_children: 4, step_budget: 15, ..Limits::recursive(96) } } else { Limits::flat(96) }
}

/// `balanced_counts`: every answer from 0 to 10 about equally often (natural short documents
/// answer mostly 0–2), each document still as long as drawn.
#[test]
fn balanced_documents_spread_their_answers_evenly() {
    let count_shares = |balanced: bool| {
        let cfg = DocConfig { min_lines: 12, max_lines: 20, balanced_counts: balanced, ..DocConfig::default() };
        let docs = longdoc::synthesize(&cfg, 550, false, 4);
        assert!(docs.iter().all(|d| (12..=20).contains(&d.lines.len())));
        let mut hist = [0usize; 21];
        for d in &docs {
            hist[d.question.count(&d.lines) as usize] += 1;
        }
        hist.map(|n| n as f64 / docs.len() as f64)
    };
    let balanced = count_shares(true);
    assert!(balanced[..=10].iter().all(|&p| (0.05..0.14).contains(&p)), "{balanced:?}");
    assert_eq!(balanced[11..].iter().sum::<f64>(), 0.0);
    let natural = count_shares(false);
    assert!(natural.iter().cloned().fold(0.0, f64::max) > 0.25, "natural counts cluster: {natural:?}");
}

#[test]
fn long_documents_are_seeded_and_several_windows_long() {
    let cfg = DocConfig::default();
    let a = longdoc::synthesize(&cfg, 20, false, 5);
    assert_eq!(a, longdoc::synthesize(&cfg, 20, false, 5));
    assert_ne!(a, longdoc::synthesize(&cfg, 20, false, 6));
    assert_ne!(a[0].lines, longdoc::synthesize(&cfg, 20, true, 5)[0].lines, "validation documents are a different draw");
    for t in &a {
        assert!(t.lines.len() * longdoc::LINE_TOKENS >= 5 * 96, "a document is at least five 96-token windows");
        let exact = t.question.count(&t.lines);
        assert!(exact >= 3, "questions have answers worth counting ({exact})");
    }
}

#[test]
fn long_document_verifier_and_sum_by_hand() {
    let lang = Arc::new(longdoc::Lang::new(&DocConfig::default()));
    let lines = vec![
        Line::Roll { speaker: 0, value: 3 },
        Line::Cast { speaker: 1, spell: 1 },
        Line::Roll { speaker: 0, value: 5 },
        Line::Say { speaker: 2, word: 0 },
    ];
    let question = Question { who: Some(0), verb: Verb::Rolls, what: None };
    let ep = LongDocEpisode::new(lang.clone(), longdoc::DocTask { id: "h".into(), lines, question, validation: false });
    let goal = ep.root_goal();
    assert_eq!(lang.vocab.text(&goal), "count alice rolls anything 0 0 0 0 0 4");
    let none = BTreeMap::new();
    assert_eq!(ep.verify(&goal, true, Some("2"), &none), 1.0);
    assert_eq!(ep.verify(&goal, true, Some("4"), &none), 0.5625, "0.75^2");
    assert_eq!(ep.verify(&goal, false, Some("2"), &none), 0.0, "unfinished");
    assert_eq!(ep.verify(&goal, true, None, &none), 0.0);
    // A child is scored on its own slice: lines 2..4 hold one roll by alice.
    let slice = lang.goal(&question, 2, 2);
    assert_eq!(ep.verify(&slice, true, Some("1"), &none), 1.0);
    // Reading copies lines into the context; out-of-range reads and flat splits are refused.
    let read = ep.step(&slice, &lang.encode(&longdoc::Action::Read { start: 2, count: 2 }), true);
    assert_eq!(
        read.step,
        Step::Observe(lang.vocab.ids("<obs> alice rolls 5 carol says hmm alice rolls anything")),
        "lines, then the question"
    );
    let outside = ep.step(&slice, &lang.encode(&longdoc::Action::Read { start: 0, count: 3 }), true);
    assert_eq!(outside.step, Step::Observe(lang.vocab.ids("<obs> err range")));
    let split = ep.step(&goal, &lang.encode(&longdoc::Action::Split(2)), true);
    assert_eq!(split.step, Step::Spawn(vec![lang.goal(&question, 0, 2), lang.goal(&question, 2, 2)]));
    assert!(matches!(ep.step(&goal, &lang.encode(&longdoc::Action::Split(2)), false).step, Step::Observe(_)));
    // `answer sum` adds the children's results held as variables (a child without one adds 0).
    let sum = ep.step_with_results(&goal, &lang.encode(&longdoc::Action::AnswerSum), true, &[Some("3".into()), None, Some("4".into())]);
    assert_eq!((sum.step, sum.result.as_deref()), (Step::Finish, Some("7")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recursive_expert_counts_long_documents_exactly_and_the_flat_one_cannot() {
    let cfg = DocConfig::default();
    let lang = Arc::new(longdoc::Lang::new(&cfg));
    let tasks = longdoc::synthesize(&cfg, 30, true, 3);
    let episodes = || tasks.iter().map(|t| Arc::new(LongDocEpisode::new(lang.clone(), t.clone())) as Arc<dyn Episode>).collect::<Vec<_>>();
    let expert: Arc<dyn Policy> = {
        let (lang, cfg) = (lang.clone(), DocExpertConfig { max_depth: 2, max_children: 4, ..Default::default() });
        Arc::new(ScriptedPolicy(move |ctx: &[Tok], window: usize| longdoc::expert_action(&lang, &cfg, ctx, window)))
    };
    let rec = run(expert.clone(), episodes(), true, doc_limits(true)).await;
    let flat = run(expert, episodes(), false, doc_limits(false)).await;
    let (r, f) = (mean_root_score(&rec), mean_root_score(&flat));
    println!("long documents, W=96: recursive expert {r:.3}, flat expert {f:.3}");
    assert_eq!(r, 1.0, "every count exact");
    assert!(f < 0.5, "the flat expert sees one window of the document and estimates ({f:.3})");
    assert!(rec.iter().flatten().all(|n| n.depth <= 2 && n.context_tokens <= 96));
    assert!(rec.iter().all(|t| t.len() > 4), "documents this long are split");
    grammar_accepts(&rec, &LongDocGrammar::new(lang.clone(), 4), true);
    grammar_accepts(&flat, &LongDocGrammar::new(lang.clone(), 4), false);

    // A reader that does not stop runs out of window: the node ends in context overflow, score 0.
    let greedy = {
        let lang = lang.clone();
        Arc::new(ScriptedPolicy(move |ctx: &[Tok], _: usize| {
            let reads = ctx.iter().filter(|&&t| t == lang.vocab.id("read")).count() as u64;
            lang.encode(&longdoc::Action::Read { start: 20 * reads, count: 20 })
        }))
    };
    let over = run(greedy, episodes()[..3].to_vec(), false, doc_limits(false)).await;
    assert!(over.iter().all(|t| t[0].status == NodeStatus::ContextOverflow && t[0].score == 0.0 && t[0].context_tokens <= 96));
}

fn hop_setup() -> (Arc<multihop::Lang>, Vec<multihop::HopTask>) {
    let graph = multihop::generate(&GraphConfig::default(), 4);
    let tasks = multihop::synthesize(&graph, (2, 6), 10, true, 8);
    (Arc::new(multihop::Lang::new(graph)), tasks)
}

#[test]
fn knowledge_graphs_are_seeded_and_chains_verify_by_hand() {
    let cfg = GraphConfig::default();
    assert_eq!(multihop::generate(&cfg, 4), multihop::generate(&cfg, 4));
    assert_ne!(multihop::generate(&cfg, 4).edges, multihop::generate(&cfg, 5).edges);
    let (lang, tasks) = hop_setup();
    let g = &lang.graph;
    assert_eq!(tasks, multihop::synthesize(g, (2, 6), 10, true, 8));
    assert_eq!(tasks.iter().filter(|t| t.hops() == 6).count(), 10);
    assert!(tasks.iter().all(|t| t.entity >= g.config.entities / 2), "validation chains start in the held-out half");

    let t = tasks.iter().find(|t| t.hops() == 3).unwrap().clone();
    let ep = MultiHopEpisode::new(lang.clone(), t.clone());
    let goal = ep.root_goal();
    assert_eq!(lang.parse_goal(&goal), Some((t.entity, t.relations.clone())));
    // Follow the chain by hand through the edge table.
    let (x1, x2) =
        (g.edges[t.entity][t.relations[0]] as usize, g.edges[g.edges[t.entity][t.relations[0]] as usize][t.relations[1]] as usize);
    let x3 = g.edges[x2][t.relations[2]] as usize;
    let none = BTreeMap::new();
    assert_eq!(ep.verify(&goal, true, Some(&g.names[x3]), &none), 1.0);
    assert_eq!(ep.verify(&goal, true, Some(&g.names[x2]), &none), 0.0, "one hop short");
    assert_eq!(ep.verify(&goal, false, Some(&g.names[x3]), &none), 0.0);
    // A child asked for the first hop is verified against that hop's entity.
    assert_eq!(ep.verify(&lang.goal(t.entity, &t.relations[..1]), true, Some(&g.names[x1]), &none), 1.0);
    // A page holds the fact among distractors about the same entity, 3 tokens each, then the
    // query to complete; the same page every time.
    let Step::Observe(page) = ep.step(&goal, &lang.encode(&multihop::Action::Search(t.entity, t.relations[0])), true).step else {
        panic!()
    };
    assert_eq!(page.len(), 1 + 3 * (1 + g.config.distractors) + 2);
    let (e, r) = (lang.entity_tok(t.entity), lang.relation_tok(t.relations[0]));
    let facts: Vec<&[Tok]> = page[1..page.len() - 2].chunks(3).collect();
    assert!(facts.contains(&&[e, r, lang.entity_tok(x1)][..]));
    assert!(facts.iter().all(|f| f[0] == e), "every fact on the page is about the entity searched");
    assert_eq!(facts.iter().filter(|f| f[1] == r).count(), 1, "one fact answers the query");
    assert_eq!(page[page.len() - 2..], [e, r]);
    assert_eq!(Step::Observe(page), ep.step(&goal, &lang.encode(&multihop::Action::Search(t.entity, t.relations[0])), true).step);
    // Spawning one's own question is refused.
    let own = ep.step(&goal, &lang.encode(&multihop::Action::Spawn(t.entity, t.relations.clone())), true);
    assert_eq!(own.step, Step::Observe(lang.vocab.ids("<obs> err self")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recursive_expert_answers_every_chain_and_the_flat_one_only_two_hops() {
    let (lang, tasks) = hop_setup();
    let expert: Arc<dyn Policy> = {
        let lang = lang.clone();
        Arc::new(ScriptedPolicy(move |ctx: &[Tok], _: usize| multihop::expert_action(&lang, &HopExpertConfig::default(), ctx)))
    };
    let episodes = || tasks.iter().map(|t| Arc::new(MultiHopEpisode::new(lang.clone(), t.clone())) as Arc<dyn Episode>).collect::<Vec<_>>();
    let rec = run(expert.clone(), episodes(), true, Limits::recursive(96)).await;
    let flat = run(expert, episodes(), false, Limits::flat(96)).await;
    let mut line = String::from("multi-hop, W=96 (success by hops 2..6):");
    for k in 2..=6 {
        let pick = |trees: &[Vec<NodeRecord>]| -> Vec<Vec<NodeRecord>> {
            trees.iter().zip(&tasks).filter(|(_, t)| t.hops() == k).map(|(x, _)| x.clone()).collect()
        };
        let (r, f) = (pick(&rec), pick(&flat));
        let (rs, fs) = (mean_root_score(&r), mean_root_score(&f));
        line.push_str(&format!(" {k}: rec {rs:.2} flat {fs:.2};"));
        assert_eq!(rs, 1.0, "recursive, {k} hops");
        assert!(r.iter().all(|t| t.iter().map(|n| n.depth).max() == Some(k as i32 - 1)), "one level per hop");
        if k == 2 {
            assert_eq!(fs, 1.0, "two pages fit in the window");
        } else if k == 3 {
            // Three pages overflow; a page that happens to hold a later hop's fact can save one.
            assert!(fs <= 0.2, "flat, 3 hops: {fs}");
        } else {
            assert_eq!(fs, 0.0, "flat, {k} hops");
            assert!(f.iter().all(|t| t[0].status == NodeStatus::ContextOverflow));
        }
    }
    println!("{line}");
    grammar_accepts(&rec, &MultiHopGrammar::new(lang.clone(), 6), true);
    grammar_accepts(&flat, &MultiHopGrammar::new(lang.clone(), 6), false);
}

#[test]
fn name_permutation_is_consistent_within_a_sequence_and_keeps_other_tokens() {
    let (lang, tasks) = hop_setup();
    let ep = MultiHopEpisode::new(lang.clone(), tasks[0].clone());
    let goal = ep.root_goal();
    let Step::Observe(page) = ep.step(&goal, &lang.encode(&multihop::Action::Search(tasks[0].entity, tasks[0].relations[0])), true).step
    else {
        panic!()
    };
    let seq: Vec<Tok> = [goal.clone(), page.clone()].concat();
    let groups = lang.name_groups();
    let mut rng = rao_envs::rng::Rng::new(7);
    let out = rao_envs::node::permute_names(&seq, &groups, &mut rng);
    assert_eq!(out.len(), seq.len());
    let mut map = BTreeMap::new();
    for (a, b) in seq.iter().zip(&out) {
        let group = groups.iter().position(|g| g.contains(a));
        assert_eq!(group, groups.iter().position(|g| g.contains(b)), "names stay in their group; other tokens stay");
        if group.is_none() {
            assert_eq!(a, b);
        }
        assert_eq!(*map.entry(*a).or_insert(*b), *b, "one token, one new name");
    }
    assert_ne!(out, seq, "something was renamed");
}
