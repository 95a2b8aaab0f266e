//! Parity with the reference implementation: tiny random Llama, SmolLM2-shaped, Qwen2 and Qwen3
//! checkpoints made by transformers (tests/hf/reference.py, run with the Python that
//! scripts/test sets up: RAO_PYTHON) load into rao and give transformers' logits on a padded
//! batch, its greedy decodes and its tokenizer's ids; what rao exports, transformers loads with
//! rao's logits.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use std::sync::Arc;

use rao_envs::grammar::{AnyToken, Grammar};
use rao_envs::longdoc::{self, DocConfig, LongDocGrammar};
use rao_envs::multihop::{self, GraphConfig, MultiHopGrammar};
use rao_envs::rng::Rng;
use rao_envs::text::{parse_reply, words};
use rao_envs::textcraft::grammar::TextCraftGrammar;
use rao_envs::textcraft::{self, SynthConfig};
use rao_envs::vocab::{EOS, Tok, Vocab};
use rao_policy::hf::constraint::TextGrammar;
use rao_policy::hf::{self, Pretrained};
use rao_policy::{Backend, Loss, Policy, SampleRequest, Sequence};
use serde::Deserialize;

const MODELS: [&str; 4] = ["llama", "smollm", "qwen2", "qwen3"];
/// The largest difference from transformers' logits allowed (f32 on both sides).
const LOGIT_TOLERANCE: f32 = 1e-4;

fn python() -> String {
    std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf/reference.py")
}

/// The checkpoints and expectations, made once per test process.
fn fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::Builder::new().prefix("rao-hf").tempdir().unwrap().keep();
        let out = Command::new(python()).arg(script()).arg("make").arg(&dir).output().expect("running Python");
        assert!(
            out.status.success(),
            "tests/hf/reference.py failed (scripts/test installs torch, transformers and peft; set RAO_PYTHON to that interpreter):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

#[derive(Deserialize)]
struct Expected {
    prompts: Vec<Vec<Tok>>,
    logits: Vec<Vec<Vec<f32>>>,
    greedy: Vec<Vec<Tok>>,
}

fn expected(name: &str) -> Expected {
    serde_json::from_slice(&std::fs::read(fixtures().join(name).join("expected.json")).unwrap()).unwrap()
}

fn load(name: &str) -> Pretrained {
    hf::load(&fixtures().join(name), Backend::Cpu).unwrap_or_else(|e| panic!("loading {name}: {e:#}"))
}

/// rao's logits for each prompt's positions, from one right-padded batch.
fn logits(policy: &Policy, prompts: &[Vec<Tok>]) -> Vec<Vec<Vec<f32>>> {
    policy.logits(prompts)
}

fn max_difference(a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut worst = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.len(), y.len(), "positions per prompt");
        for (r, s) in x.iter().zip(y) {
            assert_eq!(r.len(), s.len(), "vocabulary");
            for (u, v) in r.iter().zip(s) {
                worst = worst.max((u - v).abs());
            }
        }
    }
    worst
}

#[test]
fn logits_match_transformers_on_a_padded_batch() {
    for name in MODELS {
        let exp = expected(name);
        let model = load(name);
        let worst = max_difference(&logits(&model.policy, &exp.prompts), &exp.logits);
        println!("{name}: largest logit difference from transformers {worst:.2e}");
        assert!(worst < LOGIT_TOLERANCE, "{name}: logits differ from transformers' by {worst}");
        // The same with the decomposed (non-fused) ops.
        rao_policy::kernels::set_enabled(false);
        let worst = max_difference(&logits(&model.policy, &exp.prompts), &exp.logits);
        rao_policy::kernels::set_enabled(true);
        assert!(worst < LOGIT_TOLERANCE, "{name}: decomposed-op logits differ from transformers' by {worst}");
    }
}

#[test]
fn greedy_decoding_matches_transformers() {
    for name in MODELS {
        let exp = expected(name);
        let mut model = load(name);
        let vocab = model.policy.cfg.vocab;
        // No stop token: 32 tokens each, as the reference decoded them.
        model.policy.stop_tokens = vec![vocab as Tok];
        let reqs: Vec<SampleRequest> = exp
            .prompts
            .iter()
            .enumerate()
            .map(|(i, p)| SampleRequest { context: p.clone(), max_new_tokens: 32, seed: i as u64, recursive: false })
            .collect();
        // The fused kernels keep the cache on the host; the decomposed ops (wgpu's path) in tensors.
        for fused in [true, false] {
            rao_policy::kernels::set_enabled(fused);
            let out = model.policy.sample(&reqs, &AnyToken(vocab), 0.0);
            rao_policy::kernels::set_enabled(true);
            for (i, ((toks, _), want)) in out.iter().zip(&exp.greedy).enumerate() {
                assert_eq!(toks, want, "{name}: greedy decode of prompt {i} (fused kernels: {fused})");
            }
        }
    }
}

#[test]
fn sampled_logprobs_equal_a_fresh_forward_pass_and_train() {
    for name in MODELS {
        let exp = expected(name);
        let mut model = load(name);
        let vocab = model.policy.cfg.vocab;
        let grammar = AnyToken(vocab);
        let reqs: Vec<SampleRequest> = exp
            .prompts
            .iter()
            .enumerate()
            .map(|(i, p)| SampleRequest { context: p.clone(), max_new_tokens: 12, seed: 7 + i as u64, recursive: false })
            .collect();
        let out = model.policy.sample(&reqs, &grammar, 1.0);
        let seqs: Vec<Sequence> = reqs
            .iter()
            .zip(&out)
            .enumerate()
            .map(|(i, (r, (t, lp)))| Sequence::from_completion(&r.context, t, lp, if i % 2 == 0 { 1.0 } else { -0.5 }, false))
            .collect();
        let fresh = model.policy.sequence_logprobs(&seqs, &grammar, 1.0);
        for ((_, lps), f) in out.iter().zip(&fresh) {
            assert_eq!(lps.len(), f.len());
            for (a, b) in lps.iter().zip(f) {
                assert!((a - b).abs() < 1e-4, "{name}: sampled log-prob {a} vs recomputed {b}");
            }
        }
        // The RL update runs on these models and changes them.
        let before = model.policy.sequence_logprobs(&seqs, &grammar, 1.0);
        let m = model.policy.train_step(&seqs, &grammar, Loss::Cispo { lo: 0.0, hi: 5.0 }, 1e-3, 1.0);
        assert!(m.loss.is_finite() && m.grad_norm > 0.0, "{name}: {m:?}");
        assert_ne!(model.policy.sequence_logprobs(&seqs, &grammar, 1.0), before, "{name}: the update changed nothing");
    }
}

/// The sampler's prefix cache across calls (an agent's node asks once per action): a context
/// continued from an earlier call prefills only its new tokens, and decodes as transformers does
/// without any cache; log-probs sampled through it equal a fresh forward's; a shared prompt
/// serves a request that only starts like it.
#[test]
fn a_prefix_cache_across_calls_decodes_as_transformers_does() {
    use rao_policy::prefix_cache::PrefixCache;
    for name in MODELS {
        let exp = expected(name);
        let mut model = load(name);
        let vocab = model.policy.cfg.vocab;
        model.policy.stop_tokens = vec![vocab as Tok];
        let grammar = AnyToken(vocab);
        let mut cache = PrefixCache::default();
        let req = |context: Vec<Tok>, n: usize, seed: u64| SampleRequest { context, max_new_tokens: n, seed, recursive: false };
        // Greedy: 16 tokens, then the next 16 from the prompt plus those (prefilling one token).
        let first: Vec<SampleRequest> = exp.prompts.iter().map(|p| req(p.clone(), 16, 0)).collect();
        let shared: Vec<usize> = exp.prompts.iter().map(|p| p.len() / 2).collect();
        let a = model.policy.sample_cached(&first, &shared, &grammar, 0.0, &mut cache);
        let second: Vec<SampleRequest> = exp.prompts.iter().zip(&a).map(|(p, (t, _))| req([p.as_slice(), t].concat(), 16, 0)).collect();
        let before = cache.stats;
        let b = model.policy.sample_cached(&second, &vec![0; second.len()], &grammar, 0.0, &mut cache);
        assert_eq!(cache.stats.hits - before.hits, second.len(), "{name}: every continued context found its prefix");
        assert_eq!(cache.stats.prefilled_tokens - before.prefilled_tokens, second.len(), "{name}: one new token each to prefill");
        for (i, (((x, _), (y, _)), want)) in a.iter().zip(&b).zip(&exp.greedy).enumerate() {
            assert_eq!(&[x.as_slice(), y].concat(), want, "{name}: greedy decode of prompt {i} in two calls through the cache");
        }
        // A request that only starts like a shared prompt reads that much of it.
        let p0 = &exp.prompts[0];
        let other = req([&p0[..shared[0]], &[1, 2, 3][..]].concat(), 4, 0);
        let before = cache.stats;
        model.policy.sample_cached(std::slice::from_ref(&other), &[0], &grammar, 0.0, &mut cache);
        assert_eq!(cache.stats.reused_tokens - before.reused_tokens, shared[0], "{name}: the shared prompt was read");
        // Sampled at τ = 1 through the cache: the log-probs of the distribution sampled from.
        let third: Vec<SampleRequest> =
            second.iter().zip(&b).enumerate().map(|(i, (r, (t, _)))| req([r.context.as_slice(), t].concat(), 8, 9 + i as u64)).collect();
        let c = model.policy.sample_cached(&third, &vec![0; third.len()], &grammar, 1.0, &mut cache);
        let seqs: Vec<Sequence> =
            third.iter().zip(&c).map(|(r, (t, lp))| Sequence::from_completion(&r.context, t, lp, 1.0, false)).collect();
        for ((_, lps), fresh) in c.iter().zip(model.policy.sequence_logprobs(&seqs, &grammar, 1.0)) {
            for (x, y) in lps.iter().zip(&fresh) {
                assert!((x - y).abs() < 1e-4, "{name}: log-prob sampled through the cache {x} vs a fresh forward's {y}");
            }
        }
    }
}

#[derive(Deserialize)]
struct TokenizerExpected {
    texts: Vec<String>,
    ids: Vec<Vec<Tok>>,
    ids_no_special: Vec<Vec<Tok>>,
    transformers_ids: Vec<Vec<Tok>>,
    decoded: Vec<String>,
    conversation: serde_json::Value,
    chat: String,
    chat_no_prompt: String,
}

#[test]
fn tokenizer_and_chat_template_match_hugging_face() {
    let exp: TokenizerExpected = serde_json::from_slice(&std::fs::read(fixtures().join("tokenizer_expected.json")).unwrap()).unwrap();
    let model = load("qwen3");
    let tok = model.tokenizer.as_ref().expect("the checkpoint has a tokenizer");
    for (i, text) in exp.texts.iter().enumerate() {
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(ids, exp.ids[i], "ids of {text:?}");
        assert_eq!(ids, exp.transformers_ids[i], "transformers' ids of {text:?}");
        assert_eq!(tok.encode(text, false).unwrap(), exp.ids_no_special[i], "ids without special tokens of {text:?}");
        assert_eq!(tok.decode(&ids, false).unwrap(), exp.decoded[i], "decoding {text:?}");
    }
    let chat = tok.chat.as_ref().expect("the checkpoint has a chat template");
    assert_eq!(chat.render(&exp.conversation, true).unwrap(), exp.chat);
    assert_eq!(chat.render(&exp.conversation, false).unwrap(), exp.chat_no_prompt);
    // The template's own error, as an error.
    let bad = serde_json::json!([{"role": "robot", "content": "x"}]);
    let err = chat.render(&bad, true).unwrap_err().to_string();
    assert!(err.contains("unknown role robot"), "{err}");
    assert_eq!(model.policy.stop_tokens, vec![tok.token_id("<|im_end|>").unwrap()]);
}

#[test]
fn exported_checkpoints_load_in_transformers_with_the_same_logits() {
    for name in ["llama", "qwen2", "qwen3"] {
        let exp = expected(name);
        let mut model = load(name);
        let grammar = AnyToken(model.policy.cfg.vocab);
        // Train a step first, so the export holds rao's weights, not the ones it loaded.
        let seqs: Vec<Sequence> =
            exp.prompts.iter().map(|p| Sequence::from_completion(&p[..1], &p[1..], &vec![0.0; p.len() - 1], 1.0, false)).collect();
        model.policy.train_step(&seqs, &grammar, Loss::Supervised, 1e-2, 1.0);
        let out = tempfile::tempdir().unwrap();
        hf::export(&model.policy, Some(&fixtures().join(name)), out.path()).unwrap();
        let ids = out.path().join("prompts.json");
        std::fs::write(&ids, serde_json::to_vec(&exp.prompts).unwrap()).unwrap();
        let run = Command::new(python()).arg(script()).arg("logits").arg(out.path()).arg(&ids).output().unwrap();
        assert!(run.status.success(), "transformers could not load rao's export of {name}:\n{}", String::from_utf8_lossy(&run.stderr));
        let theirs: Vec<Vec<Vec<f32>>> = serde_json::from_slice(&run.stdout).unwrap();
        let worst = max_difference(&logits(&model.policy, &exp.prompts), &theirs);
        assert!(worst < LOGIT_TOLERANCE, "{name}: transformers' logits of the export differ from rao's by {worst}");
        assert!(max_difference(&theirs, &exp.logits) > 1e-3, "{name}: the trained step did not reach the export");
        // And rao reads its own export back.
        let again = hf::load(out.path(), Backend::Cpu).unwrap();
        assert_eq!(max_difference(&logits(&again.policy, &exp.prompts), &logits(&model.policy, &exp.prompts)), 0.0);
    }
}

/// Bad checkpoints: errors that name the file (and line) and say what is wrong; no panics.
#[test]
fn malformed_checkpoints_give_located_errors() {
    let src = fixtures().join("qwen2");
    let copy = |edit: &dyn Fn(&Path)| -> String {
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&src).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
        edit(dir.path());
        match hf::load(dir.path(), Backend::Cpu) {
            Ok(_) => panic!("a malformed checkpoint loaded"),
            Err(e) => format!("{e:#}"),
        }
    };
    let set = |dir: &Path, key: &str, value: serde_json::Value| {
        let path = dir.join("config.json");
        let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        cfg[key] = value;
        std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    };
    let e = copy(&|d| std::fs::write(d.join("config.json"), "{\n  \"model_type\": \"qwen2\",\n  \"vocab_size\": 12,,\n}").unwrap());
    assert!(e.contains("config.json:3:"), "{e}");
    let e = copy(&|d| set(d, "model_type", "gpt2".into()));
    assert!(e.contains("config.json:") && e.contains("gpt2") && e.contains("qwen3"), "{e}");
    let e = copy(&|d| set(d, "hidden_size", 96.into()));
    assert!(e.contains("model.safetensors") && e.contains("shape"), "{e}");
    let e = copy(&|d| set(d, "num_key_value_heads", 3.into()));
    assert!(e.contains("config.json") && e.contains("groups"), "{e}");
    let e = copy(&|d| set(d, "vocab_size", (1u64 << 40).into()));
    assert!(e.contains("vocab_size") && e.contains("out of range"), "{e}");
    let e = copy(&|d| set(d, "rope_parameters", serde_json::json!({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0})));
    assert!(e.contains("rope_parameters") && e.contains("yarn"), "{e}");
    let e = copy(&|d| set(d, "tie_word_embeddings", false.into()));
    assert!(e.contains("lm_head.weight"), "{e}");
    let e = copy(&|d| {
        let path = d.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    });
    assert!(e.contains("model.safetensors") && e.contains("safetensors"), "{e}");
    let e = copy(&|d| std::fs::write(d.join("model.safetensors"), [255u8; 16]).unwrap());
    assert!(e.contains("model.safetensors"), "{e}");
    let e = copy(&|d| std::fs::write(d.join("tokenizer.json"), "{\"model\": 3}").unwrap());
    assert!(e.contains("tokenizer.json"), "{e}");
    let e = copy(&|d| std::fs::write(d.join("chat_template.jinja"), "{% for m in messages %}").unwrap());
    assert!(e.contains("chat_template.jinja"), "{e}");
}

/// LoRA on a Qwen3 and a Llama model: only the adapters train (the base stays as loaded), the
/// adapters export in PEFT's format and `peft` computes rao's logits with them, the merged export
/// loads in transformers with the same logits, and an adapter checkpoint restores exactly.
#[test]
fn lora_adapters_train_alone_and_load_in_peft() {
    use rao_policy::lora::{LoraConfig, LoraTarget};
    for name in ["qwen3", "llama"] {
        let exp = expected(name);
        let mut model = load(name);
        let base_params = rao_policy::params::read_params(&model.policy.model);
        let grammar = AnyToken(model.policy.cfg.vocab);
        let lora = LoraConfig { rank: 4, alpha: 8.0, targets: LoraTarget::ALL.to_vec(), dropout: 0.0 };
        model.policy.add_lora(lora, 3).unwrap();
        // B = 0: the adapted model computes what the base did.
        let before = max_difference(&logits(&model.policy, &exp.prompts), &exp.logits);
        assert!(before < LOGIT_TOLERANCE, "fresh adapters changed the logits by {before}");
        let seqs: Vec<Sequence> =
            exp.prompts.iter().map(|p| Sequence::from_completion(&p[..1], &p[1..], &vec![0.0; p.len() - 1], 1.0, false)).collect();
        for _ in 0..2 {
            model.policy.train_step(&seqs, &grammar, Loss::Supervised, 1e-2, 1.0);
        }
        let ours = logits(&model.policy, &exp.prompts);
        assert!(max_difference(&ours, &exp.logits) > 1e-3, "{name}: training the adapters changed nothing");
        // The base weights are untouched: the visit-order base values are those loaded.
        let now: Vec<Vec<f32>> = rao_policy::params::read_params(&model.policy.model);
        let trainable = model.policy.trainable_params();
        let bases: Vec<&Vec<f32>> = now.iter().zip(model.policy.trainable_mask()).filter(|(_, t)| !**t).map(|(v, _)| v).collect();
        assert_eq!(bases.len(), base_params.len(), "{name}: base parameters");
        for (a, b) in bases.iter().zip(&base_params) {
            assert_eq!(*a, b, "{name}: a base weight changed");
        }
        let ids = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(ids.path(), serde_json::to_vec(&exp.prompts).unwrap()).unwrap();
        // PEFT adapters.
        let adapter = tempfile::tempdir().unwrap();
        let base_dir = fixtures().join(name);
        model.policy.export_peft(base_dir.to_str().unwrap(), adapter.path()).unwrap();
        let run = Command::new(python()).arg(script()).arg("peft").arg(&base_dir).arg(adapter.path()).arg(ids.path()).output().unwrap();
        assert!(run.status.success(), "peft could not load rao's adapters for {name}:\n{}", String::from_utf8_lossy(&run.stderr));
        let theirs: Vec<Vec<Vec<f32>>> = serde_json::from_slice(&run.stdout).unwrap();
        let worst = max_difference(&ours, &theirs);
        assert!(worst < LOGIT_TOLERANCE, "{name}: peft's logits with rao's adapters differ by {worst}");
        // Merged into the base.
        let merged = tempfile::tempdir().unwrap();
        hf::export(&model.policy, Some(&base_dir), merged.path()).unwrap();
        let run = Command::new(python()).arg(script()).arg("logits").arg(merged.path()).arg(ids.path()).output().unwrap();
        assert!(run.status.success(), "transformers could not load the merged export of {name}:\n{}", String::from_utf8_lossy(&run.stderr));
        let theirs: Vec<Vec<Vec<f32>>> = serde_json::from_slice(&run.stdout).unwrap();
        let worst = max_difference(&ours, &theirs);
        assert!(worst < LOGIT_TOLERANCE, "{name}: the merged export's logits differ by {worst}");
        // An adapter checkpoint: only the factors and their moments, restored exactly.
        let ck = model.policy.checkpoint();
        assert_eq!(ck.params.len(), 4 * trainable.iter().map(Vec::len).sum::<usize>());
        let mut again = load(name);
        again.policy.load_adapters(&ck).unwrap();
        assert_eq!(logits(&again.policy, &exp.prompts), ours, "{name}: restored adapters");
        assert!(Policy::from_checkpoint(&ck, Backend::Cpu).is_err(), "an adapter checkpoint is not a whole model");
    }
}

/// Each environment's action language compiled by llguidance over the fixtures' byte-level BPE
/// tokenizer, with the environment's vocabulary and its compact grammar.
fn text_grammars() -> Vec<(&'static str, Vocab, Arc<dyn Grammar>, TextGrammar)> {
    let tokenizer = load("qwen3").tokenizer.expect("the fixture has a tokenizer");
    let stop = tokenizer.token_id("<|im_end|>").expect("the fixture's end of turn");
    let bytes = tokenizer.token_bytes().expect("token bytes");
    let rows = tokenizer.vocab_size();
    let world = textcraft::generate(&SynthConfig::small(), 2);
    let doc = Arc::new(longdoc::Lang::new(&DocConfig::default()));
    let hop = Arc::new(multihop::Lang::new(multihop::generate(&GraphConfig::default(), 4)));
    let envs: Vec<(&str, Vocab, Arc<dyn Grammar>)> = vec![
        ("textcraft", world.vocab.clone(), Arc::new(TextCraftGrammar::new(&world, 3))),
        ("longdoc", doc.vocab.clone(), Arc::new(LongDocGrammar::new(doc.clone(), 4))),
        ("multihop", hop.vocab.clone(), Arc::new(MultiHopGrammar::new(hop.clone(), 6))),
    ];
    envs.into_iter()
        .map(|(name, vocab, compact)| {
            let [flat, rec] = [false, true].map(|r| compact.lark(r).expect("every environment has a text grammar"));
            let text = TextGrammar::new(bytes.clone(), stop, rows, &flat, &rec).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            (name, vocab, compact, text)
        })
        .collect()
}

/// A uniformly random walk under `grammar` until it allows `end` and picks it (or `cap` tokens).
fn random_walk(grammar: &dyn Grammar, recursive: bool, end: Tok, cap: usize, rng: &mut Rng) -> Option<Vec<Tok>> {
    let mut out = Vec::new();
    while out.len() < cap {
        let allowed = grammar.allowed(recursive, &[], &out);
        let t = allowed[rng.below(allowed.len())];
        if t == end {
            return Some(out);
        }
        out.push(t);
    }
    None
}

fn accepts(grammar: &dyn Grammar, recursive: bool, toks: &[Tok], end: Tok) -> bool {
    (0..toks.len()).all(|i| grammar.allowed(recursive, &[], &toks[..i]).contains(&toks[i]))
        && grammar.allowed(recursive, &[], toks).contains(&end)
}

#[test]
fn every_action_sampled_under_the_text_grammar_parses_and_every_action_is_reachable() {
    let tokenizer = load("qwen3").tokenizer.unwrap();
    let stop = tokenizer.token_id("<|im_end|>").unwrap();
    for (name, vocab, compact, text) in text_grammars() {
        for recursive in [false, true] {
            let mut rng = Rng::new(11);
            for round in 0..200 {
                // Text → action: whatever a model samples under the mask is an action of the
                // environment's compact grammar.
                let sampled = random_walk(&text, recursive, stop, 200, &mut rng).unwrap_or_else(|| panic!("{name}: no stop in 200 tokens"));
                let reply = tokenizer.decode(&sampled, false).unwrap();
                let action = parse_reply(&vocab, &reply).unwrap_or_else(|e| panic!("{name} round {round}: {reply:?}: {e}"));
                assert!(accepts(compact.as_ref(), recursive, &action, EOS), "{name} (recursive {recursive}): {reply:?} is not an action");
                // Action → text: every action of the compact grammar, written in words and
                // tokenized, is allowed token by token, then the stop.
                let Some(action) = random_walk(compact.as_ref(), recursive, EOS, 40, &mut rng) else { continue };
                let ids = tokenizer.encode(&words(&vocab, &action), false).unwrap();
                assert!(accepts(&text, recursive, &ids, stop), "{name} (recursive {recursive}): {:?} is refused", words(&vocab, &action));
            }
        }
    }
}

#[test]
fn logprobs_sampled_under_the_text_grammar_equal_a_fresh_masked_forward() {
    let model = load("qwen3");
    let tokenizer = model.tokenizer.as_ref().unwrap();
    for (name, _, _, text) in text_grammars() {
        let prompt = tokenizer.encode("<|im_start|>user\nact<|im_end|>\n<|im_start|>assistant\n", false).unwrap();
        let reqs: Vec<SampleRequest> =
            (0..6).map(|i| SampleRequest { context: prompt.clone(), max_new_tokens: 64, seed: 3 + i, recursive: i % 2 == 1 }).collect();
        for temperature in [1.0, 0.7] {
            let out = model.policy.sample(&reqs, &text, temperature);
            let seqs: Vec<Sequence> =
                reqs.iter().zip(&out).map(|(r, (t, lp))| Sequence::from_completion(&r.context, t, lp, 1.0, r.recursive)).collect();
            let fresh = model.policy.sequence_logprobs(&seqs, &text, temperature);
            for ((toks, lps), f) in out.iter().zip(&fresh) {
                assert_eq!(toks.last(), Some(&text.stop()), "{name}: every action ends with the stop token");
                for (a, b) in lps.iter().zip(f) {
                    assert!((a - b).abs() < 1e-4, "{name} at τ = {temperature}: sampled {a} vs recomputed {b}");
                }
            }
        }
    }
}
