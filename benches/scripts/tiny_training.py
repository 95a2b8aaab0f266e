"""What lookup_torch.py and count_torch.py share: the rao model in PyTorch (torch_policy.py)
set up and trained as rao's warm start trains it — init N(0, 0.02), Adam 2e-3 decaying linearly
to 10%, global gradient-norm clip 1.0 — with rao's optional previous-token input."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from torch_policy import Transformer  # noqa: E402


class Learner:
    def __init__(self, vocab, d, prev_token, steps, layers=2, lr=2e-3):
        self.model = Transformer(vocab, d, layers, 4, 3 * d)
        for p in self.model.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, 0, 0.02)
        self.prev_mix = torch.nn.Linear(d, d, bias=False) if prev_token else None
        if self.prev_mix is not None:
            torch.nn.init.normal_(self.prev_mix.weight, 0, 0.02)
        self.params = list(self.model.parameters()) + (list(self.prev_mix.parameters()) if prev_token else [])
        self.opt = torch.optim.Adam(self.params, lr=lr)
        self.lr, self.steps, self.step_no = lr, steps, 0

    def logits(self, x, pos, bias):
        """`x: [B, T]` tokens → `[B, T, V]`; each input also sees its predecessor's embedding."""
        h = self.model.emb(x)
        if self.prev_mix is not None:
            h = h + self.prev_mix(torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1))
        for blk in self.model.blocks:
            h = blk(h, pos, bias)
        return self.model.norm(h) @ self.model.emb.weight.T

    def update(self, loss):
        self.step_no += 1
        for g in self.opt.param_groups:
            g["lr"] = self.lr * (1 - 0.9 * self.step_no / self.steps)
        self.opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
