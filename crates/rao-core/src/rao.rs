//! RAO's training signal (RAO.md §2–4): local node rewards with a delegation bonus, a
//! leave-one-out baseline per group of G trees, and depth inverse-frequency weights.

use std::collections::BTreeMap;

use crate::tree::{GroupKey, NodeRecord, TreeKey};

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Baseline {
    /// b_i = mean of the other G−1 roots' rewards (RAO).
    LeaveOneOut,
    /// b_i = mean of all G roots' rewards (an ablation).
    Mean,
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct AdvantageConfig {
    /// Delegation bonus λ: R(X) = s(X) + λ · mean of the children's scores.
    pub lambda: f64,
    pub baseline: Baseline,
    /// Depth inverse-frequency weights w_d = α / N_d (else all 1).
    pub depth_weighting: bool,
}

impl Default for AdvantageConfig {
    fn default() -> Self {
        AdvantageConfig { lambda: 0.0, baseline: Baseline::LeaveOneOut, depth_weighting: true }
    }
}

/// What `assign` did, for metrics.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct AdvantageStats {
    pub groups: usize,
    pub dropped_groups: usize,
    pub nodes_kept: usize,
    /// Nodes per depth among kept trees (N_d).
    pub nodes_per_depth: BTreeMap<i32, usize>,
    pub weights: BTreeMap<i32, f64>,
}

/// Fill `local_reward`, `baseline`, `advantage` and `depth_weight` of every node of kept groups;
/// nodes of dropped (zero-variance) groups keep `None` and are not trained on.
/// A group is all trees with the same iteration, mode and task (`GroupKey`); trees are told
/// apart by `group`.
pub fn assign(nodes: &mut [NodeRecord], cfg: &AdvantageConfig) -> AdvantageStats {
    // Local rewards.
    let mut child_scores: BTreeMap<(TreeKey, i32), Vec<f64>> = BTreeMap::new();
    for n in nodes.iter() {
        if let Some(p) = n.parent_id {
            child_scores.entry((n.tree_key(), p)).or_default().push(n.score);
        }
    }
    let local: Vec<f64> = nodes
        .iter()
        .map(|n| {
            let bonus = child_scores.get(&(n.tree_key(), n.node_id)).map(|c| c.iter().sum::<f64>() / c.len() as f64).unwrap_or(0.0);
            n.score + cfg.lambda * bonus
        })
        .collect();
    // Root rewards per task group.
    let mut roots: BTreeMap<GroupKey, BTreeMap<i32, f64>> = BTreeMap::new();
    for (n, r) in nodes.iter().zip(&local) {
        if n.parent_id.is_none() {
            let tree = n.tree_key();
            roots.entry(tree.group_key()).or_default().insert(tree.group, *r);
        }
    }
    let mut stats = AdvantageStats { groups: roots.len(), ..Default::default() };
    let mut baseline: BTreeMap<TreeKey, f64> = BTreeMap::new();
    for (group, rs) in &roots {
        let g = rs.len();
        let total: f64 = rs.values().sum();
        let centred: Vec<f64> = rs.values().map(|r| r - total / g as f64).collect();
        // No signal: every tree did equally well (or only one tree).
        if g < 2 || centred.iter().all(|c| (c - centred[0]).abs() < 1e-12) {
            stats.dropped_groups += 1;
            continue;
        }
        for (grp, r) in rs {
            let b = match cfg.baseline {
                Baseline::LeaveOneOut => (total - r) / (g - 1) as f64,
                Baseline::Mean => total / g as f64,
            };
            baseline.insert(group.tree(*grp), b);
        }
    }
    let kept: Vec<bool> = nodes.iter().map(|n| baseline.contains_key(&n.tree_key())).collect();
    for (n, k) in nodes.iter().zip(&kept) {
        if *k {
            *stats.nodes_per_depth.entry(n.depth).or_default() += 1;
        }
    }
    // w_d = α / N_d with α = Σ_d D_d / Σ_d (D_d / N_d); every node is one training sequence, so
    // D_d = N_d here and the weights average 1 over sequences.
    let weights: BTreeMap<i32, f64> = if cfg.depth_weighting && !stats.nodes_per_depth.is_empty() {
        let total: f64 = stats.nodes_per_depth.values().map(|&n| n as f64).sum();
        let alpha = total / stats.nodes_per_depth.len() as f64;
        stats.nodes_per_depth.iter().map(|(d, &n)| (*d, alpha / n as f64)).collect()
    } else {
        stats.nodes_per_depth.keys().map(|d| (*d, 1.0)).collect()
    };
    for ((n, r), k) in nodes.iter_mut().zip(local).zip(kept) {
        n.local_reward = Some(r);
        if !k {
            n.baseline = None;
            n.advantage = None;
            n.depth_weight = None;
            continue;
        }
        let b = baseline[&n.tree_key()];
        let w = weights[&n.depth];
        n.baseline = Some(b);
        n.depth_weight = Some(w);
        n.advantage = Some(w * (r - b));
        stats.nodes_kept += 1;
    }
    stats.weights = weights;
    stats
}
