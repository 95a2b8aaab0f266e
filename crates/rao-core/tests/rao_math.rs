//! RAO's reward arithmetic against hand-computed values (RAO.md §2–4).

use rao_core::NodeRecord;
use rao_core::rao::{AdvantageConfig, Baseline, assign};

fn node(task: &str, group: i32, id: i32, parent: Option<i32>, depth: i32, score: f64) -> NodeRecord {
    NodeRecord { task_id: task.into(), group, node_id: id, parent_id: parent, depth, score, ..Default::default() }
}

/// Task T, G = 4 trees (3 levels in tree 0), plus task U whose 4 roots all succeed.
fn batch() -> Vec<NodeRecord> {
    vec![
        node("T", 0, 0, None, 0, 1.0),
        node("T", 0, 1, Some(0), 1, 1.0),
        node("T", 0, 2, Some(0), 1, 0.0),
        node("T", 0, 3, Some(1), 2, 1.0),
        node("T", 1, 0, None, 0, 0.0),
        node("T", 2, 0, None, 0, 1.0),
        node("T", 2, 1, Some(0), 1, 1.0),
        node("T", 3, 0, None, 0, 0.0),
        node("T", 3, 1, Some(0), 1, 0.0),
        node("U", 0, 0, None, 0, 1.0),
        node("U", 1, 0, None, 0, 1.0),
        node("U", 2, 0, None, 0, 1.0),
        node("U", 3, 0, None, 0, 1.0),
    ]
}

fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-9, "{a} != {b}");
}

#[test]
fn local_rewards_loo_baseline_and_depth_weights_by_hand() {
    let mut nodes = batch();
    let stats = assign(&mut nodes, &AdvantageConfig { lambda: 0.4, baseline: Baseline::LeaveOneOut, depth_weighting: true });
    // R = s + λ·mean(children's s); bonuses do not compound.
    let r: Vec<f64> = nodes.iter().map(|n| n.local_reward.unwrap()).collect();
    for (got, want) in r.iter().zip([1.2, 1.4, 0.0, 1.0, 0.0, 1.4, 1.0, 0.0, 0.0]) {
        close(*got, want);
    }
    // Roots 1.2, 0, 1.4, 0 → leave-one-out baselines.
    close(nodes[0].baseline.unwrap(), 1.4 / 3.0);
    close(nodes[3].baseline.unwrap(), 1.4 / 3.0);
    close(nodes[4].baseline.unwrap(), 2.6 / 3.0);
    close(nodes[5].baseline.unwrap(), 1.2 / 3.0);
    // N_0 = 4, N_1 = 4, N_2 = 1 → α = 9 / 3 = 3, w = 0.75, 0.75, 3.
    close(nodes[1].depth_weight.unwrap(), 0.75);
    close(nodes[3].depth_weight.unwrap(), 3.0);
    close(nodes[1].advantage.unwrap(), 0.75 * (1.4 - 1.4 / 3.0));
    close(nodes[3].advantage.unwrap(), 3.0 * (1.0 - 1.4 / 3.0));
    close(nodes[4].advantage.unwrap(), 0.75 * (0.0 - 2.6 / 3.0));
    // Weights average 1 over the training sequences kept.
    let kept: Vec<f64> = nodes.iter().filter_map(|n| n.depth_weight).collect();
    close(kept.iter().sum::<f64>() / kept.len() as f64, 1.0);
    // Task U: every root succeeded — no signal, dropped.
    assert_eq!(stats.groups, 2);
    assert_eq!(stats.dropped_groups, 1);
    assert!(nodes[9..].iter().all(|n| n.advantage.is_none()));
    assert_eq!(stats.nodes_kept, 9);
}

#[test]
fn lambda_zero_mean_baseline_and_no_depth_weighting() {
    let mut nodes = batch();
    assign(&mut nodes, &AdvantageConfig { lambda: 0.0, baseline: Baseline::Mean, depth_weighting: false });
    close(nodes[0].local_reward.unwrap(), 1.0);
    // Roots 1, 0, 1, 0 → mean baseline 0.5 for every tree.
    assert!(nodes[..9].iter().all(|n| (n.baseline.unwrap() - 0.5).abs() < 1e-12));
    close(nodes[3].advantage.unwrap(), 0.5);
    close(nodes[4].advantage.unwrap(), -0.5);
    assert!(nodes[..9].iter().all(|n| n.depth_weight == Some(1.0)));
}
