//! The recursive runtime: runs execution trees on tokio, one task per node.
//!
//! A node acts until it finishes, runs out of steps, or overflows its window. `spawn` launches
//! children that run concurrently on the same world; the parent keeps each child's result as a
//! variable and sees only a short receipt. Launches past the caps are refused as observations.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use parking_lot::Mutex;

use futures::future::BoxFuture;
use rao_core::tree::{Mode, NodeRecord, NodeStatus, Turn};
use rao_envs::vocab::{EOS, OBS, Tok};
use rao_envs::{Episode, Refusal, Step};
use serde::{Deserialize, Serialize};

use crate::batcher::Batcher;
use crate::policy::Request;

/// Budgets and caps of one execution tree.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Context window of every node, in tokens (goal + actions + observations).
    pub window: usize,
    /// Actions per node (recursive default 25; a flat agent gets 200).
    pub step_budget: u32,
    /// Actions of the root, where it differs from other nodes' (e.g. root 15, children 25).
    #[serde(default)]
    pub root_step_budget: Option<u32>,
    /// Deepest level a node may be launched at (root = 0).
    pub max_depth: u32,
    /// Children one node may launch in all.
    pub max_children: u32,
    /// Nodes one tree may hold.
    pub max_nodes: u32,
    /// The paper's shared step budget: when set, the root has this many steps for its whole
    /// subtree, and a node launching children reserves an equal share of what it has left for
    /// each (keeping one step for itself after they return); a child's subtree spends only its
    /// share, and what it leaves unspent comes back. A launch that would leave a child no step
    /// is refused like one past `max_nodes`. Per-node `step_budget`s still cap each node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subtree_steps: Option<u32>,
}

impl Limits {
    pub fn recursive(window: usize) -> Self {
        Limits { window, step_budget: 25, root_step_budget: None, max_depth: 6, max_children: 8, max_nodes: 512, subtree_steps: None }
    }
    pub fn flat(window: usize) -> Self {
        Limits { window, step_budget: 200, root_step_budget: None, max_depth: 0, max_children: 0, max_nodes: 1, subtree_steps: None }
    }
}

/// One tree to run.
pub struct TreeSpec {
    pub episode: Arc<dyn Episode>,
    pub task_id: String,
    pub group: i32,
    pub mode: Mode,
    pub seed: u64,
}

/// Labels stored with every node.
#[derive(Debug, Clone, Default)]
pub struct RunMeta {
    pub run: String,
    pub iteration: i32,
    pub env: String,
}

struct TreeCtx {
    idx: usize,
    spec: TreeSpec,
    limits: Limits,
    meta: RunMeta,
    version: i32,
    nodes: Mutex<Vec<(Vec<u32>, NodeRecord)>>,
    node_count: AtomicU32,
}

/// What a finished node hands its parent.
#[derive(Debug, Clone)]
struct Outcome {
    score: f64,
    result: Option<String>,
    /// Counters of the node's whole subtree.
    subtree: BTreeMap<String, i64>,
    /// Steps the node and its descendants took.
    subtree_steps: u32,
}

fn now_ms() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0)
}

fn request_seed(tree_seed: u64, path: &[u32], step: u32) -> u64 {
    let mut h = tree_seed ^ 0x2545_F491_4F6C_DD1D;
    for &p in path.iter().chain(std::iter::once(&step)) {
        h = (h ^ (p as u64 + 1)).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    }
    h
}

/// Run many trees at once through one batcher. Returns each tree's nodes, ids in breadth-first
/// order of their paths, scored by the environment's verifier.
pub async fn run_trees(batcher: &Batcher, trees: Vec<TreeSpec>, limits: Limits, meta: RunMeta) -> Vec<Vec<NodeRecord>> {
    run_trees_observed(batcher, trees, limits, meta, &|_| {}).await
}

/// A tree that has just finished, as `run_trees_observed` reports it.
#[derive(Debug, Clone, Copy)]
pub struct TreeDone {
    /// Trees of this call finished so far (this one included).
    pub finished: usize,
    pub total: usize,
    /// The root's score (1 = the task solved).
    pub root_score: f64,
}

/// `run_trees`, telling `on_tree` of each tree as it finishes (in the order they finish).
pub async fn run_trees_observed(
    batcher: &Batcher,
    trees: Vec<TreeSpec>,
    limits: Limits,
    meta: RunMeta,
    on_tree: &(dyn Fn(TreeDone) + Sync),
) -> Vec<Vec<NodeRecord>> {
    use futures::StreamExt;
    let version = batcher.policy_version();
    let ctxs: Vec<Arc<TreeCtx>> = trees
        .into_iter()
        .enumerate()
        .map(|(idx, spec)| {
            let limits = if spec.mode.is_recursive() {
                limits
            } else {
                Limits { max_depth: 0, max_children: 0, max_nodes: 1, subtree_steps: None, ..limits }
            };
            Arc::new(TreeCtx {
                idx,
                spec,
                limits,
                meta: meta.clone(),
                version,
                nodes: Mutex::new(Vec::new()),
                node_count: AtomicU32::new(1),
            })
        })
        .collect();
    batcher.activate(ctxs.len());
    let mut roots: futures::stream::FuturesUnordered<_> = ctxs
        .iter()
        .map(|t| {
            let goal = t.spec.episode.root_goal();
            let budget = t.limits.subtree_steps;
            tokio::spawn(run_node(batcher.clone(), t.clone(), Vec::new(), 0, goal, budget, None, None))
        })
        .collect();
    let total = ctxs.len();
    let mut finished = 0;
    while let Some(outcome) = roots.next().await {
        let outcome = outcome.expect("a root node task panicked");
        finished += 1;
        on_tree(TreeDone { finished, total, root_score: outcome.score });
    }
    ctxs.into_iter().map(|t| finish_tree(&t)).collect()
}

/// Assign ids (breadth first by path) and parent ids.
fn finish_tree(t: &TreeCtx) -> Vec<NodeRecord> {
    let mut nodes = std::mem::take(&mut *t.nodes.lock());
    nodes.sort_by(|a, b| (a.0.len(), &a.0).cmp(&(b.0.len(), &b.0)));
    let ids: BTreeMap<Vec<u32>, i32> = nodes.iter().enumerate().map(|(i, (p, _))| (p.clone(), i as i32)).collect();
    nodes
        .into_iter()
        .map(|(path, mut rec)| {
            rec.node_id = ids[&path];
            rec.parent_id = path.split_last().map(|(_, parent)| ids[parent]);
            rec
        })
        .collect()
}

/// Where a node's children go in the tree, and what each gets.
struct ChildrenAt<'a> {
    path: &'a [u32],
    depth: u32,
    /// The first child's index among its parent's children.
    first_index: u32,
    share: Option<u32>,
    /// The parent's step that launched them.
    spawn_step: i32,
}

/// Why a node may not launch `wanted` more children now, if it may not.
fn spawn_refusal(tree: &TreeCtx, depth: u32, launched: u32, wanted: usize, share: Option<u32>) -> Option<Refusal> {
    let limits = &tree.limits;
    if depth + 1 > limits.max_depth {
        Some(Refusal::Depth)
    } else if launched + wanted as u32 > limits.max_children {
        Some(Refusal::Children)
    } else if tree.node_count.load(Ordering::SeqCst) + wanted as u32 > limits.max_nodes || share == Some(0) {
        Some(Refusal::Nodes)
    } else {
        None
    }
}

/// Start one task per goal, in order. The children take over their parent's active slot (plus
/// k−1 more); the last of them to end hands it back.
fn launch_children(b: &Batcher, tree: &Arc<TreeCtx>, at: ChildrenAt, goals: Vec<Vec<Tok>>) -> Vec<tokio::task::JoinHandle<Outcome>> {
    tree.node_count.fetch_add(goals.len() as u32, Ordering::SeqCst);
    let k = goals.len();
    if k > 1 {
        b.activate(k - 1);
    }
    let left = Arc::new(AtomicUsize::new(k));
    goals
        .into_iter()
        .enumerate()
        .map(|(i, g)| {
            let mut child_path = at.path.to_vec();
            child_path.push(at.first_index + i as u32);
            let family = Some(left.clone());
            tokio::spawn(run_node(b.clone(), tree.clone(), child_path, at.depth + 1, g, at.share, Some(at.spawn_step), family))
        })
        .collect()
}

/// A text policy's node in its model's tokens (token in, token out): its context, what it was
/// fed before each action, and whose tokens they are.
#[derive(Default)]
struct ModelView {
    context: Vec<u32>,
    fed: Vec<Vec<u32>>,
    space: String,
}

impl ModelView {
    /// An action's tokens: into the context, and into the turn as the record keeps them.
    fn take(&mut self, turn: &mut Turn, m: crate::policy::ModelTokens) {
        self.context.extend(&m.fed);
        self.context.extend(&m.sampled);
        turn.completion_ids = m.sampled;
        turn.logprobs = m.logprobs;
        self.fed.push(m.fed);
        self.space = m.space.to_string();
    }
}

/// A text policy's node in its model's tokens: each turn's observation as the model was fed it
/// (what came before the next action; nothing after the last one). Returns the prompt it was fed.
fn in_model_tokens(turns: &mut [Turn], mut model_fed: Vec<Vec<u32>>) -> Vec<u32> {
    for (i, t) in turns.iter_mut().enumerate() {
        t.observation_ids = model_fed.get(i + 1).cloned().unwrap_or_default();
    }
    model_fed.swap_remove(0)
}

/// A node's life. `budget`: steps for its whole subtree (shared budgets, `Limits::subtree_steps`).
/// `siblings_left` counts unfinished siblings: the last one to end hands its active slot back to
/// the parent so the parent is in the very next round.
///
/// Long on purpose: one loop over the node's steps, each reading and changing the same state
/// (context, turns, counters, children's results, budgets); what stands alone is a function
/// above (refusals, launching children, the model's view of the node).
#[allow(clippy::too_many_arguments)]
fn run_node(
    b: Batcher,
    tree: Arc<TreeCtx>,
    path: Vec<u32>,
    depth: u32,
    goal: Vec<Tok>,
    budget: Option<u32>,
    spawn_step: Option<i32>,
    siblings_left: Option<Arc<AtomicUsize>>,
) -> BoxFuture<'static, Outcome> {
    Box::pin(async move {
        let ep = tree.spec.episode.clone();
        let vocab = ep.vocab();
        let limits = tree.limits;
        let mode = tree.spec.mode;
        let recursive = mode.is_recursive();
        let started_ms = now_ms();
        let prompt = ep.prompt(&goal, depth, recursive);
        let mut context = prompt.clone();
        let mut turns: Vec<Turn> = Vec::new();
        let mut own: BTreeMap<String, i64> = BTreeMap::new();
        let mut subtree: BTreeMap<String, i64> = BTreeMap::new();
        let mut result: Option<String> = None;
        // Results of finished children, in launch order: the node's variables.
        let mut child_results: Vec<Option<String>> = Vec::new();
        let mut children_launched: u32 = 0;
        let mut end_status = if context.len() >= limits.window { Some(NodeStatus::ContextOverflow) } else { None };
        let mut steps: u32 = 0;
        let mut model = ModelView::default();
        // Steps the node's finished children's subtrees took (what they spent of `budget`).
        let mut descendant_steps: u32 = 0;
        while end_status.is_none() {
            let own_budget = if depth == 0 { limits.root_step_budget.unwrap_or(limits.step_budget) } else { limits.step_budget };
            if steps >= own_budget || budget.is_some_and(|total| steps + descendant_steps >= total) {
                end_status = Some(NodeStatus::StepBudget);
                break;
            }
            let req = Request {
                context: context.clone(),
                max_new_tokens: limits.window - context.len(),
                seed: request_seed(tree.spec.seed, &path, steps),
                mode,
                model_context: model.context.clone(),
            };
            let (resp, ticket) = b.request((tree.idx, path.clone()), req).await;
            b.wait_turn(ticket).await;
            steps += 1;
            context.extend(&resp.tokens);
            let mut turn = Turn {
                completion_ids: resp.tokens.clone(),
                logprobs: resp.logprobs.clone(),
                action: vocab.text(&resp.tokens),
                ..Default::default()
            };
            if let Some(m) = resp.model {
                model.take(&mut turn, m);
            }
            if resp.tokens.last() != Some(&EOS) {
                // The action did not fit in the window.
                turns.push(turn);
                end_status = Some(NodeStatus::ContextOverflow);
                b.end_turn(ticket);
                break;
            }
            let action = &resp.tokens[..resp.tokens.len() - 1];
            let out = ep.step_with_results(&goal, action, recursive, &child_results);
            for (k, v) in out.counters {
                *own.entry(k.clone()).or_default() += v;
                *subtree.entry(k).or_default() += v;
            }
            if out.result.is_some() {
                result = out.result;
            }
            let obs: Vec<Tok> = match out.step {
                Step::Finish => {
                    turns.push(turn);
                    end_status = Some(NodeStatus::Finished);
                    b.end_turn(ticket);
                    break;
                }
                Step::Observe(obs) => obs,
                Step::Spawn(goals) => {
                    // Shared budget: each child's share of what is left after this step, one
                    // step kept for the node itself.
                    let share = budget.map(|total| total.saturating_sub(steps + descendant_steps + 1) / goals.len().max(1) as u32);
                    match spawn_refusal(&tree, depth, children_launched, goals.len(), share) {
                        Some(why) => ep.refusal(why),
                        None => {
                            let k = goals.len() as u32;
                            let at = ChildrenAt { path: &path, depth, first_index: children_launched, share, spawn_step: steps as i32 - 1 };
                            let handles = launch_children(&b, &tree, at, goals);
                            children_launched += k;
                            b.end_turn(ticket);
                            let mut receipts = vec![OBS];
                            for h in handles {
                                let child = h.await.expect("a node task panicked");
                                for (k, v) in &child.subtree {
                                    *subtree.entry(k.clone()).or_default() += v;
                                }
                                descendant_steps += child.subtree_steps;
                                receipts.extend(ep.receipt(child.score, child.result.as_deref()));
                                child_results.push(child.result);
                            }
                            // Back in the rounds (the last child handed us its slot).
                            turn.observation = vocab.text(&receipts);
                            if context.len() + receipts.len() > limits.window {
                                turns.push(turn);
                                end_status = Some(NodeStatus::ContextOverflow);
                                break;
                            }
                            context.extend(&receipts);
                            turn.observation_ids = receipts;
                            turns.push(turn);
                            continue;
                        }
                    }
                }
            };
            turn.observation = vocab.text(&obs);
            if context.len() + obs.len() > limits.window {
                turns.push(turn);
                end_status = Some(NodeStatus::ContextOverflow);
                b.end_turn(ticket);
                break;
            }
            context.extend(&obs);
            turn.observation_ids = obs;
            turns.push(turn);
            b.end_turn(ticket);
        }
        let status = end_status.unwrap_or(NodeStatus::StepBudget);
        let score = ep.verify(&goal, status == NodeStatus::Finished, result.as_deref(), &subtree);
        let generated: usize = turns.iter().map(|t| t.completion_ids.len()).sum();
        let token_space = std::mem::take(&mut model.space);
        let (prompt_ids, context_tokens) = match model.fed.is_empty() {
            true => (prompt, context.len()),
            false => {
                let context_tokens = model.context.len();
                (in_model_tokens(&mut turns, model.fed), context_tokens)
            }
        };
        let rec = NodeRecord {
            run: tree.meta.run.clone(),
            iteration: tree.meta.iteration,
            env: tree.meta.env.clone(),
            mode,
            task_id: tree.spec.task_id.clone(),
            group: tree.spec.group,
            depth: depth as i32,
            child_index: path.last().copied().unwrap_or(0) as i32,
            spawn_step,
            policy_version: tree.version,
            goal: vocab.text(&goal),
            goal_ids: goal.clone(),
            status,
            score,
            steps: steps as i32,
            token_space,
            prompt_ids,
            turns,
            context_tokens: context_tokens as i32,
            generated_tokens: generated as i32,
            result: result.clone(),
            counters: own,
            started_ms,
            finished_ms: now_ms(),
            ..Default::default()
        };
        tree.nodes.lock().push((path, rec));
        // Leave the rounds: the last of a family hands its slot to the waiting parent.
        match siblings_left {
            Some(left) if left.fetch_sub(1, Ordering::SeqCst) == 1 => {}
            _ => b.deactivate(1),
        }
        Outcome { score, result, subtree, subtree_steps: steps + descendant_steps }
    })
}
