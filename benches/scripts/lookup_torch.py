"""Why the multi-hop pages end on the query and why `prev_token` exists: the one-hop lookup
("find the fact whose relation is R on the page, write its object") learned by the rao model
written in PyTorch (torch_policy.py), with and without each change. Same sizes, init
N(0, 0.02), Adam 2e-3 decaying to 10%, batch 64, global clip 1.0, names drawn fresh per
sequence (as rao permutes them). Prints the loss on the answer token every 250 steps.
Usage: python benches/scripts/lookup_torch.py [STEPS]   (needs torch; e.g. /work/torchenv)
"""
import os
import random
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from tiny_training import Learner  # noqa: E402
from torch_policy import causal_bias  # noqa: E402

ENTITIES, RELATIONS = 48, 8
BOS, REC, DEPTH0, SEARCH, ANSWER, EOS, OBS = range(7)
FIRST_REL = 7
FIRST_ENT = FIRST_REL + RELATIONS
VOCAB = FIRST_ENT + ENTITIES


def question(query_at_end):
    """`<bos> <rec> @0 R E search E R <eos> <obs> (E r x)×8 [E R] answer X <eos>`; the index of X."""
    e, r = random.randrange(ENTITIES), random.randrange(RELATIONS)
    objects = [random.randrange(ENTITIES) for _ in range(RELATIONS)]
    order = random.sample(range(RELATIONS), RELATIONS)
    toks = [BOS, REC, DEPTH0, FIRST_REL + r, FIRST_ENT + e, SEARCH, FIRST_ENT + e, FIRST_REL + r, EOS, OBS]
    for rel in order:
        toks += [FIRST_ENT + e, FIRST_REL + rel, FIRST_ENT + objects[rel]]
    if query_at_end:
        toks += [FIRST_ENT + e, FIRST_REL + r]
    toks += [ANSWER, FIRST_ENT + objects[r], EOS]
    return toks, len(toks) - 2


def train(query_at_end, prev_token, steps, seed=0, d=64):
    random.seed(seed)
    torch.manual_seed(seed)
    learner = Learner(VOCAB, d, prev_token, steps)
    t = len(question(query_at_end)[0]) - 1
    bias, pos = causal_bias(64, t), torch.arange(t).expand(64, t)
    losses = []
    for step in range(1, steps + 1):
        batch = [question(query_at_end) for _ in range(64)]
        toks = torch.tensor([b[0] for b in batch])
        x, y, at = toks[:, :-1], toks[:, 1:], batch[0][1] - 1
        loss = F.cross_entropy(learner.logits(x, pos, bias)[:, at], y[:, at])
        learner.update(loss)
        if step % 250 == 0:
            losses.append(f"{step}:{loss.item():.3f}")
    print(f"query_at_end={query_at_end!s:5} prev_token={prev_token!s:5} answer loss  " + "  ".join(losses), flush=True)


if __name__ == "__main__":
    torch.set_num_threads(2)
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    for query_at_end in (False, True):
        for prev_token in (False, True):
            train(query_at_end, prev_token, steps)
