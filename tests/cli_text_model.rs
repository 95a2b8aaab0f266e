//! A Hugging Face model through the pipeline, end to end: a tiny random Qwen3 made by
//! transformers (crates/rao-policy/tests/hf/reference.py, with the Python scripts/test sets up:
//! RAO_PYTHON) read as a `dataset` of its directory, made a checkpoint by `hf_model`, acting in
//! text in `rollout` and `evaluate` (`policy: checkpoint`), judged, and passed through `update`
//! on its own tokens (tests/text_policy.rs of rao-stages checks the gradient step itself); an
//! update given trees in the environment's tokens is refused.

use crate::support::{rao, text};
use std::path::Path;
use std::process::Command;

/// The reference checkpoints (reference.py `make`), into `dir`.
fn make_models(dir: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rao-policy/tests/hf/reference.py");
    let python = std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into());
    let o = Command::new(python).arg(script).arg("make").arg(dir).output().expect("running Python");
    assert!(o.status.success(), "reference.py failed (set RAO_PYTHON to scripts/test's interpreter):\n{}", text(&o));
}

const PIPELINE: &str = r#"
name: text-model
seed: 3
params:
  model: models/qwen3
  limits: {window: 3000, max_depth: 2, max_children: 2, max_nodes: 6, step_budget: 3}
stages:
  model_files: {kind: dataset, params: {url: "${params.model}"}}
  base: {kind: hf_model, inputs: {files: model_files.data}}
  train_tasks: {kind: synthesize, params: {bands: [easy], per_band: 2, task_seed: 1}}
  gate_tasks: {kind: synthesize, params: {tiers: [1, 1], per_band: 2, split: validation, task_seed: 4}}
  warmstart:
    kind: warmstart
    description: The scripted expert's demonstrations, rendered as the model's conversations.
    inputs: {tasks: train_tasks.tasks, gate_tasks: gate_tasks.tasks, checkpoint: base.checkpoint}
    params: {limits: "${params.limits}", demos: {recursive_trees: 1, flat_trees: 1}, max_steps: 3, eval_every: 3, batch: 4, lr: 1.0e-3, gate: {required: false}}
  eval_tasks: {kind: synthesize, params: {bands: [easy], per_band: 2, split: validation, task_seed: 2}}
  rollout:
    kind: rollout
    inputs: {tasks: train_tasks.tasks, checkpoint: base.checkpoint}
    params: {policy: checkpoint, group_size: 3, limits: "${params.limits}"}
  judge: {kind: judge, inputs: {trees: rollout.trees, tasks: train_tasks.tasks}, params: {mode: exact}}
  advantage:
    kind: advantage
    inputs: {trees: judge.trees}
    # Every node is rewarded by its own score; the random model rarely scores, so the delegation
    # bonus gives its groups a spread to learn from.
    params: {lambda: 0.5}
  update:
    kind: update
    inputs: {checkpoint: base.checkpoint, trees: advantage.trees, tasks: train_tasks.tasks}
    params: {lr: 1.0e-3, max_children: 2}
  evaluate:
    kind: evaluate
    inputs: {tasks: eval_tasks.tasks, checkpoint: update.checkpoint}
    params: {modes: [recursive, flat], group_size: 1, limits: "${params.limits}"}
  greedy:
    kind: evaluate
    inputs: {tasks: eval_tasks.tasks, checkpoint: base.checkpoint}
    params: {modes: [recursive], group_size: 1, temperature: 0, limits: "${params.limits}"}
  greedy_uncached:
    kind: evaluate
    description: "No prefix cache (0 MiB keeps nothing): every action prefills its whole context."
    inputs: {tasks: eval_tasks.tasks, checkpoint: base.checkpoint}
    params: {modes: [recursive], group_size: 1, temperature: 0, prefix_cache_mb: 0, limits: "${params.limits}"}
"#;

/// LoRA: adapters only in the checkpoints, the base read from the model's files by each stage.
const LORA: &str = r#"
  lora_base:
    kind: hf_model
    inputs: {files: model_files.data}
    params: {lora: {rank: 4, alpha: 8.0, targets: [q_proj, v_proj, down_proj]}}
  lora_warmstart:
    kind: warmstart
    inputs: {tasks: train_tasks.tasks, gate_tasks: gate_tasks.tasks, checkpoint: lora_base.checkpoint, base: model_files.data}
    params: {limits: "${params.limits}", demos: {recursive_trees: 1, flat_trees: 0}, max_steps: 2, eval_every: 2, batch: 4, lr: 1.0e-3, gate: {required: false}}
  lora_rollout:
    kind: rollout
    inputs: {tasks: train_tasks.tasks, checkpoint: lora_base.checkpoint, base: model_files.data}
    params: {policy: checkpoint, group_size: 3, limits: "${params.limits}"}
  lora_judge: {kind: judge, inputs: {trees: lora_rollout.trees, tasks: train_tasks.tasks}, params: {mode: exact}}
  lora_advantage: {kind: advantage, inputs: {trees: lora_judge.trees}, params: {lambda: 0.5}}
  lora_update:
    kind: update
    inputs: {checkpoint: lora_base.checkpoint, trees: lora_advantage.trees, tasks: train_tasks.tasks, base: model_files.data}
    params: {lr: 1.0e-3, max_children: 2}
  lora_export: {kind: hf_export, inputs: {checkpoint: lora_warmstart.checkpoint, base: model_files.data}}
"#;

/// Stages that must fail, each saying why.
const MIXED: &str = r#"
  lora_without_base:
    kind: evaluate
    inputs: {tasks: eval_tasks.tasks, checkpoint: lora_update.checkpoint}
    params: {modes: [recursive], group_size: 1, limits: "${params.limits}"}
  expert_rollout:
    kind: rollout
    inputs: {tasks: train_tasks.tasks}
    params: {policy: expert, group_size: 2, limits: "${params.limits}"}
  expert_judge: {kind: judge, inputs: {trees: expert_rollout.trees, tasks: train_tasks.tasks}, params: {mode: exact}}
  expert_advantage: {kind: advantage, inputs: {trees: expert_judge.trees}}
  mixed_update:
    kind: update
    inputs: {checkpoint: base.checkpoint, trees: expert_advantage.trees, tasks: train_tasks.tasks}
    params: {max_children: 2}
"#;

fn file_of(dir: &Path, instance: &str, file: &str) -> std::path::PathBuf {
    let o = rao(&["path", "p.yaml", instance, file], dir);
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).trim().into()
}

#[test]
fn a_hugging_face_model_acts_in_text_through_the_pipeline_and_updates_on_its_own_tokens() {
    let dir = tempfile::tempdir().unwrap();
    make_models(&dir.path().join("models"));
    std::fs::write(dir.path().join("p.yaml"), format!("{PIPELINE}{LORA}")).unwrap();
    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));

    // The trees hold the model's own tokens, named by its tokenizer.
    let trees =
        rao_core::parquet_io::nodes_from_parquet(std::fs::read(file_of(dir.path(), "rollout", "trees.parquet")).unwrap().into()).unwrap();
    assert!(trees.iter().all(|n| n.token_space.starts_with("model:")), "{:?}", trees[0].token_space);
    assert!(trees.iter().all(|n| n.turns.iter().all(|t| !t.observation.contains("err syntax"))), "every sampled action parses");
    // The checkpoints carry the tokenizer; the update changed the weights.
    for instance in ["base", "update"] {
        assert!(file_of(dir.path(), instance, "tokenizer.json").exists(), "{instance}");
    }
    // The update trained on the model's own sequences: it changes the weights exactly when some
    // node has an advantage (a random model rarely solves a task, so often none does).
    let advantaged =
        rao_core::parquet_io::nodes_from_parquet(std::fs::read(file_of(dir.path(), "advantage", "trees.parquet")).unwrap().into())
            .unwrap()
            .iter()
            .any(|n| n.advantage.is_some_and(|a| a != 0.0));
    let weights = |instance| std::fs::read(file_of(dir.path(), instance, "model.bpk")).unwrap();
    assert_eq!(weights("base") != weights("update"), advantaged, "the update changes the model iff it has a signal");
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(file_of(dir.path(), "update", "checkpoint.json")).unwrap()).unwrap();
    assert_eq!(meta["version"], 1);
    let summary = file_of(dir.path(), "evaluate", "summary.json");
    assert!(summary.exists());
    let eval =
        rao_core::parquet_io::nodes_from_parquet(std::fs::read(file_of(dir.path(), "evaluate", "trees.parquet")).unwrap().into()).unwrap();
    assert!(eval.iter().any(|n| n.mode == rao_core::Mode::Flat) && eval.iter().all(|n| n.token_space == trees[0].token_space));

    // The prefix cache's size reaches the policy, and the cache changes nothing but the work:
    // without it, every action prefills its whole context and the greedy trees are the same.
    let nodes = |instance| {
        rao_core::parquet_io::nodes_from_parquet(std::fs::read(file_of(dir.path(), instance, "trees.parquet")).unwrap().into()).unwrap()
    };
    let actions = |nodes: Vec<rao_core::NodeRecord>| {
        nodes
            .into_iter()
            .map(|n| (n.task_id, n.node_id, n.turns.into_iter().map(|t| t.completion_ids).collect::<Vec<_>>()))
            .collect::<Vec<_>>()
    };
    assert_eq!(actions(nodes("greedy")), actions(nodes("greedy_uncached")));
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(".rao/store/runs/text-model/latest.json")).unwrap()).unwrap();
    let metric = |instance: &str, name: &str| -> f64 {
        let i = record["instances"].as_array().unwrap().iter().find(|i| i["name"] == instance).unwrap();
        i["metrics"].as_object().unwrap().iter().filter(|(k, _)| k.ends_with(name)).map(|(_, v)| v.as_f64().unwrap()).sum()
    };
    assert!(metric("greedy", "prefix_cache_hits") > 0.0, "{}", record["instances"]);
    assert_eq!(metric("greedy_uncached", "prefix_cache_hits"), 0.0);
    assert!(metric("greedy_uncached", "prefilled_tokens") > metric("greedy", "prefilled_tokens"));

    // The warm start trained the model on text demonstrations (full and LoRA), in its tokens.
    assert!(weights("base") != weights("warmstart"), "the warm start trained the model");
    assert!(file_of(dir.path(), "warmstart", "tokenizer.json").exists());
    let lora_ws: serde_json::Value =
        serde_json::from_slice(&std::fs::read(file_of(dir.path(), "lora_warmstart", "checkpoint.json")).unwrap()).unwrap();
    assert_eq!(lora_ws["lora"]["rank"], 4);
    assert!(weights("lora_base") != weights("lora_warmstart"), "the LoRA warm start trained the adapters");

    // LoRA: the checkpoints hold the adapters alone (a fraction of the model), the base stays.
    let lora: serde_json::Value =
        serde_json::from_slice(&std::fs::read(file_of(dir.path(), "lora_update", "checkpoint.json")).unwrap()).unwrap();
    assert_eq!(lora["lora"]["rank"], 4, "{lora}");
    let size = |instance| std::fs::metadata(file_of(dir.path(), instance, "model.bpk")).unwrap().len();
    assert!(size("lora_update") * 5 < size("base"), "adapters {} B, model {} B", size("lora_update"), size("base"));
    let lora_trees =
        rao_core::parquet_io::nodes_from_parquet(std::fs::read(file_of(dir.path(), "lora_rollout", "trees.parquet")).unwrap().into())
            .unwrap();
    assert!(lora_trees.iter().all(|n| n.token_space == trees[0].token_space));

    // Exported as transformers and peft read it: the PEFT adapter on the base model gives the
    // merged directory's logits.
    let exported = file_of(dir.path(), "lora_export", "config.json").parent().unwrap().to_path_buf();
    let ids = dir.path().join("ids.json");
    std::fs::write(&ids, "[[1, 5, 9, 40, 77], [3, 3, 120]]").unwrap();
    let python = |args: &[&std::path::Path]| -> Vec<Vec<Vec<f32>>> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rao-policy/tests/hf/reference.py");
        let o = Command::new(std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into())).arg(script).args(args).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let merged = python(&[Path::new("logits"), &exported, &ids]);
    let adapted = python(&[Path::new("peft"), &dir.path().join("models/qwen3"), &exported.join("adapter"), &ids]);
    let worst =
        merged.iter().flatten().flatten().zip(adapted.iter().flatten().flatten()).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "merged vs base + adapter: {worst}");

    // Refused, saying why: adapters without their base; an update of the model on trees in the
    // environment's tokens.
    std::fs::write(dir.path().join("p.yaml"), format!("{PIPELINE}{LORA}{MIXED}")).unwrap();
    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(!o.status.success());
    assert!(text(&o).contains("the trees hold ids in the environment's tokens"), "{}", text(&o));
    assert!(text(&o).contains("holds LoRA adapters only: give this stage the base model's files as input `base`"), "{}", text(&o));
}

/// The shipped pipeline, with its default model (models/tiny-qwen3) and fewer of everything:
/// a LoRA warm start in text, two RL iterations, the evaluations.
#[test]
fn the_bring_your_own_model_pipeline_runs_end_to_end_on_a_tiny_model() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let store = tempfile::tempdir().unwrap();
    let pipeline = root.join("pipelines/bring-your-own-model.yaml");
    let mut sets = vec![];
    for set in [
        "params.demo_per_band=2",
        "params.warmstart_steps=2",
        "stages.train.loop.max_iterations=2",
        "params.train_per_band=1",
        "params.group_size=2",
        "params.eval_per_band=1",
        "params.gate_per_band=1",
    ] {
        sets.extend(["--set", set]);
    }
    let with_sets = |args: &[&str]| -> Vec<String> { args.iter().chain(&sets).map(|s| s.to_string()).collect() };
    let run = with_sets(&["run", pipeline.to_str().unwrap(), "--store", store.path().to_str().unwrap()]);
    let o = rao(&run.iter().map(String::as_str).collect::<Vec<_>>(), &root);
    assert!(o.status.success(), "{}", text(&o));
    let path = |instance: &str, file: &str| -> std::path::PathBuf {
        let args = with_sets(&["path", pipeline.to_str().unwrap(), instance, file, "--store", store.path().to_str().unwrap()]);
        let o = rao(&args.iter().map(String::as_str).collect::<Vec<_>>(), &root);
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).trim().into()
    };
    let last: serde_json::Value = serde_json::from_slice(&std::fs::read(path("update@2", "checkpoint.json")).unwrap()).unwrap();
    assert_eq!(last["lora"]["rank"], 16);
    let trees = rao_core::parquet_io::nodes_from_parquet(std::fs::read(path("evaluate", "trees.parquet")).unwrap().into()).unwrap();
    assert!(trees.iter().all(|n| n.token_space.starts_with("model:")));
    assert!(trees.iter().any(|n| n.mode == rao_core::Mode::Flat) && trees.iter().any(|n| n.mode == rao_core::Mode::Recursive));
    for file in ["config.json", "model.safetensors", "tokenizer.json", "adapter/adapter_config.json"] {
        assert!(path("export", file).exists(), "{file}");
    }
}

/// A model made here for the environment (`text_model`: a BPE trained on its conversations, a
/// random Qwen3), acting in text, exported, and read by transformers: its tokenizer gives the
/// ids rao fed the model, its model runs on them. With merges across words the instructions
/// every conversation repeats take a few tokens (and the constraint library still compiles the
/// grammar over the longer tokens). The scripted expert's actions in the model's tokens
/// (`paced_expert`) solve every task recursively within the text window.
#[test]
fn a_text_model_made_for_the_environment_acts_and_exports_to_transformers() {
    let first_prompt = |merges: &str, vocab: usize| -> usize {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("p.yaml"),
            format!(
                r#"
name: made
seed: 2
params:
  limits: {{window: 2048, max_depth: 2, max_children: 2, max_nodes: 6, step_budget: 3}}
stages:
  tasks: {{kind: synthesize, params: {{bands: [easy, medium], per_band: 3, task_seed: 1}}}}
  model:
    kind: text_model
    inputs: {{tasks: tasks.tasks}}
    params: {{model: {{d_model: 32, n_layers: 1, n_heads: 4, n_kv_heads: 2, d_ff: 64}}, vocab_size: {vocab}, merges: {merges}, limits: "${{params.limits}}"}}
  rollout:
    kind: rollout
    inputs: {{tasks: tasks.tasks, checkpoint: model.checkpoint}}
    params: {{policy: checkpoint, group_size: 1, limits: "${{params.limits}}"}}
  expert:
    kind: evaluate
    inputs: {{tasks: tasks.tasks, checkpoint: model.checkpoint}}
    params: {{label: expert, policy: paced_expert, modes: [recursive], limits: {{window: 1500, max_depth: 6, max_children: 4, max_nodes: 64}}}}
  export: {{kind: hf_export, inputs: {{checkpoint: model.checkpoint}}}}
"#
            ),
        )
        .unwrap();
        let o = rao(&["run", "p.yaml"], dir.path());
        assert!(o.status.success(), "{merges}: {}", text(&o));
        let read = |stage: &str| {
            rao_core::parquet_io::nodes_from_parquet(std::fs::read(file_of(dir.path(), stage, "trees.parquet")).unwrap().into()).unwrap()
        };
        let trees = read("rollout");
        assert!(
            trees.iter().all(|n| n.turns.iter().all(|t| !t.observation.contains("err syntax"))),
            "{merges}: every sampled action parses"
        );
        let expert = read("expert");
        assert!(expert.iter().all(|n| n.token_space.starts_with("model:")), "{merges}: the expert's turns are in the model's tokens");
        assert!(expert.iter().filter(|n| n.depth == 0).all(|n| n.score == 1.0), "{merges}: the expert solves every task recursively");
        assert!(expert.iter().all(|n| (n.context_tokens as usize) <= 1500), "{merges}: within the text window");
        let tokenizer: serde_json::Value =
            serde_json::from_slice(&std::fs::read(file_of(dir.path(), "model", "tokenizer.json")).unwrap()).unwrap();
        assert_eq!(tokenizer["model"]["vocab"].as_object().unwrap().len(), vocab, "the BPE has the vocabulary asked for");
        let exported = file_of(dir.path(), "export", "config.json").parent().unwrap().to_path_buf();
        let prompt = serde_json::to_string(&trees[0].prompt_ids).unwrap();
        let check = format!(
            "import json, torch, transformers as t\n\
             tok = t.AutoTokenizer.from_pretrained({dir:?}); model = t.AutoModelForCausalLM.from_pretrained({dir:?})\n\
             ids = json.loads({prompt:?})\n\
             assert tok(tok.decode(ids), add_special_tokens=False).input_ids == ids, 'the tokenizers differ'\n\
             out = model(torch.tensor([ids])).logits\n\
             assert out.shape[-1] == model.config.vocab_size and torch.isfinite(out).all()\n\
             print(tok.apply_chat_template([{{'role': 'user', 'content': 'hi'}}], tokenize=False, add_generation_prompt=True))",
            dir = exported.display().to_string()
        );
        let o = Command::new(std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into())).arg("-c").arg(&check).output().unwrap();
        assert!(o.status.success(), "{merges}: {}", text(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), "{}", text(&o));
        trees[0].prompt_ids.len()
    };
    let (within, across) = (first_prompt("within_words", 400), first_prompt("across_words", 700));
    assert!(across * 2 < within, "merges across words: a first prompt of {across} tokens against {within}");
}
