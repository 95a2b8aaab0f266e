"""Why the long-document learner fails: a leaf must count the lines of its slice that match a
question, and the rao model (torch_policy.py, same sizes and training settings as the warm
start) does not learn to. A leaf's context as rao writes it —
`<bos> <rec> @0 count WHO VERB WHAT S S S C C C read S S S C C C <eos> <obs> LINES… answer N N N`
(here with the question's pattern repeated after the lines and the previous-token input, the
two changes that made multi-hop lookups learnable) — trained on fresh random slices.
Prints, every 300 steps, the exact-count accuracy on 256 fresh slices next to the accuracy of
always answering the most common count (the prior), per slice size.
With `--balanced` (session 6) the training slices are 8-20 lines whose counts are spread evenly
over 0-10 (rao's `balanced_counts`), and held-out accuracy is printed on balanced and on natural
slices every 250 steps.
Usage: python benches/scripts/count_torch.py [STEPS] [--balanced]   (needs torch; e.g. /work/torchenv)
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


QUESTIONS = [
    lambda: (f"sp{random.randrange(SPEAKERS)}", "rolls", "anything"),
    lambda: ("anyone", "casts", f"spell{random.randrange(SPELLS)}"),
    lambda: ("anyone", "rolls", str(random.randrange(10))),
]


def matches(q, ln):
    s, v, w = ln
    return (q[0] == "anyone" or q[0] == s) and q[1] == v and (q[2] == "anything" or q[2] == w)


def matching_line(q):
    s = q[0] if q[0] != "anyone" else f"sp{random.randrange(SPEAKERS)}"
    if q[1] == "rolls":
        return (s, "rolls", q[2] if q[2] != "anything" else str(random.randrange(10)))
    return (s, "casts", q[2])


def balanced_lines(q, n):
    """n lines of which k, uniform in 0..min(n, 10), match q (as rao's `balanced_counts`)."""
    lines = []
    while len(lines) < n:
        ln = line()
        if not matches(q, ln):
            lines.append(ln)
    for i in random.sample(range(n), random.randint(0, min(n, 10))):
        lines[i] = matching_line(q)
    return lines


def leaf(lo, hi, balanced=False):
    """(tokens, generated mask, index of the count's last digit, count) — rao's question mix."""
    n = random.randint(lo, hi)
    if balanced:
        q = random.choice(QUESTIONS)()
        lines = balanced_lines(q, n)
    else:
        lines = [line() for _ in range(n)]
        q = random.choice(QUESTIONS)()
    count = sum(matches(q, ln) for ln in lines)
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


def train(lo, hi, steps, balanced=False, d=64, seed=0):
    random.seed(seed)
    torch.manual_seed(seed)
    learner = Learner(len(WORDS), d, True, steps)

    def batch(n, bal):
        leaves = [leaf(lo, hi, bal) for _ in range(n)]
        t = max(len(x[0]) for x in leaves)
        toks = torch.tensor([x[0] + [0] * (t - len(x[0])) for x in leaves])
        gen = torch.tensor([x[1] + [0] * (t - len(x[1])) for x in leaves]).float()
        pos = torch.arange(t - 1).expand(n, t - 1)
        return leaves, toks, gen, learner.logits(toks[:, :-1], pos, causal_bias(n, t - 1))

    def held_out(bal):
        with torch.no_grad():
            leaves, toks, _, logits = batch(256, bal)
        exact = sum(int(logits[i, x[2] - 1].argmax() == toks[i, x[2]]) for i, x in enumerate(leaves)) / 256
        prior = collections.Counter(x[3] for x in leaves).most_common(1)[0][1] / 256
        return f"{exact:.2f}(prior {prior:.2f})"

    report = []
    every = 250 if balanced else 300
    for step in range(1, steps + 1):
        _, toks, gen, logits = batch(64, balanced)
        lp = F.log_softmax(logits, -1).gather(-1, toks[:, 1:, None])[..., 0]
        learner.update(-(lp * gen[:, 1:]).sum() / gen[:, 1:].sum())
        if step % every == 0:
            if balanced:
                print(f"{lo}-{hi} lines, balanced training, step {step}: exact on balanced slices {held_out(True)}, on natural slices {held_out(False)}", flush=True)
            else:
                report.append(f"{step}:{held_out(False)}")
    if not balanced:
        print(f"{lo}-{hi} lines  exact count  " + "  ".join(report), flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    args = [a for a in sys.argv[1:] if a != "--balanced"]
    steps = int(args[0]) if args else 1500
    if "--balanced" in sys.argv:
        train(8, 20, steps, balanced=True)
    else:
        for lo, hi in ((1, 2), (3, 6), (8, 20)):
            train(lo, hi, steps)
