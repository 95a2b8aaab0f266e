//! The recursive runtime: caps refuse as observations, overflows end nodes, siblings run
//! concurrently, policy calls are batched across trees, and the same seed gives the same trees.

use rao_core::tree::{Mode, NodeStatus};
use std::sync::Arc;

use futures::future::BoxFuture;
use rao_agent::policy::finish_action;
use rao_agent::{Batcher, Limits, Policy, Request, Response, RunMeta, ScriptedExpert, TreeSpec, UniformRandom, run_trees};
use rao_core::NodeRecord;
use rao_envs::textcraft::{self, Action, Band, ExpertConfig, Lang, SynthConfig, TextCraftEpisode, World};

fn world() -> Arc<World> {
    Arc::new(textcraft::generate(&SynthConfig::small(), 4))
}

async fn run(
    world: &Arc<World>,
    policy: Arc<dyn Policy>,
    band: Band,
    n: usize,
    recursive: bool,
    limits: Limits,
) -> (Vec<Vec<NodeRecord>>, Vec<usize>) {
    let tasks = textcraft::synthesize(world, band, n, true, 5);
    let b = Batcher::start(policy);
    let trees = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| TreeSpec {
            episode: Arc::new(TextCraftEpisode::new(world.clone(), t.clone())),
            task_id: t.id.clone(),
            group: i as i32,
            mode: Mode::from_recursive(recursive),
            seed: 100 + i as u64,
        })
        .collect();
    let out = run_trees(&b, trees, limits, RunMeta { run: "test".into(), iteration: 0, env: "textcraft".into() }).await;
    b.close();
    (out, b.round_sizes())
}

/// Spawns copies of its first ingredient-like target forever: what RL without caps learns.
struct Spawner {
    world: Arc<World>,
}

impl Policy for Spawner {
    fn act(&self, batch: Vec<Request>) -> BoxFuture<'_, Vec<Response>> {
        let lang = Lang::new(&self.world);
        let out = batch
            .into_iter()
            .map(|r| {
                let item = (r.seed % self.world.items.len() as u64) as u32;
                finish_action(lang.encode(&Action::Spawn(vec![(item, 1), (item, 2), (item, 3)])), r.max_new_tokens, 0.0)
            })
            .collect();
        Box::pin(async move { out })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_refuse_launches_as_observations() {
    let w = world();
    let limits =
        Limits { window: 4096, step_budget: 4, root_step_budget: None, max_depth: 3, max_children: 6, max_nodes: 40, subtree_steps: None };
    let (trees, _) = run(&w, Arc::new(Spawner { world: w.clone() }), Band::Easy, 4, true, limits).await;
    for t in &trees {
        assert!(t.len() <= 40, "max_nodes holds: {}", t.len());
        assert!(t.iter().all(|n| n.depth <= 3), "max_depth holds");
        for n in t {
            let kids = t.iter().filter(|c| c.parent_id == Some(n.node_id)).count();
            assert!(kids <= 6, "max_children holds");
        }
        let refusals: Vec<&str> =
            t.iter().flat_map(|n| n.turns.iter().map(|x| x.observation.as_str())).filter(|o| o.starts_with("<obs> err")).collect();
        assert!(refusals.contains(&"<obs> err depth"));
        assert!(refusals.iter().any(|r| *r == "<obs> err children" || *r == "<obs> err nodes"));
        assert!(t.iter().all(|n| n.steps <= 4), "step budget holds");
        assert!(t.iter().any(|n| n.status == NodeStatus::StepBudget));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flat_agent_overflows_its_window_on_deep_tasks() {
    let w = world();
    let expert = Arc::new(ScriptedExpert { world: w.clone(), config: ExpertConfig::default() });
    let (trees, _) = run(&w, expert, Band::Hard, 6, false, Limits::flat(96)).await;
    for t in &trees {
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].status, NodeStatus::ContextOverflow);
        assert_eq!(t[0].score, 0.0);
        assert!(t[0].context_tokens <= 96);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn siblings_overlap_in_time_and_share_the_inventory() {
    let w = world();
    let expert = Arc::new(ScriptedExpert { world: w.clone(), config: ExpertConfig::default() });
    let (trees, _) = run(&w, expert, Band::Medium, 4, true, Limits::recursive(96)).await;
    let mut overlapping = 0;
    for t in &trees {
        assert_eq!(t[0].score, 1.0, "the recursive expert solves it");
        for a in t {
            for b in t {
                if a.node_id < b.node_id && a.parent_id.is_some() && a.parent_id == b.parent_id {
                    assert!(
                        a.started_ms <= b.finished_ms && b.started_ms <= a.finished_ms,
                        "siblings {} and {} did not overlap",
                        a.goal,
                        b.goal
                    );
                    overlapping += 1;
                }
            }
        }
        // The parent saw one short receipt per child, not the children's contexts.
        let root = &t[0];
        let spawn_turn = root.turns.iter().find(|x| x.action.starts_with("spawn")).unwrap();
        let kids = t.iter().filter(|c| c.parent_id == Some(0)).count();
        assert_eq!(spawn_turn.observation_ids.len(), 1 + kids);
    }
    assert!(overlapping > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_calls_are_batched_across_all_live_nodes() {
    let w = world();
    let expert = Arc::new(ScriptedExpert { world: w.clone(), config: ExpertConfig::default() });
    let (_, rounds) = run(&w, expert, Band::Medium, 64, true, Limits::recursive(96)).await;
    assert_eq!(rounds[0], 64, "the first round serves all 64 roots at once");
    let calls: usize = rounds.iter().sum();
    assert!(rounds.len() * 8 < calls, "few rounds, big batches: {} rounds for {calls} calls", rounds.len());
}

fn strip_timing(trees: Vec<Vec<NodeRecord>>) -> Vec<Vec<NodeRecord>> {
    trees
        .into_iter()
        .map(|t| {
            t.into_iter()
                .map(|mut n| {
                    n.started_ms = 0.0;
                    n.finished_ms = 0.0;
                    n
                })
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_seed_same_trees_even_for_a_random_policy() {
    let w = world();
    let limits =
        Limits { window: 128, step_budget: 8, root_step_budget: None, max_depth: 3, max_children: 4, max_nodes: 30, subtree_steps: None };
    let a = strip_timing(run(&w, Arc::new(UniformRandom { world: w.clone() }), Band::Medium, 16, true, limits).await.0);
    let b = strip_timing(run(&w, Arc::new(UniformRandom { world: w.clone() }), Band::Medium, 16, true, limits).await.0);
    assert_eq!(a, b);
    assert!(a.iter().map(|t| t.len()).sum::<usize>() > 16, "the random policy did spawn");
}

/// Steps of a node's whole subtree.
fn subtree_steps(tree: &[NodeRecord], id: i32) -> i64 {
    let node = tree.iter().find(|n| n.node_id == id).unwrap();
    node.steps as i64 + tree.iter().filter(|c| c.parent_id == Some(id)).map(|c| subtree_steps(tree, c.node_id)).sum::<i64>()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_subtree_budget_holds_for_every_subtree_and_refuses_launches_it_cannot_fund() {
    let w = world();
    let per_node =
        Limits { window: 4096, step_budget: 4, root_step_budget: None, max_depth: 3, max_children: 6, max_nodes: 200, subtree_steps: None };
    let (unshared, _) = run(&w, Arc::new(Spawner { world: w.clone() }), Band::Easy, 4, true, per_node).await;
    let total = 20;
    let shared = Limits { subtree_steps: Some(total), ..per_node };
    let (trees, _) = run(&w, Arc::new(Spawner { world: w.clone() }), Band::Easy, 4, true, shared).await;
    for (t, u) in trees.iter().zip(&unshared) {
        let root = t.iter().find(|n| n.parent_id.is_none()).unwrap();
        assert!(subtree_steps(t, root.node_id) <= total as i64, "the root's subtree spent {} > {total}", subtree_steps(t, root.node_id));
        // Each child's subtree stays within the share its parent reserved when it launched it:
        // at most what the parent had left, split between the three it launched at once.
        for n in t.iter().filter(|n| n.parent_id.is_some()) {
            assert!(subtree_steps(t, n.node_id) <= (total as i64 - 2) / 3, "a child subtree overspent");
        }
        // The budget bites: fewer nodes than with per-node budgets, and refusals as observations.
        assert!(t.len() < u.len(), "shared {} nodes vs per-node {}", t.len(), u.len());
        assert!(t.iter().any(|n| n.turns.iter().any(|turn| turn.observation.contains("nodes"))), "a launch it cannot fund is refused");
    }
    // A generous shared budget changes nothing for the expert.
    let expert = Arc::new(ScriptedExpert { world: w.clone(), config: ExpertConfig::default() });
    let generous = Limits { subtree_steps: Some(10_000), ..Limits::recursive(96) };
    let (a, _) = run(&w, expert.clone(), Band::Medium, 6, true, generous).await;
    let (b, _) = run(&w, expert, Band::Medium, 6, true, Limits::recursive(96)).await;
    let score = |ts: &[Vec<NodeRecord>]| ts.iter().map(|t| t.iter().find(|n| n.parent_id.is_none()).unwrap().score).sum::<f64>();
    assert_eq!(score(&a), score(&b));
    assert_eq!(score(&a), 6.0);
}
