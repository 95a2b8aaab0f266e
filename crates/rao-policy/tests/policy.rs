//! The policy's contracts: recorded log-probs match a fresh forward pass; the CISPO gradient is
//! the analytic one; training is deterministic; checkpoints round-trip bit for bit.

use rao_envs::grammar::{AnyToken, Grammar};
use rao_envs::textcraft::{self, SynthConfig, grammar::TextCraftGrammar};
use rao_envs::vocab::Tok;
use rao_policy::params::{read_grads, read_params, write_params};
use rao_policy::{Backend, Loss, ModelConfig, Policy, SampleRequest, Sequence};

fn setup() -> (textcraft::World, TextCraftGrammar, Policy) {
    setup_with(false)
}

/// `prev_token`: the model variant that also reads each token's predecessor.
fn setup_with(prev_token: bool) -> (textcraft::World, TextCraftGrammar, Policy) {
    let world = textcraft::generate(&SynthConfig::small(), 1);
    let grammar = TextCraftGrammar::new(&world, 4);
    let cfg = ModelConfig {
        vocab: world.vocab.len(),
        d_model: 32,
        n_layers: 2,
        n_heads: 4,
        d_ff: 64,
        rope_theta: 10_000.0,
        prev_token,
        ..ModelConfig::tiny()
    };
    let policy = Policy::new(cfg, Backend::Cpu, 7).unwrap();
    (world, grammar, policy)
}

/// Prompts of different lengths (so rows are padded differently).
fn requests(world: &textcraft::World) -> Vec<SampleRequest> {
    let v = &world.vocab;
    let items: Vec<&textcraft::Item> = world.items.iter().filter(|i| !i.is_base()).take(5).collect();
    items
        .iter()
        .enumerate()
        .map(|(k, it)| {
            let mut ctx = vec![v.id("<bos>"), v.id(if k % 2 == 0 { "<rec>" } else { "<flat>" }), v.id("@0")];
            ctx.extend(&it.tokens);
            for _ in 0..k {
                ctx.extend(v.ids("info"));
                ctx.extend(&it.tokens);
                ctx.extend(v.ids("<eos> <obs> ok"));
            }
            SampleRequest { context: ctx, max_new_tokens: 40, seed: 100 + k as u64, recursive: k % 2 == 0 }
        })
        .collect()
}

fn as_sequences(reqs: &[SampleRequest], outs: &[(Vec<Tok>, Vec<f32>)], adv: f32) -> Vec<Sequence> {
    reqs.iter().zip(outs).map(|(r, (toks, lps))| Sequence::from_completion(&r.context, toks, lps, adv, r.recursive)).collect()
}

#[test]
fn sampled_logprobs_equal_a_fresh_forward_pass() {
    for prev_token in [false, true] {
        sampled_logprobs_equal_a_fresh_forward_pass_with(prev_token);
    }
}

fn sampled_logprobs_equal_a_fresh_forward_pass_with(prev_token: bool) {
    let (world, grammar, policy) = setup_with(prev_token);
    let reqs = requests(&world);
    let outs = policy.sample(&reqs, &grammar, 1.0);
    for ((toks, lps), r) in outs.iter().zip(&reqs) {
        assert!(!toks.is_empty() && toks.len() == lps.len());
        // Everything sampled is allowed by the grammar.
        for i in 0..toks.len() {
            assert!(grammar.allowed(r.recursive, &r.context, &toks[..i]).contains(&toks[i]));
        }
    }
    let fresh = policy.sequence_logprobs(&as_sequences(&reqs, &outs, 1.0), &grammar, 1.0);
    for ((_, lps), f) in outs.iter().zip(&fresh) {
        assert_eq!(lps.len(), f.len());
        for (a, b) in lps.iter().zip(f) {
            assert!((a - b).abs() < 1e-4, "sampled {a} vs recomputed {b}");
        }
    }
    // Same seeds, same samples.
    assert_eq!(policy.sample(&reqs, &grammar, 1.0), outs);
}

/// A grammar that reads the node's context (item names made of words the node has seen): the
/// sampler and the learner give it the same context, so their log-probs still agree, and what
/// is sampled names only words of the context.
#[test]
fn a_grammar_that_reads_the_context_masks_sampling_and_learning_alike() {
    let (mut world, _, policy) = setup();
    world.names = textcraft::ItemNames::SeenWords;
    let grammar = TextCraftGrammar::new(&world, 4);
    let reqs = requests(&world);
    let outs = policy.sample(&reqs, &grammar, 1.0);
    let verbs = world.vocab.ids("info craft spawn inv finish , <eos>");
    let digits = world.vocab.ids("0 1 2 3 4 5 6 7 8 9");
    for ((toks, _), r) in outs.iter().zip(&reqs) {
        for t in toks {
            assert!(
                verbs.contains(t) || digits.contains(t) || r.context.contains(t),
                "`{}` after `{}`",
                world.vocab.text(toks),
                world.vocab.text(&r.context)
            );
        }
    }
    let fresh = policy.sequence_logprobs(&as_sequences(&reqs, &outs, 1.0), &grammar, 1.0);
    for ((_, lps), f) in outs.iter().zip(&fresh) {
        for (a, b) in lps.iter().zip(f) {
            assert!((a - b).abs() < 1e-4, "sampled {a} vs recomputed {b}");
        }
    }
}

#[test]
fn forced_decoding_returns_the_given_actions_with_the_models_logprobs() {
    let (world, grammar, policy) = setup_with(true);
    let mut reqs = requests(&world);
    let actions: Vec<Vec<Tok>> = policy.sample(&reqs, &grammar, 1.0).into_iter().map(|(t, _)| t).collect();
    let forced = policy.force(&reqs, &actions);
    for ((toks, lps), a) in forced.iter().zip(&actions) {
        assert_eq!(toks, a);
        assert_eq!(lps.len(), a.len());
    }
    let fresh = policy.sequence_logprobs(&as_sequences(&reqs, &forced, 1.0), &AnyToken(world.vocab.len()), 1.0);
    for ((_, lps), f) in forced.iter().zip(&fresh) {
        for (a, b) in lps.iter().zip(f) {
            assert!((a - b).abs() < 1e-4, "forced {a} vs recomputed {b}");
        }
    }
    // A row whose window runs out stops there, like sampling does.
    reqs[0].max_new_tokens = 2;
    assert_eq!(policy.force(&reqs, &actions)[0].0, actions[0][..2].to_vec());
}

#[test]
fn cispo_gradient_matches_finite_differences_of_its_surrogate() {
    let (world, grammar, mut policy) = setup();
    let reqs = requests(&world);
    let outs = policy.sample(&reqs, &grammar, 1.0);
    let mut seqs = as_sequences(&reqs, &outs, 0.7);
    // Off-policy: shift the behaviour log-probs so ratios differ per token (some clipped).
    for (k, s) in seqs.iter_mut().enumerate() {
        for (j, lp) in s.old_logprobs.iter_mut().enumerate() {
            if s.generated[j] {
                *lp -= 0.3 * ((j + k) % 7) as f32 - 0.4;
            }
        }
        s.advantage = if k % 2 == 0 { 0.7 } else { -1.1 };
    }
    let (lo, hi) = (0.0, 1.5);
    let (loss, _) = policy.loss(&seqs, &grammar, Loss::Cispo { lo, hi }, 1.0);
    let grads = read_grads(&policy.model, &loss.backward());
    // The surrogate S(θ) = −(1/|M|) Σ w_t A log π_θ(a_t) with w_t = clip(ρ_t) frozen at θ0.
    let lp0 = policy.sequence_logprobs(&seqs, &grammar, 1.0);
    let weights: Vec<Vec<f64>> = seqs
        .iter()
        .zip(&lp0)
        .map(|(s, lps)| {
            let olds: Vec<f32> = s.old_logprobs.iter().zip(&s.generated).filter(|(_, g)| **g).map(|(o, _)| *o).collect();
            lps.iter().zip(olds).map(|(l, o)| ((*l - o) as f64).exp().clamp(lo, hi)).collect()
        })
        .collect();
    let m: usize = lp0.iter().map(|v| v.len()).sum();
    let surrogate = |p: &Policy| -> f64 {
        let lps = p.sequence_logprobs(&seqs, &grammar, 1.0);
        -lps.iter()
            .zip(&weights)
            .zip(&seqs)
            .map(|((l, w), s)| l.iter().zip(w).map(|(a, b)| *a as f64 * b * s.advantage as f64).sum::<f64>())
            .sum::<f64>()
            / m as f64
    };
    let base = read_params(&policy.model);
    // Check the largest-gradient coordinates of a few parameter tensors.
    let mut checked = 0;
    for k in [0usize, 3, 7, base.len() - 1] {
        let (i, g) = grads[k].iter().enumerate().max_by(|a, b| a.1.abs().total_cmp(&b.1.abs())).map(|(i, g)| (i, *g as f64)).unwrap();
        let h = 1e-2f32;
        let mut plus = base.clone();
        plus[k][i] += h;
        let mut minus = base.clone();
        minus[k][i] -= h;
        let model = policy.model.clone();
        policy.model = write_params(model.clone(), &plus);
        let sp = surrogate(&policy);
        policy.model = write_params(model.clone(), &minus);
        let sm = surrogate(&policy);
        policy.model = write_params(model, &base);
        let fd = (sp - sm) / (2.0 * h as f64);
        assert!((fd - g).abs() <= 0.05 * g.abs().max(1e-3), "param {k}[{i}]: autodiff {g} vs finite difference {fd}");
        checked += 1;
    }
    assert_eq!(checked, 4);
}

#[test]
fn fused_kernels_give_the_decomposed_ops_loss_and_gradients() {
    let (world, grammar, policy) = setup_with(true);
    fused_matches_decomposed(&world, &grammar, &policy);
    // The Llama/Qwen features: grouped-query attention, a head width that is not d_model / heads,
    // q/k/v biases, q/k norms, an output layer of its own.
    let cfg = ModelConfig {
        n_kv_heads: Some(2),
        head_dim: Some(12),
        qkv_bias: true,
        qk_norm: true,
        untied_head: true,
        prev_token: false,
        ..policy.cfg.clone()
    };
    fused_matches_decomposed(&world, &grammar, &Policy::new(cfg, Backend::Cpu, 11).unwrap());
}

fn fused_matches_decomposed(world: &textcraft::World, grammar: &TextCraftGrammar, policy: &Policy) {
    let reqs = requests(world);
    let outs = policy.sample(&reqs, grammar, 0.8);
    let mut seqs = as_sequences(&reqs, &outs, 0.7);
    for (k, s) in seqs.iter_mut().enumerate() {
        s.advantage = if k % 2 == 0 { 0.7 } else { -1.1 };
    }
    let run = |fused: bool| {
        rao_policy::kernels::set_enabled(fused);
        let (loss, _) = policy.loss(&seqs, grammar, Loss::Cispo { lo: 0.0, hi: 5.0 }, 0.8);
        let value = loss.clone().into_scalar::<f32>();
        let grads = read_grads(&policy.model, &loss.backward());
        rao_policy::kernels::set_enabled(true);
        (value, grads)
    };
    let (fused_loss, fused) = run(true);
    let (plain_loss, plain) = run(false);
    assert!((fused_loss - plain_loss).abs() <= 1e-5 * plain_loss.abs().max(1.0), "loss {fused_loss} vs {plain_loss}");
    assert_eq!(fused.len(), plain.len());
    for (k, (f, p)) in fused.iter().zip(&plain).enumerate() {
        let norm = p.iter().map(|x| x * x).sum::<f32>().sqrt();
        let diff = f.iter().zip(p).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt();
        assert!(norm > 0.0, "parameter {k} got no gradient");
        // Relative to the gradient, with a floor of f32 rounding for gradients near zero (a
        // q/k norm gain's is ~1e-5 here).
        assert!(diff <= 1e-4 * norm + 1e-8, "parameter {k}: gradients differ by {diff} (norm {norm})");
    }
}

#[test]
fn training_is_deterministic_and_checkpoints_round_trip() {
    let run = || {
        let (world, grammar, mut policy) = setup();
        let reqs = requests(&world);
        let mut losses = Vec::new();
        for step in 0..3 {
            let outs = policy.sample(&reqs, &grammar, 1.0);
            let seqs = as_sequences(&reqs, &outs, if step % 2 == 0 { 1.0 } else { -0.5 });
            losses.push(policy.train_step(&seqs, &grammar, Loss::Cispo { lo: 0.0, hi: 5.0 }, 1e-3, 1.0).loss);
        }
        (policy.checkpoint(), losses)
    };
    let (a, la) = run();
    let (b, lb) = run();
    assert_eq!(la, lb);
    assert_eq!(a.params, b.params, "bit-identical parameters");
    assert_eq!(a.optim, b.optim);
    let restored = Policy::from_checkpoint(&a, Backend::Cpu).unwrap();
    assert_eq!(restored.checkpoint().params, a.params);
    assert_eq!(restored.optim.step, 3);
}

#[test]
fn on_policy_ratio_is_one() {
    let (world, grammar, policy) = setup();
    let reqs = requests(&world);
    let outs = policy.sample(&reqs, &grammar, 1.0);
    let (_, m) = policy.loss(&as_sequences(&reqs, &outs, 1.0), &grammar, Loss::Cispo { lo: 0.0, hi: 5.0 }, 1.0);
    assert!(m.mean_abs_ratio_minus_1 < 1e-4, "{}", m.mean_abs_ratio_minus_1);
    assert_eq!(m.clip_fraction, 0.0);
}

/// What a GPU backend does with a batch too large for one pass (`rao_policy::chunking`): the
/// loss gradients summed over runs of the batch are the whole batch's.
#[test]
fn gradients_summed_over_runs_of_a_batch_are_the_whole_batchs() {
    let (world, grammar, policy) = setup();
    let reqs = requests(&world);
    let outs = policy.sample(&reqs, &grammar, 1.0);
    let mut seqs = as_sequences(&reqs, &outs, 0.5);
    for (k, s) in seqs.iter_mut().enumerate() {
        s.advantage = [0.5, -1.0, 0.25, 2.0, -0.75][k];
    }
    let loss = Loss::Cispo { lo: 0.0, hi: 5.0 };
    let whole_batch = 0..seqs.len();
    let (whole_m, whole) = policy.gradients_by_runs(&seqs, std::slice::from_ref(&whole_batch), &grammar, loss, 1.0);
    let (runs_m, runs) = policy.gradients_by_runs(&seqs, &[0..2, 2..3, 3..seqs.len()], &grammar, loss, 1.0);
    assert!((whole_m.loss - runs_m.loss).abs() < 1e-6, "{} vs {}", whole_m.loss, runs_m.loss);
    assert_eq!(whole_m.tokens, runs_m.tokens);
    let scale = whole.iter().flatten().fold(0f32, |m, x| m.max(x.abs()));
    assert!(scale > 0.0);
    for (a, b) in whole.iter().flatten().zip(runs.iter().flatten()) {
        assert!((a - b).abs() <= 1e-5 * scale, "{a} vs {b}");
    }
}
