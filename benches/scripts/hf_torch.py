#!/usr/bin/env python3
"""PyTorch + transformers side of scripts/gpu-check and benches/scripts/hf_vs_transformers.sh,
and the table that puts rao next to it.

  hf_torch.py make DIR --shape SHAPE               a model of that shape (SHAPES), random weights
  hf_torch.py bench DIR [--dtypes bf16,f32] ...    the measurements of rao's hf_bench example
  hf_torch.py table DIR RAO.jsonl TORCH.jsonl      one table, rao next to PyTorch

The measurements match crates/rao-policy/examples/hf_bench.rs: generation with the KV cache
(sampling at temperature 1 over the whole vocabulary, every row the same number of new tokens)
at each batch size, greedy generation at one batch size, and update steps — full fine-tuning
and LoRA (rank 16 unless --lora-rank, alpha twice the rank, on q/k/v/o/gate/up/down) — with the
CISPO loss on the completion tokens, AdamW and global gradient clipping at 1. Each runs once
untimed, then timed, with the device synchronised before the clock stops. bf16 means weights,
activations and adapters in bf16 (log-probs taken in f32 from bf16 logits); f32 means f32
throughout with TF32 off (PyTorch's default for matmul). Also measured: the matmul peak of each
dtype (mean of 10 n×n×n products after 3 warm-ups).
"""
import argparse
import json
import math
import os
import sys
import time

SHAPES = {
    # Qwen3-0.6B's published config.
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1000000.0,
                       max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       bos_token_id=151643, eos_token_id=151645),
    # ~19M parameters, for the CPU benchmark (benches/scripts/hf_vs_transformers.sh).
    "qwen3-20m": dict(vocab_size=16384, hidden_size=384, intermediate_size=1024, num_hidden_layers=8,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=64, rope_theta=1000000.0,
                      max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2),
    # SmolLM2-135M's published config (a Llama).
    "smollm2-135m": dict(family="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=100000.0,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
                         bos_token_id=0, eos_token_id=0),
    # Qwen2.5-0.5B's published config (q/k/v biases), for the size of a LoRA checkpoint on a 0.5B base.
    "qwen2.5-0.5b": dict(family="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, rope_theta=1000000.0,
                         max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
                         bos_token_id=151643, eos_token_id=151643),
    # For scripts/wgpu-check and testing scripts/gpu-check without a GPU.
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, rope_theta=1000000.0, max_position_embeddings=1024,
                 rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def device():
    import torch
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync():
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def make(out, shape):
    """A Qwen3 with transformers' own random initialisation (the tiny one rescaled so logits differ
    by units, which makes the backends' comparison in scripts/wgpu-check meaningful)."""
    import torch
    import transformers
    torch.manual_seed(0)
    settings = dict(SHAPES[shape])
    family = {"qwen3": "Qwen3", "qwen2": "Qwen2", "llama": "Llama"}[settings.pop("family", "qwen3")]
    cfg = getattr(transformers, family + "Config")(**settings)
    with torch.device(device()):
        model = getattr(transformers, family + "ForCausalLM")(cfg)
    if shape == "tiny":
        g = torch.Generator(device=model.device).manual_seed(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                noise = torch.randn(p.shape, generator=g, device=p.device)
                p.copy_(1 + 0.2 * noise if name.endswith("norm.weight") else noise if "embed_tokens" in name else noise / p.shape[-1] ** 0.5)
    # bf16 on disk for the big ones (as published); rao reads it into f32.
    model = model.to(torch.bfloat16 if shape in ("qwen3-0.6b", "qwen2.5-0.5b") else torch.float32)
    model.save_pretrained(out)
    print(json.dumps({"made": out, "shape": shape, "parameters": sum(p.numel() for p in model.parameters())}))


def prompts(batch, length, vocab, eos, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, length), generator=g)
    ids[ids == eos] = (eos + 1) % vocab
    return ids


def generate(model, args, batch, sample, eos):
    import torch
    vocab = model.config.vocab_size

    def run(seed):
        ids = prompts(batch, args.prompt, vocab, eos, seed).to(model.device)
        kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if sample else dict(do_sample=False)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new,
                                 min_new_tokens=args.new, pad_token_id=eos, **kwargs)
        sync()
        return (out.shape[1] - ids.shape[1]) * batch

    t0 = time.perf_counter()
    run(1)
    warm = time.perf_counter() - t0
    sync()
    t0 = time.perf_counter()
    tokens = run(2)
    seconds = time.perf_counter() - t0
    return {"measure": "generate" if sample else "generate_greedy", "batch": batch, "prompt": args.prompt,
            "new_tokens": args.new, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "warmup_s": warm}


def update_step(model, args, eos, lora):
    """Update steps of full fine-tuning, or of LoRA adapters added to `model` first."""
    import torch
    vocab = model.config.vocab_size
    if lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, lora_dropout=0.0,
                                                 target_modules=TARGETS))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, weight_decay=0.0)
    ids = prompts(args.train_batch, args.prompt + args.new, vocab, eos, 3).to(model.device)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    # Loss on the completion: targets at positions prompt.. of the sequence.
    mask = torch.zeros(targets.shape, device=model.device)
    mask[:, args.prompt - 1:] = 1.0
    adv = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(args.train_batch)], device=model.device)[:, None]
    old = -math.log(vocab)

    def step():
        logits = model(input_ids=inputs).logits.float()
        lp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
        ratio = torch.exp(lp.detach() - old)
        loss = -(ratio.clamp(0.0, 5.0) * adv * lp * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # waits for the device

    t0 = time.perf_counter()
    losses = [step()]
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    losses += [step() for _ in range(args.train_steps)]
    seconds = time.perf_counter() - t0
    trained = int(mask.sum().item()) * args.train_steps
    positions = inputs.numel() * args.train_steps
    return {"measure": "lora_step" if lora else "full_step", "batch": args.train_batch, "prompt": args.prompt, "new_tokens": args.new,
            "steps": args.train_steps, "trained_tokens": trained, "positions": positions, "seconds": seconds,
            "seconds_per_step": seconds / args.train_steps, "tokens_per_s": trained / seconds,
            "positions_per_s": positions / seconds, "warmup_s": warm, "losses": losses}


def peak(dtype, n):
    """Mean matmul FLOP rate of n×n×n products on random data, 3 warm-ups then 10 timed."""
    import torch
    a = torch.randn(n, n, device=device()).to(dtype)
    b = torch.randn(n, n, device=device()).to(dtype)
    for _ in range(3):
        a @ b
    sync()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    sync()
    seconds = (time.perf_counter() - t0) / 10
    return 2 * n ** 3 / seconds


def emit(rec, out):
    line = json.dumps(rec)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def bench(args):
    import torch
    from transformers import AutoModelForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.threads:
        torch.set_num_threads(args.threads)
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32}
    with open(os.path.join(args.model, "config.json")) as f:
        eos = json.load(f)["eos_token_id"]
    eos = eos[0] if isinstance(eos, list) else eos
    dev = device()
    emit({"measure": "device", "name": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
          "torch": torch.__version__, "threads": torch.get_num_threads()}, args.out)
    for name in args.dtypes.split(","):
        emit({"measure": "peak", "dtype": name, "n": args.peak_n, "flops_per_s": peak(dtypes[name], args.peak_n)}, args.out)
    for name in args.dtypes.split(","):
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtypes[name]).to(dev).eval()
        for batch in [int(b) for b in args.batches.split(",")]:
            emit({"dtype": name, **generate(model, args, batch, True, eos)}, args.out)
        if args.greedy_batch != "none":
            emit({"dtype": name, **generate(model, args, int(args.greedy_batch), False, eos)}, args.out)
        for update in [u for u in args.updates.split(",") if u != "none"]:
            if update == "full":
                # A fresh copy: the LoRA step after it starts from the same weights as rao's.
                full = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtypes[name]).to(dev).train()
                emit({"dtype": name, **update_step(full, args, eos, lora=False)}, args.out)
                del full
            else:
                emit({"dtype": name, **update_step(model.train(), args, eos, lora=True)}, args.out)
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def matmul_parameters(cfg):
    """Weights that multiply each token's activations: every block's projections and the output
    layer (the embedding lookup is no product)."""
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    block = h * q + 2 * h * kv + q * h + 3 * h * cfg["intermediate_size"]
    return layers * block + h * cfg["vocab_size"]


def lora_parameters(cfg, rank=16):
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv, ff = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, cfg["intermediate_size"]
    shapes = [(h, q), (h, kv), (h, kv), (q, h), (h, ff), (h, ff), (ff, h)]
    return layers * sum(rank * (i + o) for i, o in shapes)


def flops(rec, n, n_lora):
    """FLOPs of one measurement. Generation: 2·N per token position processed (prompt and new
    tokens of every row). Full step: forward 2·N, backward 4·N (input and weight gradients) per
    position. LoRA step: forward 2·N, backward through the frozen weights 2·N (input gradients
    only: the base gets no weight gradient), adapters 6·N_lora, per position. Attention scores
    and the element-wise work are left out."""
    if rec["measure"] == "full_step":
        return 6 * n * rec["positions"]
    if rec["measure"] == "lora_step":
        return (4 * n + 6 * n_lora) * rec["positions"]
    return 2 * n * rec["batch"] * (rec["prompt"] + rec["new_tokens"])


def table(args):
    """One row per measurement; a column for each rao run (backend and dtype, in the order they
    ran) and each PyTorch dtype. Each rao column is divided by PyTorch at the same dtype."""
    load = lambda path: [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    rao, torch_recs = load(args.rao), load(args.torch)
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    label = {"generate": "generate (sampled), batch {b}", "generate_greedy": "generate (greedy), batch {b}",
             "full_step": "full update step, batch {b}", "lora_step": "LoRA update step, batch {b}"}
    rank = next((r["lora_rank"] for r in rao if r.get("measure") == "lora_step" and r.get("lora_rank")), 16)
    n, n_lora = matmul_parameters(cfg), lora_parameters(cfg, rank)
    peaks = {r["dtype"]: r["flops_per_s"] for r in torch_recs if r.get("measure") == "peak"}
    # The GPU's bf16 peak is the one that matters there; the CPU's is f32.
    peak_dtype = "bf16" if "bf16" in peaks else "f32"
    peak = peaks.get(peak_dtype)
    dtypes = [d for d in ("bf16", "f32") if any(t.get("dtype") == d and t.get("measure") in label for t in torch_recs)]
    variant = lambda r: (r.get("backend", "?"), r.get("dtype", "f32"))
    variants = []
    for r in rao:
        if r.get("measure") in label and variant(r) not in variants:
            variants.append(variant(r))
    key = lambda r: (r.get("measure"), r.get("batch"))
    rows = [r for r in rao if r.get("measure") in label and "error" not in r]
    errors = [r for r in rao if "error" in r]
    fmt = lambda x: "—" if x is None else f"{x:,.0f}"
    ratio = lambda a, b: "—" if a is None or b is None else f"{a / b:.2f}×"
    frac = lambda r: "—" if r is None or not peak else f"{flops(r, n, n_lora) / r['seconds'] / peak:.1%}"
    tps = lambda x: None if x is None else x["tokens_per_s"]
    name = lambda v: f"rao {v[0]} {v[1]}"
    # Each rao run against PyTorch at its own dtype (else the first PyTorch dtype measured).
    against = {v: (v[1] if v[1] in dtypes else (dtypes[0] if dtypes else None)) for v in variants}
    compared = [v for v in variants if against[v]]
    header = (["measurement", "shape"] + [f"{name(v)} tok/s" for v in variants] + [f"torch {d} tok/s" for d in dtypes]
              + [f"{name(v)} ÷ torch {against[v]}" for v in compared]
              + [f"fraction of the {peak_dtype} peak: " + " / ".join([name(v) for v in variants] + [f"torch {d}" for d in dtypes])])
    line = lambda cells: "| " + " | ".join(cells) + " |"
    out = [f"matmul parameters N = {n:,}, LoRA parameters (rank {rank}) = {n_lora:,}; measured matmul peaks: "
           + ", ".join(f"{d} {p / 1e9:,.0f} GFLOP/s" for d, p in peaks.items()), "",
           line(header), line(["---", "---"] + ["---:"] * (len(header) - 3) + ["---"])]
    keys = []
    for r in rows + [t for t in torch_recs if t.get("measure") in label]:
        if key(r) not in keys:
            keys.append(key(r))
    for k in keys:
        r = {v: next((x for x in rows if key(x) == k and variant(x) == v), None) for v in variants}
        t = {d: next((x for x in torch_recs if key(x) == k and x.get("dtype") == d and "error" not in x), None) for d in dtypes}
        any_rec = next(x for x in list(r.values()) + list(t.values()) if x)
        shape = f"{any_rec['prompt']} prompt + {any_rec['new_tokens']} new tokens"
        out.append(line([label[k[0]].format(b=k[1]), shape] + [fmt(tps(r[v])) for v in variants] + [fmt(tps(t[d])) for d in dtypes]
                        + [ratio(tps(r[v]), tps(t[against[v]])) for v in compared]
                        + [" / ".join([frac(r[v]) for v in variants] + [frac(t[d]) for d in dtypes])]))
    for r in rows:
        if r["measure"] in ("full_step", "lora_step") and "checkpoint_param_bytes" in r:
            out.append(f"\n{name(variant(r))}'s checkpoint after the {label[r['measure']].split(',')[0]}: {r['trainable_parameters']:,} trained "
                       f"parameters, {r['checkpoint_param_bytes'] / 1e6:,.1f} MB of them + {r['checkpoint_optimizer_bytes'] / 1e6:,.1f} MB "
                       "of optimiser state")
    for e in errors:
        out.append(f"\n{name(variant(e))} {e['measure']} failed: {e['error']}")
    text = "\n".join(out)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    b = sub.add_parser("bench")
    b.add_argument("model")
    b.add_argument("--dtypes", default="bf16,f32")
    b.add_argument("--prompt", type=int, default=64)
    b.add_argument("--new", type=int, default=128)
    b.add_argument("--batches", default="1,64")
    b.add_argument("--greedy-batch", default="64")
    b.add_argument("--train-batch", type=int, default=8)
    b.add_argument("--train-steps", type=int, default=3)
    b.add_argument("--updates", default="lora", help="update steps to measure: full,lora | lora | none")
    b.add_argument("--lora-rank", type=int, default=16)
    b.add_argument("--threads", type=int, help="CPU threads (torch.set_num_threads)")
    b.add_argument("--peak-n", type=int, default=8192)
    b.add_argument("--out", help="also append each record to this file")
    t = sub.add_parser("table")
    t.add_argument("model", help="the model directory (its config.json gives the parameter counts)")
    t.add_argument("rao")
    t.add_argument("torch")
    t.add_argument("--out")
    args = p.parse_args()
    {"make": lambda: make(args.dir, args.shape), "bench": lambda: bench(args), "table": lambda: table(args)}[args.cmd]()


if __name__ == "__main__":
    sys.exit(main())
