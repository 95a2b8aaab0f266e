"""A tiny random Qwen3 that vLLM's CPU build can serve: models/tiny-qwen3's shape and tokenizer,
with a head width of 32 and 4,096 positions (the environments' instructions alone take
over 500 of its character-level tokens).

    make_tiny_qwen3_vllm.py OUT [--bench]

--bench: a larger random Qwen3 of the same tokenizer for throughput measurements (width 512,
8 layers, 8 heads of 64, 4 key-value heads, feed-forward 1536: 25M parameters).

models/tiny-qwen3 (crates/rao-policy/tests/hf/reference.py's `tiny`) has head_dim 24: vLLM 0.32's
CPU attention takes only 32, 64, 80, 96, 112, 128, 160, 192, 224, 256 and 512, and a server on it
answers /health but dies at the first request ("Unsupported CPU attention configuration:
head_dim=24"). Its 256 positions are also too few for a conversation. Everything else is the same:
the config of reference.py's "qwen3", its weight scheme (`randomize`, fixed seed), f32, and the
tokenizer files of models/tiny-qwen3, copied. Runs with target/py's Python
(torch + transformers); no download.
"""
import os
import shutil
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "crates", "rao-policy", "tests", "hf"))

import torch  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from reference import MODELS, randomize  # noqa: E402

SOURCE = os.path.join(ROOT, "models", "tiny-qwen3")
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
SEED = 7


BENCH = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
             intermediate_size=1536)


def main(out, bench):
    os.makedirs(out, exist_ok=True)
    config = dict(MODELS["qwen3"]["config"], head_dim=32, max_position_embeddings=4096)
    if bench:
        config.update(BENCH)
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(Qwen3Config(bos_token_id=0, eos_token_id=3, **config))
    randomize(model, seed=SEED)
    model.to(torch.float32).save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(SOURCE, name), os.path.join(out, name))


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) not in (1, 2) or args[1:] not in ([], ["--bench"]):
        sys.exit(__doc__)
    main(args[0], args[1:] == ["--bench"])
