//! `advantage`: local rewards, leave-one-out baselines, depth weights → columns of new trees.

use futures::future::BoxFuture;
use rao_core::rao::{AdvantageConfig, Baseline, assign};
use rao_pipeline::{InputDecl, StageContext, TypedStage};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::training::{read_trees, write_trees};

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdvantageParams {
    /// Delegation bonus λ.
    #[serde(default)]
    pub lambda: f64,
    #[serde(default = "loo")]
    pub baseline: Baseline,
    #[serde(default = "crate::defaults::yes")]
    pub depth_weighting: bool,
}

fn loo() -> Baseline {
    Baseline::LeaveOneOut
}

pub struct Advantage;

impl TypedStage for Advantage {
    fn code() -> &'static str {
        crate::code::of("advantage")
    }
    type Params = AdvantageParams;
    const NAME: &'static str = crate::kinds::ADVANTAGE;
    const VERSION: u32 = 1;
    const DESCRIBE: &'static str = "RAO advantages: local rewards with delegation bonus, leave-one-out baseline per group, depth weights";
    const INPUTS: &'static [InputDecl] = &[InputDecl { name: "trees", required: true }];
    const OUTPUTS: &'static [&'static str] = &["trees"];

    fn run(ctx: StageContext, p: AdvantageParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            let mut nodes = read_trees(&ctx, "trees").await?;
            let stats = assign(&mut nodes, &AdvantageConfig { lambda: p.lambda, baseline: p.baseline, depth_weighting: p.depth_weighting });
            ctx.set_metric("groups", stats.groups as f64);
            ctx.set_metric("dropped_groups", stats.dropped_groups as f64);
            ctx.set_metric("nodes_kept", stats.nodes_kept as f64);
            let r: Vec<f64> = nodes.iter().filter(|n| n.parent_id.is_none()).filter_map(|n| n.local_reward).collect();
            ctx.set_metric("mean_root_reward", r.iter().sum::<f64>() / r.len().max(1) as f64);
            write_trees(&ctx, "trees", &nodes)
        })
    }
}
