//! The trainable policy: batched constrained sampling with a KV cache, sequence log-probs under
//! the same grammar mask, RL losses (CISPO, REINFORCE, PPO-clip), supervised warm start, and
//! checkpoints.

use burn::module::Module;
use burn::store::ModuleRecord;
use burn::tensor::Bytes;
use burn::tensor::{Device, Int, Tensor, TensorData};
use rao_envs::grammar::Grammar;
use rao_envs::rng::Rng;
use rao_envs::vocab::{EOS, PAD, Tok};
use serde::{Deserialize, Serialize};

use crate::chunking;
use crate::lora::{self, LoraConfig};
use crate::model::{KvCache, LayerKv, ModelConfig, Transformer, init_params};
use crate::params::{AdamW, bytes_to_f32s, f32s_to_bytes, param_shapes, read_grads_where, read_params_where, write_params_where};
use crate::prefix_cache::{Hit, LayerRows, PrefixCache};

/// Masked logits and attention scores: −∞ is exact (exp gives 0) and cheap (glibc's expf returns
/// at once for −∞, where a large finite negative takes its slow underflow path).
const NEG: f32 = f32::NEG_INFINITY;

/// Where tensors live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Burn's pure-Rust CPU backend (Flex, threaded + SIMD). Runs anywhere.
    #[default]
    Cpu,
    /// wgpu (Vulkan/Metal/DX12/GL) — needs a build with `--features wgpu`.
    Wgpu,
}

pub fn device(backend: Backend) -> anyhow::Result<Device> {
    match backend {
        Backend::Cpu => Ok(Device::flex()),
        Backend::Wgpu => wgpu_device(),
    }
}

/// The wgpu device, set up once per process: Burn registers its runtime on the first
/// `init` and refuses a second ("Service already initialized"), so a second policy on wgpu in
/// the same process shares the first one's device.
#[cfg(feature = "wgpu")]
fn wgpu_device() -> anyhow::Result<Device> {
    static DEVICE: std::sync::OnceLock<Result<Device, String>> = std::sync::OnceLock::new();
    DEVICE.get_or_init(|| Device::wgpu_options().init().map_err(|e| e.to_string())).clone().map_err(|e| {
        anyhow::anyhow!(
            "no wgpu adapter found ({e}). Install a GPU or a Vulkan driver (Debian: `apt install mesa-vulkan-drivers libvulkan1` gives a software one), or set `backend: cpu`"
        )
    })
}

#[cfg(not(feature = "wgpu"))]
fn wgpu_device() -> anyhow::Result<Device> {
    anyhow::bail!("this rao was built without the GPU backend: rebuild with `cargo build --release --features wgpu`, or set `backend: cpu`")
}

/// One node asking for its next action.
#[derive(Debug, Clone)]
pub struct SampleRequest {
    pub context: Vec<Tok>,
    pub max_new_tokens: usize,
    pub seed: u64,
    pub recursive: bool,
}

/// One training sequence: a node's tokens, which of them the policy generated, their behaviour
/// log-probs, and the node's advantage.
#[derive(Debug, Clone)]
pub struct Sequence {
    pub tokens: Vec<Tok>,
    pub generated: Vec<bool>,
    pub old_logprobs: Vec<f32>,
    pub advantage: f32,
    pub recursive: bool,
}

impl Sequence {
    /// A prompt followed by one sampled completion and the log-probs it was sampled with.
    pub fn from_completion(context: &[Tok], completion: &[Tok], logprobs: &[f32], advantage: f32, recursive: bool) -> Sequence {
        let tokens = [context, completion].concat();
        let generated = std::iter::repeat_n(false, context.len()).chain(std::iter::repeat_n(true, completion.len())).collect();
        let old_logprobs = std::iter::repeat_n(0.0, context.len()).chain(logprobs.iter().copied()).collect();
        Sequence { tokens, generated, old_logprobs, advantage, recursive }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Loss {
    /// CISPO: −sg(clip(ρ, lo, hi)) · A · log π, token mean.
    Cispo { lo: f64, hi: f64 },
    /// Plain policy gradient: −A · log π.
    Reinforce,
    /// PPO-clip: −min(ρA, clip(ρ, 1−ε, 1+ε)A).
    PpoClip { epsilon: f64 },
    /// Supervised next-token (warm start): −log π of the demonstrated tokens.
    Supervised,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StepMetrics {
    pub loss: f64,
    pub mean_abs_ratio_minus_1: f64,
    pub clip_fraction: f64,
    pub grad_norm: f64,
    pub tokens: usize,
    pub sequences: usize,
}

/// Serialised policy: config + metadata, the parameters as a Burn record (burnpack bytes, what
/// `Module::load_record` reads), and the optimiser moments (flat f32, parameter visit order).
/// A policy with LoRA adapters saves only what it trains: the factors (flat f32, visit order)
/// and their moments; its base is the checkpoint it was loaded from.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub meta: CheckpointMeta,
    pub params: Vec<u8>,
    pub optim: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointMeta {
    pub config: ModelConfig,
    pub version: i32,
    pub optimizer: AdamW,
    pub param_sizes: Vec<usize>,
    pub param_shapes: Vec<Vec<usize>>,
    /// Tokens that end a completion, when not the environments' `<eos>` (a language model's
    /// end-of-turn tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_tokens: Option<Vec<Tok>>,
    /// The adapters' settings when `params` holds LoRA factors only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
}

/// A clone shares the parameters' storage until one of the two trains (Burn's tensors are
/// copy-on-write): a cheap snapshot.
#[derive(Clone)]
pub struct Policy {
    pub cfg: ModelConfig,
    pub model: Transformer,
    pub device: Device,
    pub optim: AdamW,
    pub version: i32,
    /// Tokens that end a completion (the environments' `<eos>` unless a language model says
    /// otherwise); the first one pads forced actions.
    pub stop_tokens: Vec<Tok>,
    /// LoRA adapters on a frozen base, when present.
    pub lora: Option<LoraConfig>,
    /// Which parameters (visit order) the optimiser updates: all, or the adapters' factors.
    trainable: Vec<bool>,
}

impl Policy {
    pub fn new(cfg: ModelConfig, backend: Backend, seed: u64) -> anyhow::Result<Policy> {
        anyhow::ensure!(cfg.vocab > 0, "model vocabulary size is 0");
        cfg.check().map_err(|e| anyhow::anyhow!("invalid model config: {e}"))?;
        let device = device(backend)?;
        let model = init_params(Transformer::new(&cfg, &device.clone().autodiff()), seed);
        let trainable = lora::trainable(&model);
        Ok(Policy { cfg, model, device, optim: AdamW::new(1.0, 0.0), version: 0, stop_tokens: vec![EOS], lora: None, trainable })
    }

    /// A policy over given parameter values (in visit order, [`crate::params::read_params`]),
    /// e.g. a pretrained model's.
    pub fn from_values(cfg: ModelConfig, backend: Backend, values: Vec<Vec<f32>>, stop_tokens: Vec<Tok>) -> anyhow::Result<Policy> {
        anyhow::ensure!(cfg.vocab > 0, "model vocabulary size is 0");
        cfg.check().map_err(|e| anyhow::anyhow!("invalid model config: {e}"))?;
        anyhow::ensure!(!stop_tokens.is_empty(), "a policy needs at least one stop token");
        let device = device(backend)?;
        let model = crate::model::model_from_values(&cfg, &device.clone().autodiff(), values)?;
        let trainable = lora::trainable(&model);
        Ok(Policy { cfg, model, device, optim: AdamW::new(1.0, 0.0), version: 0, stop_tokens, lora: None, trainable })
    }

    /// Freezes the model and adds LoRA adapters (see [`lora::apply`]); from here on only the
    /// adapters train and checkpoints hold only them. The optimiser starts afresh.
    pub fn add_lora(&mut self, cfg: LoraConfig, seed: u64) -> anyhow::Result<()> {
        anyhow::ensure!(self.lora.is_none(), "the policy has LoRA adapters already");
        self.model = lora::apply(self.model.clone(), &self.cfg, &cfg, seed)?;
        self.trainable = lora::trainable(&self.model);
        self.optim = AdamW::new(self.optim.clip_norm, self.optim.weight_decay);
        self.lora = Some(cfg);
        Ok(())
    }

    /// Which parameters (visit order) the optimiser updates.
    pub fn trainable_mask(&self) -> &[bool] {
        &self.trainable
    }

    /// The values of the parameters the optimiser updates (visit order).
    pub fn trainable_params(&self) -> Vec<Vec<f32>> {
        read_params_where(&self.model, Some(&self.trainable))
    }

    /// Writes the adapters as a PEFT adapter directory for the base checkpoint `base` (the
    /// `base_model_name_or_path` peft loads them onto).
    pub fn export_peft(&self, base: &str, out: &std::path::Path) -> anyhow::Result<()> {
        let cfg = self.lora.as_ref().ok_or_else(|| anyhow::anyhow!("the policy has no LoRA adapters to export"))?;
        lora::export_peft(&self.cfg, cfg, &self.trainable_params(), base, out)
    }

    pub fn checkpoint(&self) -> Checkpoint {
        let params = self.trainable_params();
        let shapes: Vec<Vec<usize>> =
            param_shapes(&self.model).into_iter().zip(&self.trainable).filter(|(_, t)| **t).map(|(s, _)| s).collect();
        let bytes = match self.lora {
            None => self.model.valid().into_record().into_bytes().expect("a Burn record of in-memory parameters").to_vec(),
            Some(_) => f32s_to_bytes(&params),
        };
        Checkpoint {
            meta: CheckpointMeta {
                config: self.cfg.clone(),
                version: self.version,
                optimizer: self.optim.clone(),
                param_sizes: params.iter().map(|p| p.len()).collect(),
                param_shapes: shapes,
                stop_tokens: (self.stop_tokens != [EOS]).then(|| self.stop_tokens.clone()),
                lora: self.lora.clone(),
            },
            params: bytes,
            optim: [f32s_to_bytes(&self.optim.m), f32s_to_bytes(&self.optim.v)].concat(),
        }
    }

    /// Restores a checkpoint of LoRA adapters ([`Policy::checkpoint`] of an adapted policy) onto
    /// this policy, its base (replacing its adapters' values if it has the same adapters).
    pub fn load_adapters(&mut self, ck: &Checkpoint) -> anyhow::Result<()> {
        let cfg = ck.meta.lora.clone().ok_or_else(|| anyhow::anyhow!("the checkpoint holds no LoRA adapters"))?;
        anyhow::ensure!(ck.meta.config == self.cfg, "the adapters were trained on a model of another shape");
        match &self.lora {
            None => self.add_lora(cfg, 0)?,
            Some(have) => anyhow::ensure!(*have == cfg, "the policy has other adapters than the checkpoint's"),
        }
        let shapes: Vec<Vec<usize>> =
            param_shapes(&self.model).into_iter().zip(&self.trainable).filter(|(_, t)| **t).map(|(s, _)| s).collect();
        anyhow::ensure!(shapes == ck.meta.param_shapes, "the checkpoint's adapter shapes do not match its LoRA settings");
        let values = bytes_to_f32s(&ck.params, &ck.meta.param_sizes)?;
        self.model = write_params_where(self.model.clone(), Some(&self.trainable), &values);
        self.restore_optimizer(ck)?;
        self.version = ck.meta.version;
        Ok(())
    }

    fn restore_optimizer(&mut self, ck: &Checkpoint) -> anyhow::Result<()> {
        self.optim = ck.meta.optimizer.clone();
        if !ck.optim.is_empty() {
            let both = bytes_to_f32s(&ck.optim, &[ck.meta.param_sizes.clone(), ck.meta.param_sizes.clone()].concat())?;
            let (m, v) = both.split_at(ck.meta.param_sizes.len());
            self.optim.m = m.to_vec();
            self.optim.v = v.to_vec();
        }
        Ok(())
    }

    pub fn from_checkpoint(ck: &Checkpoint, backend: Backend) -> anyhow::Result<Policy> {
        anyhow::ensure!(
            ck.meta.lora.is_none(),
            "the checkpoint holds LoRA adapters only: load its base model and call Policy::load_adapters"
        );
        let mut p = Policy::new(ck.meta.config.clone(), backend, 0)?;
        anyhow::ensure!(param_shapes(&p.model) == ck.meta.param_shapes, "checkpoint shapes do not match its model config");
        let record = ModuleRecord::from_bytes(Bytes::from_bytes_vec(ck.params.clone()))
            .map_err(|e| anyhow::anyhow!("checkpoint parameters are not a readable Burn record: {e:?}"))?;
        p.model = p.model.try_load_record(record).map_err(|e| anyhow::anyhow!("checkpoint parameters do not fit the model: {e:?}"))?;
        p.restore_optimizer(ck)?;
        p.version = ck.meta.version;
        if let Some(stop) = &ck.meta.stop_tokens {
            anyhow::ensure!(
                !stop.is_empty() && stop.iter().all(|&t| (t as usize) < p.cfg.vocab),
                "checkpoint stop tokens must lie in the vocabulary"
            );
            p.stop_tokens = stop.clone();
        }
        Ok(p)
    }

    /// Generate one action per request, in one batched pass per token (KV cache), sampling only
    /// what the grammar allows. Returns tokens (ending in `<eos>` unless the window ran out) and
    /// the log-prob of each under the distribution actually sampled from.
    pub fn sample(&self, reqs: &[SampleRequest], grammar: &dyn Grammar, temperature: f64) -> Vec<(Vec<Tok>, Vec<f32>)> {
        let mut rngs: Vec<Rng> = reqs.iter().map(|r| Rng::new(r.seed)).collect();
        self.decode(reqs, None, |i, logits, prefix| {
            let allowed = grammar.allowed(reqs[i].recursive, &reqs[i].context, prefix);
            sample_masked(logits, &allowed, temperature, &mut rngs[i])
        })
    }

    /// [`Policy::sample`], reading each context's longest cached prefix from `cache` and
    /// prefilling only the rest; what each row ran (its context and all but its last sampled
    /// token) goes back into the cache for the row's next request. `shared[i] > 0` also keeps
    /// the first `shared[i]` tokens of row `i` as a shared entry (a prompt every node starts
    /// with). Without the fused CPU kernels (the GPU backend) it samples as `sample` does.
    pub fn sample_cached(
        &self,
        reqs: &[SampleRequest],
        shared: &[usize],
        grammar: &dyn Grammar,
        temperature: f64,
        cache: &mut PrefixCache,
    ) -> Vec<(Vec<Tok>, Vec<f32>)> {
        assert_eq!(reqs.len(), shared.len(), "one shared length per request");
        let mut rngs: Vec<Rng> = reqs.iter().map(|r| Rng::new(r.seed)).collect();
        self.decode(reqs, Some((cache, shared)), |i, logits, prefix| {
            let allowed = grammar.allowed(reqs[i].recursive, &reqs[i].context, prefix);
            sample_masked(logits, &allowed, temperature, &mut rngs[i])
        })
    }

    /// Decode the given actions (teacher forcing) with exactly the passes `sample` makes — the
    /// same prefill, KV cache and one batched forward per token — so the compute (and wall
    /// clock) is that of a model that chose these tokens. `actions[i]` should end in `<eos>`;
    /// a row stops there or when its window runs out. Log-probs are the model's own.
    pub fn force(&self, reqs: &[SampleRequest], actions: &[Vec<Tok>]) -> Vec<(Vec<Tok>, Vec<f32>)> {
        self.force_with(reqs, actions, None)
    }

    /// [`Policy::force`] through a prefix cache, as [`Policy::sample_cached`] samples.
    pub fn force_cached(&self, reqs: &[SampleRequest], actions: &[Vec<Tok>], cache: &mut PrefixCache) -> Vec<(Vec<Tok>, Vec<f32>)> {
        self.force_with(reqs, actions, Some((cache, &vec![0; reqs.len()])))
    }

    fn force_with(
        &self,
        reqs: &[SampleRequest],
        actions: &[Vec<Tok>],
        cache: Option<(&mut PrefixCache, &[usize])>,
    ) -> Vec<(Vec<Tok>, Vec<f32>)> {
        assert_eq!(reqs.len(), actions.len(), "one forced action per request");
        self.decode(reqs, cache, |i, logits, prefix| {
            let tok = actions[i].get(prefix.len()).copied().unwrap_or(self.stop_tokens[0]);
            let max = logits.iter().cloned().fold(f32::MIN, f32::max);
            let z: f32 = logits.iter().map(|x| (x - max).exp()).sum();
            (tok, logits[tok as usize] - max - z.ln())
        })
    }

    /// The decoding loop shared by `sample` and `force`: `choose(row, last logits, tokens so
    /// far)` picks each row's next token and its log-prob.
    fn decode(
        &self,
        reqs: &[SampleRequest],
        cache: Option<(&mut PrefixCache, &[usize])>,
        mut choose: impl FnMut(usize, &[f32], &[Tok]) -> (Tok, f32) + Send,
    ) -> Vec<(Vec<Tok>, Vec<f32>)> {
        on_compute_pool(|| self.decode_here(reqs, cache, &mut choose))
    }

    // Long on purpose: prefill and the decode steps share one KV cache, the prefix cache's rows
    // and each row's position and tokens; split apart, every piece would take all of them.
    fn decode_here(
        &self,
        reqs: &[SampleRequest],
        mut prefixes: Option<(&mut PrefixCache, &[usize])>,
        choose: &mut Choose<'_>,
    ) -> Vec<(Vec<Tok>, Vec<f32>)> {
        if reqs.is_empty() {
            return vec![];
        }
        let sizes: Vec<(usize, usize)> = reqs.iter().map(|r| (r.context.len() + r.max_new_tokens, 1)).collect();
        if let Some(runs) = self.gpu_runs(&sizes) {
            // No prefix cache off the CPU (below), so each run decodes alone.
            return runs
                .into_iter()
                .flat_map(|r| self.decode_here(&reqs[r.clone()], None, &mut |i, l, p| choose(r.start + i, l, p)))
                .collect();
        }
        if !crate::kernels::serves(&self.device) {
            prefixes = None; // a cache of host rows needs the fused kernels
        }
        let model = self.model.valid();
        let dev = &self.device;
        let b = reqs.len();
        let lens: Vec<usize> = reqs.iter().map(|r| r.context.len()).collect();
        // Row i's first `cached[i]` positions come from the prefix cache (`c` slots of the KV
        // cache, zeros past a row's own), the rest `new[i]` are prefilled into `t` slots after
        // them; then one slot per decoded token.
        let hits: Vec<Option<Hit>> = match prefixes.as_mut() {
            Some((pc, _)) => reqs.iter().map(|r| pc.lookup(&r.context)).collect(),
            None => vec![None; b],
        };
        let cached: Vec<usize> = hits.iter().map(|h| h.map_or(0, |h| h.len)).collect();
        let new: Vec<usize> = (0..b).map(|i| lens[i] - cached[i]).collect();
        let c = *cached.iter().max().unwrap();
        let t = *new.iter().max().unwrap();
        let mut toks = vec![PAD as i64; b * t];
        let mut prev = vec![PAD as i64; b * t];
        for (i, r) in reqs.iter().enumerate() {
            for j in 0..new[i] {
                let at = cached[i] + j;
                toks[i * t + j] = r.context[at] as i64;
                if at > 0 {
                    prev[i * t + j] = r.context[at - 1] as i64;
                }
            }
        }
        let positions: Vec<Vec<usize>> = (0..b).map(|i| (cached[i]..cached[i] + t).collect()).collect();
        let mut bias = vec![NEG; b * t * (c + t)];
        for i in 0..b {
            for q in 0..t {
                let row = &mut bias[(i * t + q) * (c + t)..(i * t + q + 1) * (c + t)];
                row[..cached[i]].fill(0.0);
                row[c..=c + q.min(new[i] - 1)].fill(0.0);
            }
        }
        let mut cache = KvCache::default();
        if let Some((pc, _)) = prefixes.as_ref()
            && c > 0
        {
            let (layers, dkv) = (self.cfg.n_layers, self.cfg.kv_heads() * self.cfg.head_dim());
            let empty = LayerRows { k: vec![], v: vec![] };
            cache.layers = (0..layers)
                .map(|l| {
                    let rows: Vec<(&[f32], &[f32])> = hits
                        .iter()
                        .map(|h| {
                            let r = h.as_ref().map_or(&empty, |h| &pc.layers(h)[l]);
                            (r.k.as_slice(), r.v.as_slice())
                        })
                        .collect();
                    Some(LayerKv::Rows(crate::kernels::KvRows::from_prefixes(&rows, c, dkv, t + 16)))
                })
                .collect();
        }
        if let Some((pc, _)) = prefixes.as_mut() {
            hits.iter().flatten().for_each(|h| pc.consumed(h));
        }
        let fused = model.fuse();
        let hidden = model.hidden_fused(
            &fused,
            Tensor::<2, Int>::from_data(TensorData::new(toks, [b, t]), dev),
            Tensor::<2, Int>::from_data(TensorData::new(prev, [b, t]), dev),
            &positions,
            Tensor::<4>::from_data(TensorData::new(bias, [b, 1, t, c + t]), dev),
            Some(&mut cache),
        );
        // Logits of each prompt's last position only: all `[B, T, V]` of them would be 2.5 GB at
        // B = T = 64 over Qwen's 151,936 tokens, past what one wgpu buffer may hold (on an H200).
        let last_rows: Vec<i64> = (0..b).map(|i| (i * t + new[i] - 1) as i64).collect();
        let logits = model.head(hidden.select(0, Tensor::<1, Int>::from_data(TensorData::new(last_rows, [b]), dev)));
        let vocab = self.cfg.vocab;
        let all: Vec<f32> = logits.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 logits");
        let mut last: Vec<Vec<f32>> = (0..b).map(|i| all[i * vocab..(i + 1) * vocab].to_vec()).collect();
        let mut out: Vec<(Vec<Tok>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); b];
        let mut done: Vec<bool> = reqs.iter().map(|r| r.max_new_tokens == 0).collect();
        let mut slots = c + t; // keys in the cache
        loop {
            let mut next = vec![PAD as i64; b];
            // The token before each row's next one: the last generated, else the context's last.
            let before: Vec<i64> = (0..b).map(|i| *out[i].0.last().unwrap_or(&reqs[i].context[lens[i] - 1]) as i64).collect();
            for i in 0..b {
                if done[i] {
                    continue;
                }
                let (tok, lp) = choose(i, &last[i], &out[i].0);
                out[i].0.push(tok);
                out[i].1.push(lp);
                next[i] = tok as i64;
                if self.stop_tokens.contains(&tok) || out[i].0.len() >= reqs[i].max_new_tokens {
                    done[i] = true;
                }
            }
            if done.iter().all(|d| *d) {
                break;
            }
            // One more token for every row through the cache.
            let pos: Vec<Vec<usize>> = (0..b).map(|i| vec![lens[i] + out[i].0.len() - 1]).collect();
            let s = slots + 1;
            let mut bias = vec![NEG; b * s];
            for i in 0..b {
                let row = &mut bias[i * s..(i + 1) * s];
                row[..cached[i]].fill(0.0);
                row[c..c + new[i]].fill(0.0);
                row[c + t..].fill(0.0);
            }
            let logits = model.forward_fused(
                &fused,
                Tensor::<2, Int>::from_data(TensorData::new(next, [b, 1]), dev),
                Tensor::<2, Int>::from_data(TensorData::new(before, [b, 1]), dev),
                &pos,
                Tensor::<4>::from_data(TensorData::new(bias, [b, 1, 1, s]), dev),
                Some(&mut cache),
            );
            slots = s;
            let all: Vec<f32> = logits.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 logits");
            last = (0..b).map(|i| all[i * vocab..(i + 1) * vocab].to_vec()).collect();
        }
        if let Some((pc, shared)) = prefixes {
            keep_prefixes(pc, shared, reqs, &out, &cache, (&cached, &new), (c, t));
        }
        out
    }

    /// The model's logits at every position of each prompt (`[len, V]` per prompt), from one
    /// right-padded batch.
    pub fn logits(&self, prompts: &[Vec<Tok>]) -> Vec<Vec<Vec<f32>>> {
        on_compute_pool(|| {
            let model = self.model.valid();
            let dev = &self.device;
            let (b, v) = (prompts.len(), self.cfg.vocab);
            let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
            let t = lens.iter().copied().max().unwrap_or(0).max(1);
            let mut toks = vec![PAD as i64; b * t];
            for (i, p) in prompts.iter().enumerate() {
                for (j, &x) in p.iter().enumerate() {
                    toks[i * t + j] = x as i64;
                }
            }
            let prev = Tensor::<2, Int>::from_data(TensorData::new(previous_tokens(&toks, b, t), [b, t]), dev);
            let positions: Vec<Vec<usize>> = (0..b).map(|_| (0..t).collect()).collect();
            let bias = Tensor::<4>::from_data(TensorData::new(causal_bias(&lens, t), [b, 1, t, t]), dev);
            let logits = model.forward(Tensor::<2, Int>::from_data(TensorData::new(toks, [b, t]), dev), prev, &positions, bias, None);
            let all: Vec<f32> = logits.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 logits");
            (0..b).map(|i| (0..lens[i]).map(|j| all[(i * t + j) * v..(i * t + j + 1) * v].to_vec()).collect()).collect()
        })
    }

    /// Right-padded batch tensors for sequences, and the rows the loss reads: each generated
    /// token's position (row-major `i·T + j`, predicting token `j + 1` of sequence `i`) with its
    /// target, behaviour log-prob, advantage and grammar bias. Only those rows go through the
    /// output layer: with a real vocabulary the `[B, T, V]` logits of every padded position were
    /// most of a step's memory traffic.
    fn batch(&self, seqs: &[Sequence], grammar: &dyn Grammar, dev: &Device) -> Batch {
        let b = seqs.len();
        let t = seqs.iter().map(|s| s.tokens.len()).max().unwrap_or(1).max(2) - 1;
        let v = self.cfg.vocab;
        let mut inputs = vec![PAD as i64; b * t];
        let (mut rows, mut targets, mut old, mut adv, mut gbias) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, s) in seqs.iter().enumerate() {
            let mut action_start = 0;
            for j in 0..s.tokens.len().saturating_sub(1) {
                inputs[i * t + j] = s.tokens[j] as i64;
                if s.generated[j + 1] {
                    if !s.generated[j] {
                        action_start = j + 1;
                    }
                    rows.push((i * t + j) as i64);
                    targets.push(s.tokens[j + 1] as i64);
                    old.push(s.old_logprobs[j + 1]);
                    adv.push(s.advantage);
                    let allowed = grammar.allowed(s.recursive, &s.tokens[..action_start], &s.tokens[action_start..j + 1]);
                    let start = gbias.len();
                    gbias.resize(start + v, NEG);
                    let row = &mut gbias[start..];
                    for a in allowed {
                        row[a as usize] = 0.0;
                    }
                    // A target outside the grammar (never in sampled data) keeps a finite log-prob.
                    row[s.tokens[j + 1] as usize] = 0.0;
                }
            }
        }
        // A batch without generated tokens still reads one row (weight 0), so no tensor is empty.
        let weight = if rows.is_empty() { 0.0 } else { 1.0 };
        if rows.is_empty() {
            rows.push(0);
            targets.push(0);
            old.push(0.0);
            adv.push(0.0);
            gbias.resize(v, 0.0);
        }
        let n = rows.len();
        let lens: Vec<usize> = seqs.iter().map(|s| s.tokens.len() - 1).collect();
        let bias = causal_bias(&lens, t);
        let f1 = |x: Vec<f32>| Tensor::<1>::from_data(TensorData::new(x, [n]), dev);
        Batch {
            prev: Tensor::<2, Int>::from_data(TensorData::new(previous_tokens(&inputs, b, t), [b, t]), dev),
            inputs: Tensor::<2, Int>::from_data(TensorData::new(inputs, [b, t]), dev),
            rows: Tensor::<1, Int>::from_data(TensorData::new(rows, [n]), dev),
            target_ids: targets.iter().map(|&x| x as usize).collect(),
            targets: Tensor::<2, Int>::from_data(TensorData::new(targets, [1, n]), dev),
            mask: f1(vec![weight; n]),
            old: f1(old),
            adv: f1(adv),
            grammar: Tensor::<3>::from_data(TensorData::new(gbias, [1, n, v]), dev),
            attn: Tensor::<4>::from_data(TensorData::new(bias, [b, 1, t, t]), dev),
            positions: (0..b).map(|_| (0..t).collect()).collect(),
        }
    }

    /// Log-probs `[N]` of the batch's target tokens (its `rows`) under the masked, tempered
    /// distribution.
    fn token_logprobs(model: &Transformer, batch: &Batch, temperature: f64) -> Tensor<1> {
        let hidden =
            model.hidden_fused(&model.fuse(), batch.inputs.clone(), batch.prev.clone(), &batch.positions, batch.attn.clone(), None);
        let logits = model.head(hidden.select(0, batch.rows.clone()));
        let [n, v] = logits.dims();
        let lp = crate::kernels::token_logprobs(
            logits.reshape([1, n, v]),
            batch.grammar.clone(),
            &batch.targets,
            &batch.target_ids,
            temperature,
        );
        lp.reshape([n])
    }

    /// Current log-probs of the generated tokens of each sequence (no gradient).
    pub fn sequence_logprobs(&self, seqs: &[Sequence], grammar: &dyn Grammar, temperature: f64) -> Vec<Vec<f32>> {
        on_compute_pool(|| self.sequence_logprobs_here(seqs, grammar, temperature))
    }

    fn sequence_logprobs_here(&self, seqs: &[Sequence], grammar: &dyn Grammar, temperature: f64) -> Vec<Vec<f32>> {
        if let Some(runs) = self.gpu_runs(&sequence_sizes(seqs)) {
            return runs.into_iter().flat_map(|r| self.sequence_logprobs_here(&seqs[r], grammar, temperature)).collect();
        }
        let model = self.model.valid();
        let batch = self.batch(seqs, grammar, &self.device);
        let lp = Self::token_logprobs(&model, &batch, temperature);
        let mut flat = lp.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32").into_iter();
        // The batch's rows are the generated tokens in sequence order.
        seqs.iter()
            .map(|s| {
                (0..s.tokens.len() - 1).filter(|&j| s.generated[j + 1]).map(|_| flat.next().expect("one row per generated token")).collect()
            })
            .collect()
    }

    /// The loss of a batch as an autodiff tensor, plus ratio statistics.
    pub fn loss(&self, seqs: &[Sequence], grammar: &dyn Grammar, loss: Loss, temperature: f64) -> (Tensor<1>, StepMetrics) {
        let dev = self.device.clone().autodiff();
        let batch = self.batch(seqs, grammar, &dev);
        let lp = Self::token_logprobs(&self.model, &batch, temperature);
        let n: f64 = batch.mask.clone().sum().into_scalar::<f32>() as f64;
        let n = n.max(1.0);
        let ratio = (lp.clone().detach() - batch.old.clone()).exp();
        let mut m = StepMetrics { tokens: n as usize, sequences: seqs.len(), ..Default::default() };
        let masked_mean = |x: Tensor<1>| (x * batch.mask.clone()).sum().into_scalar::<f32>() as f64 / n;
        m.mean_abs_ratio_minus_1 = masked_mean((ratio.clone() - 1.0).abs());
        let objective: Tensor<1> = match loss {
            Loss::Cispo { lo, hi } => {
                let outside = ratio.clone().lower_elem(lo).float() + ratio.clone().greater_elem(hi).float();
                m.clip_fraction = masked_mean(outside);
                ratio.clamp(lo, hi).detach() * batch.adv.clone() * lp
            }
            Loss::Reinforce => batch.adv.clone() * lp,
            Loss::PpoClip { epsilon } => {
                let r = (lp - batch.old.clone()).exp();
                let outside = r.clone().lower_elem(1.0 - epsilon).float() + r.clone().greater_elem(1.0 + epsilon).float();
                m.clip_fraction = masked_mean(outside.detach());
                let a = batch.adv.clone();
                let unclipped = r.clone() * a.clone();
                let clipped = r.clamp(1.0 - epsilon, 1.0 + epsilon) * a;
                unclipped.min_pair(clipped)
            }
            Loss::Supervised => lp,
        };
        let total = (objective * batch.mask.clone()).sum().neg() / n;
        (total, m)
    }

    /// One optimiser step on a batch; returns metrics.
    pub fn train_step(&mut self, seqs: &[Sequence], grammar: &dyn Grammar, loss: Loss, lr: f64, temperature: f64) -> StepMetrics {
        on_compute_pool(|| self.train_step_here(seqs, grammar, loss, lr, temperature))
    }

    fn train_step_here(&mut self, seqs: &[Sequence], grammar: &dyn Grammar, loss: Loss, lr: f64, temperature: f64) -> StepMetrics {
        let (mut m, g) = match self.gpu_runs(&sequence_sizes(seqs)) {
            Some(runs) => self.gradients_by_runs(seqs, &runs, grammar, loss, temperature),
            None => {
                let (total, mut m) = self.loss(seqs, grammar, loss, temperature);
                m.loss = total.clone().into_scalar::<f32>() as f64;
                let grads = total.backward();
                (m, read_grads_where(&self.model, &grads, Some(&self.trainable)))
            }
        };
        let mut params = self.trainable_params();
        m.grad_norm = self.optim.update(&mut params, &g, lr);
        self.model = write_params_where(self.model.clone(), Some(&self.trainable), &params);
        m
    }

    /// The whole batch's loss gradients (trainable parameters, visit order), summed over runs of
    /// it (see [`crate::chunking`]): each run's mean loss weighted by its share of the generated
    /// tokens. What a training step on a GPU does with a batch too large for one pass.
    pub fn gradients_by_runs(
        &self,
        seqs: &[Sequence],
        runs: &[std::ops::Range<usize>],
        grammar: &dyn Grammar,
        loss: Loss,
        temperature: f64,
    ) -> (StepMetrics, Vec<Vec<f32>>) {
        let tokens = |s: &[Sequence]| sequence_sizes(s).iter().map(|&(_, n)| n).sum::<usize>();
        let all = tokens(seqs).max(1) as f64;
        let mut m = StepMetrics { sequences: seqs.len(), ..Default::default() };
        let mut sum: Vec<Vec<f32>> = Vec::new();
        for run in runs {
            let part = &seqs[run.clone()];
            let share = tokens(part) as f64 / all;
            if share == 0.0 {
                continue;
            }
            let (total, rm) = self.loss(part, grammar, loss, temperature);
            let total = total * share;
            m.loss += total.clone().into_scalar::<f32>() as f64;
            m.mean_abs_ratio_minus_1 += rm.mean_abs_ratio_minus_1 * share;
            m.clip_fraction += rm.clip_fraction * share;
            m.tokens += rm.tokens;
            let g = read_grads_where(&self.model, &total.backward(), Some(&self.trainable));
            if sum.is_empty() {
                sum = g;
            } else {
                sum.iter_mut().zip(&g).for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(x, y)| *x += y));
            }
        }
        if sum.is_empty() {
            sum = self.trainable_params().iter().map(|p| vec![0.0; p.len()]).collect();
        }
        (m, sum)
    }

    /// On a GPU backend, the runs a batch of `items` (positions, logit rows) is cut into when one
    /// forward over all of it would outgrow a buffer; `None` when it goes whole (always on the CPU).
    fn gpu_runs(&self, items: &[(usize, usize)]) -> Option<Vec<std::ops::Range<usize>>> {
        if crate::kernels::on_host(&self.device) {
            return None;
        }
        let runs = chunking::runs_within(&self.cfg, items, chunking::GPU_TENSOR_BYTES);
        (runs.len() > 1).then_some(runs)
    }
}

/// Each sequence's forward positions and generated tokens (the rows its loss reads).
fn sequence_sizes(seqs: &[Sequence]) -> Vec<(usize, usize)> {
    seqs.iter().map(|s| (s.tokens.len().saturating_sub(1), s.generated.iter().skip(1).filter(|g| **g).count())).collect()
}

/// How the decoding loop picks a row's next token and its log-prob: `(row, last logits, tokens
/// so far)`.
type Choose<'a> = dyn FnMut(usize, &[f32], &[Tok]) -> (Tok, f32) + Send + 'a;

/// Runs `f` on a thread of the compute pool (rayon's, which Flex and the kernels share) rather
/// than beside it: the caller would otherwise be one thread more than there are cores, and each
/// parallel op's hand-off would preempt it.
/// The caller's choice of kernels ([`crate::kernels::set_enabled`]) goes along.
fn on_compute_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let fused = crate::kernels::enabled();
    rayon::scope(|_| {
        crate::kernels::set_enabled(fused);
        f()
    })
}

struct Batch {
    inputs: Tensor<2, Int>,
    prev: Tensor<2, Int>,
    /// Rows of the `[B·T, D]` hidden states the loss reads (one per generated token).
    rows: Tensor<1, Int>,
    /// `[1, N]`: each row's target token.
    targets: Tensor<2, Int>,
    /// `targets`, for the fused log-prob kernel.
    target_ids: Vec<usize>,
    /// `[N]`: 1 per row (0 for the placeholder row of a batch without generated tokens).
    mask: Tensor<1>,
    old: Tensor<1>,
    adv: Tensor<1>,
    /// `[1, N, V]`: the grammar's additive bias per row.
    grammar: Tensor<3>,
    attn: Tensor<4>,
    positions: Vec<Vec<usize>>,
}

/// `[B, 1, T, T]` additive attention bias, row-major: each query sees the keys up to itself and
/// within its sequence's length (`lens[i]` of the `t` padded positions).
fn causal_bias(lens: &[usize], t: usize) -> Vec<f32> {
    let mut bias = vec![NEG; lens.len() * t * t];
    for (i, &len) in lens.iter().enumerate() {
        for q in 0..t {
            for k in 0..=q.min(len.saturating_sub(1)) {
                bias[(i * t + q) * t + k] = 0.0;
            }
        }
    }
    bias
}

/// After decoding: each row's context and all but its last sampled token (the ones that went
/// through the model) into the prefix cache, gathered from the slots the decode loop used
/// (`cached` from the cache at `0..`, `new` prefilled at `c..`, generated at `c + t..`), and
/// each row's shared prompt as its own entry.
fn keep_prefixes(
    pc: &mut PrefixCache,
    shared: &[usize],
    reqs: &[SampleRequest],
    out: &[(Vec<Tok>, Vec<f32>)],
    cache: &KvCache,
    (cached, new): (&[usize], &[usize]),
    (c, t): (usize, usize),
) {
    for (i, r) in reqs.iter().enumerate() {
        let ran = out[i].0.len().saturating_sub(1);
        let ranges = [0..cached[i], c..c + new[i], c + t..c + t + ran];
        let layers: Vec<LayerRows> = cache
            .layers
            .iter()
            .map(|l| match l {
                Some(LayerKv::Rows(rows)) => {
                    let (k, v) = rows.gather(i, &ranges);
                    LayerRows { k, v }
                }
                _ => unreachable!("the fused kernels keep every layer's cache as host rows"),
            })
            .collect();
        let share = shared[i];
        if share > 0 && share < r.context.len() {
            let dkv = layers.first().map_or(0, |l| l.k.len() / (r.context.len() + ran));
            let head = layers.iter().map(|l| LayerRows { k: l.k[..share * dkv].to_vec(), v: l.v[..share * dkv].to_vec() }).collect();
            pc.insert(r.context[..share].to_vec(), head, true);
        }
        pc.insert([r.context.as_slice(), &out[i].0[..ran]].concat(), layers, false);
    }
}

/// Row-major `[b, t]` tokens shifted one place right within each row (`PAD` first).
fn previous_tokens(toks: &[i64], b: usize, t: usize) -> Vec<i64> {
    (0..b * t).map(|k| if k % t == 0 { PAD as i64 } else { toks[k - 1] }).collect()
}

/// Sample from softmax(logits / τ) restricted to `allowed`; returns the token and its log-prob
/// under exactly that distribution (τ = 0: greedy, log-prob 0).
pub fn sample_masked(logits: &[f32], allowed: &[Tok], temperature: f64, rng: &mut Rng) -> (Tok, f32) {
    if temperature <= 0.0 {
        let best = *allowed.iter().max_by(|a, b| logits[**a as usize].total_cmp(&logits[**b as usize])).unwrap();
        return (best, 0.0);
    }
    let scaled: Vec<f64> = allowed.iter().map(|&a| logits[a as usize] as f64 / temperature).collect();
    let max = scaled.iter().cloned().fold(f64::MIN, f64::max);
    let z: f64 = scaled.iter().map(|x| (x - max).exp()).sum();
    let probs: Vec<f64> = scaled.iter().map(|x| (x - max).exp() / z).collect();
    let k = rng.weighted(&probs);
    (allowed[k], (probs[k].ln()) as f32)
}
