"""The rao policy model written in PyTorch, timed on the same workloads as
`cargo run --example bench_policy -p rao-stages` (run both with benches/scripts/policy_vs_torch.sh).

Same architecture: tied embeddings, RMSNorm, rotate-half RoPE, causal attention with an additive
bias, SwiGLU MLP; same sizes; CISPO loss; AdamW with global gradient-norm clipping.
Usage: python torch_policy.py VOCAB D_MODEL LAYERS   (prints lines `key value`)
"""
import math
import sys
import time

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class RMSNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


def rope(x, pos, theta=10000.0):
    # x: [B, H, T, hd]; pos: [B, T]
    hd = x.shape[-1]
    freqs = theta ** (-torch.arange(0, hd // 2, dtype=torch.float32) * 2 / hd)
    ang = pos[:, None, :, None].float() * freqs
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Block(torch.nn.Module):
    def __init__(self, d, h, ff):
        super().__init__()
        self.h = h
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)
        self.gate = torch.nn.Linear(d, ff, bias=False)
        self.up = torch.nn.Linear(d, ff, bias=False)
        self.down = torch.nn.Linear(ff, d, bias=False)

    def forward(self, x, pos, bias, cache=None):
        b, t, d = x.shape
        hd = d // self.h
        q, k, v = self.qkv(self.n1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.h, hd).transpose(1, 2) for z in (q, k, v))
        q, k = rope(q, pos), rope(k, pos)
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd) + bias
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.o(y)
        z = self.n2(x)
        return x + self.down(F.silu(self.gate(z)) * self.up(z))


class Transformer(torch.nn.Module):
    def __init__(self, vocab, d, layers, heads, ff):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList([Block(d, heads, ff) for _ in range(layers)])
        self.norm = RMSNorm(d)

    def forward(self, toks, pos, bias, caches=None):
        x = self.emb(toks)
        for i, blk in enumerate(self.blocks):
            x = blk(x, pos, bias, None if caches is None else caches[i])
        return self.norm(x) @ self.emb.weight.T


def causal_bias(b, t):
    m = torch.full((t, t), -1e9).triu(1)
    return m.expand(b, 1, t, t)


def generate(model, batch, prompt_len, new_tokens, vocab):
    with torch.no_grad():
        toks = torch.randint(4, vocab, (batch, prompt_len))
        pos = torch.arange(prompt_len).expand(batch, prompt_len)
        caches = [dict() for _ in model.blocks]
        logits = model(toks, pos, causal_bias(batch, prompt_len), caches)[:, -1]
        made = 0
        for step in range(new_tokens):
            nxt = torch.multinomial(logits.softmax(-1), 1)
            made += batch
            p = torch.full((batch, 1), prompt_len + step)
            logits = model(nxt, p, torch.zeros(batch, 1, 1, 1), caches)[:, -1]
        return made


def main():
    vocab, d, layers = (int(a) for a in sys.argv[1:4])
    torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else torch.get_num_threads())
    model = Transformer(vocab, d, layers, 4, 3 * d)
    params = sum(p.numel() for p in model.parameters())
    print(f"params {params}")
    print(f"threads {torch.get_num_threads()}")
    base = None
    for batch in (1, 64):
        t0, toks = time.perf_counter(), 0
        while time.perf_counter() - t0 < 2.0:
            toks += generate(model, batch, 6, 17, vocab)
        tps = toks / (time.perf_counter() - t0)
        base = base or tps
        print(f"generate_batch{batch}_tokens_per_s {tps:.0f}")

    # Update step: 64 sequences × 64 tokens (63 predicted), second half generated; CISPO loss.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    toks = torch.randint(4, vocab, (64, 64))
    inputs, targets = toks[:, :-1], toks[:, 1:]
    t = 63
    mask = (torch.arange(t) >= 31).float().expand(64, t)
    adv = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(64)])[:, None]
    old = torch.full((64, t), -1.0)
    pos = torch.arange(t).expand(64, t)
    bias = causal_bias(64, t)

    def step():
        lp = model(inputs, pos, bias).log_softmax(-1).gather(-1, targets[..., None])[..., 0]
        ratio = (lp.detach() - old).exp().clamp(0.0, 5.0)
        loss = -(ratio * adv * lp * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()
    step()
    # Median of single-step times: robust to the machine's speed drifting during the run.
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    per = sorted(times)[len(times) // 2]
    print(f"update_ms_per_step {per * 1e3:.1f}")


if __name__ == "__main__":
    main()
