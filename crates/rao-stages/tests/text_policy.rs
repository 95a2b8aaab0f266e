//! A Hugging Face model acting in text in every environment: a tiny random Qwen3 made by
//! transformers (rao-policy's tests/hf/reference.py, run with the Python that scripts/test sets
//! up: RAO_PYTHON). Every action it samples parses; the trees hold its own tokens, the prompt as
//! its chat template renders the conversation; and what the update reads back from the stored
//! trees is token for token what it was fed and sampled: a fresh forward pass over each stored
//! node sequence, under the same grammar mask, gives the log-probs recorded while acting.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::Ordering;

use rao_agent::RunMeta;
use rao_core::NodeRecord;
use rao_core::parquet_io::{nodes_from_parquet, nodes_to_parquet};
use rao_envs::text::conversation;
use rao_envs::vocab::Tok;
use rao_envs::{longdoc, multihop, textcraft};
use rao_policy::hf;
use rao_policy::{Backend, Policy};
use rao_stages::envs::TaskSet;
use rao_stages::envs::longdoc::LongDocSet;
use rao_stages::envs::multihop::MultiHopSet;
use rao_stages::neural::LoadedModel;
use rao_stages::rollout::{LimitParams, Mode, rollout_trees};
use rao_stages::serve::Served;
use rao_stages::text_policy::{TextForm, TextPolicy, token_space};
use rao_stages::training::node_sequence;

/// The reference checkpoints, made once per test process.
fn fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::Builder::new().prefix("rao-text").tempdir().unwrap().keep();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rao-policy/tests/hf/reference.py");
        let python = std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into());
        let out = Command::new(python).arg(script).arg("make").arg(&dir).output().expect("running Python");
        assert!(
            out.status.success(),
            "reference.py failed (set RAO_PYTHON to scripts/test's interpreter):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

/// A node's context in the environment's tokens before its `k`-th action, from its record.
fn env_context(set: &dyn TaskSet, n: &NodeRecord, k: usize) -> Vec<Tok> {
    let episode = set.episode(0);
    let mut ctx = episode.prompt(&n.goal_ids, n.depth as u32, n.mode.is_recursive());
    for t in &n.turns[..k] {
        ctx.extend(set.vocab().ids(&t.action));
        ctx.extend(set.vocab().ids(&t.observation));
    }
    ctx
}

/// Acts in `set`, checks the trees, then takes one CISPO step on them under the text grammar.
async fn act_and_train(set: &dyn TaskSet, model: &Arc<Policy>, tokenizer: &Arc<hf::TextTokenizer>) {
    let name = set.env();
    // Small trees: the model is random, so it launches sub-agents at random.
    let limits = LimitParams { window: 1 << 20, step_budget: Some(4), max_depth: 2, max_children: 3, max_nodes: 8, ..Default::default() }
        .limits(Mode::Recursive);
    let window = 4096;
    let policy = Arc::new(
        TextPolicy::new(model.clone(), tokenizer.clone(), set.grammar(3).as_ref(), set.episode(0), 1.0, window)
            .unwrap_or_else(|e| panic!("{name}: {e:#}")),
    );
    let meta = RunMeta { run: "text".into(), iteration: 0, env: name.into() };
    let trees = rollout_trees(set, &set.all(), policy.clone(), Mode::Recursive, 2, limits, meta, 5).await;
    let nodes = nodes_from_parquet(nodes_to_parquet(&trees.into_iter().flatten().collect::<Vec<_>>()).unwrap()).unwrap();
    assert_eq!(policy.unusable.load(Ordering::SeqCst), 0, "{name}: every reply read as an action");
    let template = tokenizer.chat.as_ref().unwrap();
    let space = token_space(tokenizer);
    let mut turns = 0;
    for n in &nodes {
        assert_eq!(n.token_space, space, "{name}: the ids are the model's");
        assert!(n.context_tokens as usize <= window, "{name}: the window counts the model's tokens");
        // The prompt is the chat template's rendering of the node's conversation.
        let first = conversation(set.episode(0).as_ref(), &env_context(set, n, 0)).unwrap();
        assert_eq!(tokenizer.decode(&n.prompt_ids, false).unwrap(), template.render(&serde_json::to_value(&first).unwrap(), true).unwrap());
        let mut fed = n.prompt_ids.clone();
        for (k, t) in n.turns.iter().enumerate() {
            if t.completion_ids.is_empty() {
                // The window ran out before this action: nothing was fed or sampled.
                assert_eq!(n.status, rao_core::NodeStatus::ContextOverflow);
                continue;
            }
            turns += 1;
            assert!(!t.observation.contains("err syntax"), "{name}: a sampled action did not parse: {}", t.action);
            // Before each action the model's context reads as the whole conversation so far.
            let messages = conversation(set.episode(0).as_ref(), &env_context(set, n, k)).unwrap();
            assert_eq!(
                tokenizer.decode(&fed, false).unwrap(),
                template.render(&serde_json::to_value(&messages).unwrap(), true).unwrap(),
                "{name}: node {} before action {k}",
                n.node_id
            );
            fed.extend(&t.completion_ids);
            fed.extend(&t.observation_ids);
        }
    }
    let children = nodes.iter().filter(|n| n.parent_id.is_some()).count();
    let tokens: i32 = nodes.iter().map(|n| n.context_tokens).sum();
    eprintln!("{name}: {} nodes ({children} sub-agents), {turns} actions, {tokens} model tokens", nodes.len());
    assert!(turns > nodes.len(), "{name}: nodes act more than once");
    // Token in, token out: the update's inputs, read from the stored trees, reproduce the
    // behaviour log-probs exactly as sampled.
    let seqs: Vec<_> = nodes.iter().map(|n| node_sequence(n, 1.0)).collect();
    // A demonstration of the same actions (the warm start's `TextForm::sequence` of the node in
    // the environment's tokens) is fed exactly the same tokens, and writes the same replies.
    let form = TextForm::new(tokenizer.clone(), set.episode(0), policy.grammar().stop()).unwrap();
    let segments = |s: &rao_policy::Sequence| -> Vec<(bool, Vec<u32>)> {
        let mut out: Vec<(bool, Vec<u32>)> = Vec::new();
        for (&t, &g) in s.tokens.iter().zip(&s.generated) {
            match out.last_mut() {
                Some((h, v)) if *h == g => v.push(t),
                _ => out.push((g, vec![t])),
            }
        }
        out
    };
    let mut compared = 0;
    for (n, recorded) in nodes.iter().zip(&seqs) {
        if n.turns.iter().any(|t| t.completion_ids.is_empty()) {
            continue; // overflowed
        }
        // The last observation was never fed (nothing came after it): not in the record.
        let mut n = n.clone();
        if let Some(t) = n.turns.last_mut() {
            t.observation.clear();
        }
        let n = &n;
        compared += 1;
        let mut compact =
            rao_policy::Sequence { tokens: env_context(set, n, 0), generated: vec![], old_logprobs: vec![], ..recorded.clone() };
        compact.generated = vec![false; compact.tokens.len()];
        for t in &n.turns {
            let (action, obs) = (set.vocab().ids(&t.action), set.vocab().ids(&t.observation));
            compact.generated.extend(std::iter::repeat_n(true, action.len()).chain(std::iter::repeat_n(false, obs.len())));
            compact.tokens.extend(action.into_iter().chain(obs));
        }
        let demo = form.sequence(&compact).unwrap();
        let (a, b) = (segments(recorded), segments(&demo));
        assert_eq!(a.len(), b.len(), "{name}: node {}", n.node_id);
        for ((g, x), (_, y)) in a.iter().zip(&b) {
            if *g {
                assert_eq!(tokenizer.decode(x, false).unwrap(), tokenizer.decode(y, false).unwrap(), "{name}: a reply");
            } else {
                assert_eq!(x, y, "{name}: what the model is fed");
            }
        }
    }
    assert!(compared * 2 > nodes.len(), "{name}: {compared} of {} nodes compared with their demonstration", nodes.len());
    let fresh = model.sequence_logprobs(&seqs, policy.grammar(), 1.0);
    for (n, f) in nodes.iter().zip(&fresh) {
        let sampled: Vec<f32> = n.turns.iter().flat_map(|t| t.logprobs.iter().copied()).collect();
        assert_eq!(sampled.len(), f.len(), "{name}: generated tokens");
        for (a, b) in sampled.iter().zip(f) {
            assert!((a - b).abs() < 1e-4, "{name}: sampled log-prob {a} vs {b} from the stored tokens");
        }
    }
    // A gradient step on them, masked by the same grammar, moves the model.
    let mut learner = Policy::from_checkpoint(&model.checkpoint(), Backend::Cpu).unwrap();
    let signed: Vec<_> = seqs
        .iter()
        .enumerate()
        .map(|(i, s)| rao_policy::Sequence { advantage: if i % 2 == 0 { 1.0 } else { -1.0 }, ..s.clone() })
        .collect();
    let m = learner.train_step(&signed, policy.grammar(), rao_policy::Loss::Cispo { lo: 0.0, hi: 5.0 }, 1e-3, 1.0);
    assert!(m.loss.is_finite() && m.grad_norm > 0.0, "{name}: {m:?}");
    assert_ne!(learner.sequence_logprobs(&seqs, policy.grammar(), 1.0), fresh, "{name}: the step changed nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_language_model_acts_in_text_in_every_environment_token_in_token_out() {
    let pre = hf::load(&fixtures().join("qwen3"), Backend::Cpu).unwrap();
    let tokenizer = Arc::new(pre.tokenizer.expect("the fixture has a tokenizer"));
    let model = Arc::new(pre.policy);

    let world = Arc::new(textcraft::generate(&textcraft::SynthConfig::small(), 3));
    let tasks = textcraft::synthesize(&world, textcraft::Band::Medium, 2, true, 3);
    act_and_train(&rao_stages::envs::textcraft::task_set(&world, &tasks), &model, &tokenizer).await;

    let doc = longdoc::DocConfig { min_lines: 20, max_lines: 60, ..Default::default() };
    act_and_train(
        &LongDocSet { lang: Arc::new(longdoc::Lang::new(&doc)), tasks: longdoc::synthesize(&doc, 2, true, 3) },
        &model,
        &tokenizer,
    )
    .await;

    let graph = multihop::generate(&multihop::GraphConfig::default(), 3);
    let tasks = multihop::synthesize(&graph, (3, 3), 2, true, 3);
    act_and_train(&MultiHopSet { lang: Arc::new(multihop::Lang::new(graph)), tasks }, &model, &tokenizer).await;
}

/// `rao serve` of a text checkpoint: a conversation of the environment is rendered through the
/// chat template and answered with an action sampled under the grammar; usage counts the
/// model's tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_language_model_answers_every_conversation_with_an_action() {
    let dir = fixtures().join("qwen3");
    let pre = hf::load(&dir, Backend::Cpu).unwrap();
    let world = Arc::new(textcraft::generate(&textcraft::SynthConfig::small(), 3));
    let set: Arc<dyn TaskSet> =
        Arc::new(rao_stages::envs::textcraft::task_set(&world, &textcraft::synthesize(&world, textcraft::Band::Easy, 1, true, 3)));
    let limits = LimitParams { window: 4096, ..Default::default() };
    let served = Served::from_loaded(
        "tiny".into(),
        LoadedModel { policy: pre.policy, tokenizer: pre.tokenizer.map(Arc::new) },
        set.clone(),
        &limits,
        rao_policy::prefix_cache::DEFAULT_BUDGET_BYTES,
    )
    .unwrap();
    let episode = set.episode(0);
    let goal = episode.root_goal();
    let mut context = episode.prompt(&goal, 0, true);
    for seed in 0..12 {
        let messages = conversation(episode.as_ref(), &context).unwrap();
        let reply = served.complete(&serde_json::json!({"messages": messages, "seed": seed, "temperature": 1.0})).await.unwrap();
        let content = reply["choices"][0]["message"]["content"].as_str().unwrap();
        let action = rao_envs::text::parse_reply(set.vocab(), content).unwrap_or_else(|e| panic!("{content:?}: {e}"));
        assert!(reply["usage"]["prompt_tokens"].as_u64().unwrap() > context.len() as u64, "the prompt counts the model's tokens");
        // The conversation goes on with that action and what the environment answers.
        let out = episode.step(&goal, &action, true);
        context.extend(action);
        context.push(rao_envs::vocab::EOS);
        match out.step {
            rao_envs::Step::Observe(obs) => context.extend(obs),
            _ => context = episode.prompt(&goal, 0, true),
        }
    }
    assert!(served.completion_tokens.load(Ordering::SeqCst) >= 12 * 2);
}
