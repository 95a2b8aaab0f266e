"""Why the long-document learner fails: a leaf must count the lines of its slice that match a
question, and the rao model (torch_policy.py, same sizes and training settings as the warm
start) does not learn to. A leaf's context as rao writes it —
`<bos> <rec> @0 count WHO VERB WHAT S S S C C C read S S S C C C <eos> <obs> LINES… answer N N N`
(here with the question's pattern repeated after the lines and the previous-token input, the
two changes that made multi-hop lookups learnable) — trained on fresh random slices.
Prints, every 300 steps, the exact-count accuracy on 256 fresh slices next to the accuracy of
always answering the most common count (the prior), per slice size.
Usage: python benches/scripts/count_torch.py [STEPS]   (needs torch; e.g. /work/torchenv)
"""
import collections
import os
import random
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from tiny_training import Learner  # noqa: E402
from torch_policy import causal_bias  # noqa: E402

SPEAKERS, SPELLS, FILLER = 6, 6, 6
WORDS = ["<pad>", "<bos>", "<rec>", "@0", "count", "read", "answer", "<eos>", "<obs>", "anyone", "anything", "rolls", "casts", "says"]
WORDS += [str(i) for i in range(10)] + [f"sp{i}" for i in range(SPEAKERS)] + [f"spell{i}" for i in range(SPELLS)] + [f"w{i}" for i in range(FILLER)]
ID = {w: i for i, w in enumerate(WORDS)}


def number(n):
    return [ID[c] for c in f"{n:03d}"]


def line():
    s, k = f"sp{random.randrange(SPEAKERS)}", random.randrange(10)
    if k < 4:
        return (s, "rolls", str(random.randrange(10)))
    if k < 7:
        return (s, "casts", f"spell{random.randrange(SPELLS)}")
    return (s, "says", f"w{random.randrange(FILLER)}")


def leaf(lo, hi):
    """(tokens, generated mask, index of the count's last digit, count) — rao's question mix."""
    lines = [line() for _ in range(random.randint(lo, hi))]
    q = random.choice([
        (f"sp{random.randrange(SPEAKERS)}", "rolls", "anything"),
        ("anyone", "casts", f"spell{random.randrange(SPELLS)}"),
        ("anyone", "rolls", str(random.randrange(10))),
    ])
    count = sum((q[0] == "anyone" or q[0] == s) and q[1] == v and (q[2] == "anything" or q[2] == w) for s, v, w in lines)
    start = random.randrange(300)
    toks = [ID["<bos>"], ID["<rec>"], ID["@0"], ID["count"]] + [ID[w] for w in q] + number(start) + number(len(lines))
    gen = [0] * len(toks)
    read = [ID["read"]] + number(start) + number(len(lines)) + [ID["<eos>"]]
    toks, gen = toks + read + [ID["<obs>"]], gen + [1] * len(read) + [0]
    for ln in lines:
        toks, gen = toks + [ID[w] for w in ln], gen + [0, 0, 0]
    toks, gen = toks + [ID[w] for w in q], gen + [0, 0, 0]
    answer = [ID["answer"]] + number(count) + [ID["<eos>"]]
    return toks + answer, gen + [1] * len(answer), len(toks) + 3, count


def train(lo, hi, steps, d=64, seed=0):
    random.seed(seed)
    torch.manual_seed(seed)
    learner = Learner(len(WORDS), d, True, steps)

    def batch(n):
        leaves = [leaf(lo, hi) for _ in range(n)]
        t = max(len(x[0]) for x in leaves)
        toks = torch.tensor([x[0] + [0] * (t - len(x[0])) for x in leaves])
        gen = torch.tensor([x[1] + [0] * (t - len(x[1])) for x in leaves]).float()
        pos = torch.arange(t - 1).expand(n, t - 1)
        return leaves, toks, gen, learner.logits(toks[:, :-1], pos, causal_bias(n, t - 1))

    report = []
    for step in range(1, steps + 1):
        _, toks, gen, logits = batch(64)
        lp = F.log_softmax(logits, -1).gather(-1, toks[:, 1:, None])[..., 0]
        learner.update(-(lp * gen[:, 1:]).sum() / gen[:, 1:].sum())
        if step % 300 == 0:
            with torch.no_grad():
                leaves, toks, _, logits = batch(256)
            exact = sum(int(logits[i, x[2] - 1].argmax() == toks[i, x[2]]) for i, x in enumerate(leaves)) / 256
            prior = collections.Counter(x[3] for x in leaves).most_common(1)[0][1] / 256
            report.append(f"{step}:{exact:.2f}(prior {prior:.2f})")
    print(f"{lo}-{hi} lines  exact count  " + "  ".join(report), flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    for lo, hi in ((1, 2), (3, 6), (8, 20)):
        train(lo, hi, steps)
