//! An LLM judge over an OpenAI-compatible chat-completions endpoint: a rubric prompt with the
//! node's goal, actions and result; a JSON verdict back. Timeouts, retries, the concurrency
//! limit and the answer cache are the shared client's (`chat_api`).

use std::path::Path;
use std::sync::Arc;

use rao_core::NodeRecord;

use crate::chat_api::{ApiStats, ChatApi, ChatEndpoint};

/// The judge's endpoint: any OpenAI-compatible chat-completions API.
pub type LlmJudgeParams = ChatEndpoint;

pub type JudgeStats = ApiStats;

pub struct LlmJudge {
    api: ChatApi,
}

const RUBRIC: &str = "You grade one step of an agent's work. Given its goal, its actions with the environment's \
observations, and how it ended, decide whether the agent achieved its goal. Answer with JSON only: \
{\"score\": <number between 0 and 1>, \"reason\": \"<one sentence>\"}.";

impl LlmJudge {
    /// `base_dir`: where a relative `cache_dir` lives.
    pub fn new(cfg: LlmJudgeParams, base_dir: &Path) -> anyhow::Result<Self> {
        Ok(LlmJudge { api: ChatApi::new(cfg, base_dir)? })
    }

    /// What the judge sees of a node.
    pub fn render(n: &NodeRecord) -> String {
        let mut s = format!("Goal: {}\nActions:\n", n.goal);
        for t in &n.turns {
            s.push_str(&format!("- {} -> {}\n", t.action.trim_end_matches(" <eos>"), t.observation.trim_start_matches("<obs>").trim()));
        }
        s.push_str(&format!("Ended: {}\n", n.status));
        if let Some(r) = &n.result {
            s.push_str(&format!("Result: {r}\n"));
        }
        s
    }

    /// Score every node (replacing `score`, setting `judge`), `concurrency` requests at a time.
    pub async fn score_nodes(self: &Arc<Self>, nodes: &mut [NodeRecord]) -> anyhow::Result<JudgeStats> {
        let handles: Vec<_> = nodes
            .iter()
            .map(|n| {
                let (me, content) = (self.clone(), Self::render(n));
                tokio::spawn(async move { me.judge(&content).await })
            })
            .collect();
        for (n, h) in nodes.iter_mut().zip(handles) {
            n.score = h.await??;
            n.judge = Some(format!("llm:{}", self.api.endpoint.model));
        }
        Ok(self.api.stats())
    }

    async fn judge(&self, content: &str) -> anyhow::Result<f64> {
        let body = serde_json::json!({
            "temperature": 0,
            "messages": [{"role": "system", "content": RUBRIC}, {"role": "user", "content": content}],
        });
        let answer = self.api.complete(body, |text| parse_verdict(text).is_some()).await?;
        parse_verdict(&answer).ok_or_else(|| anyhow::anyhow!("the judge's answer is not a JSON verdict: {answer:.200}"))
    }
}

/// `{"score": x, ...}` anywhere in the answer; clamped to [0, 1].
pub fn parse_verdict(text: &str) -> Option<f64> {
    let start = text.find('{')?;
    let end = text.rfind('}')?;
    let v: serde_json::Value = serde_json::from_str(text.get(start..=end)?).ok()?;
    v["score"].as_f64().map(|s| s.clamp(0.0, 1.0))
}
