"""The reference side of rao's Hugging Face parity tests (tests/hf.rs), with transformers and
PyTorch. No weights are downloaded: every model is made here from a config with random weights.

    reference.py make OUT        a tokenizer trained here, tiny random Llama / SmolLM2-shaped /
                                 Qwen2 / Qwen3 checkpoints, and what transformers computes on them
                                 (OUT/<name>/expected.json, OUT/tokenizer_expected.json)
    reference.py logits DIR IDS  logits of transformers' model in DIR for the prompts in the JSON
                                 file IDS (a list of lists of token ids), as JSON on stdout
    reference.py peft BASE ADAPTER IDS
                                 the same for the model in BASE with peft's LoRA adapter ADAPTER
    reference.py tiny OUT        one tiny random Qwen3 checkpoint with the tokenizer trained here:
                                 models/tiny-qwen3, which pipelines/bring-your-own-model.yaml reads
                                 by default (it acts at random: it is there to try the pipeline)
"""
import json
import os
import sys

import torch

torch.manual_seed(0)
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

SPECIALS = ["<s>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Pre-tokenization in the style of the Qwen2 / Llama 3 tokenizers (Unicode classes, look-ahead):
# where regex engines differ, token ids would.
PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'].strip() }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Craft 2 oak planks from 1 oak log; then craft a crafting table.",
    "  leading spaces,\ttabs\tand   runs   of   spaces  ",
    "Zürich, São Paulo, Kraków, İstanbul — naïve café déjà vu.",
    "日本語のテキストと中文文本，还有한국어 문장.",
    "emoji 🙂🚀 and symbols ∑ ∫ √ ≤ ≥ ≠",
    "numbers 1234567890 3.14159 -42 1e-6",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhi there<|im_end|>",
    "line one\nline two\r\nline three\n\n\nafter blank lines",
    "What's the plan? I'll go; you'd stay, we're done, they've left.",
]


def corpus_lines():
    lines = []
    for i in range(200):
        for text in CORPUS:
            lines.append(text if i % 3 else text.upper())
    return lines


def make_tokenizer(out):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(PATTERN), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_lines(), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def randomize(model, seed):
    """Weights of a size that makes logits differ by units (from_config's are tiny, biases 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.3 * noise)
            elif "embed_tokens" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)


MODELS = {
    # Grouped-query attention, its own output layer, Llama 3.1's rope scaling, bf16 shards.
    "llama": dict(
        kind="llama", dtype="bfloat16", shard="40KB",
        config=dict(vocab_size=416, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, tie_word_embeddings=False, rms_norm_eps=1e-5, max_position_embeddings=256,
                    rope_theta=500000.0,
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16)),
    ),
    # SmolLM2's layout: tied embeddings, θ = 100,000, three query heads on one key/value head; f16.
    "smollm": dict(
        kind="llama", dtype="float16", shard=None,
        config=dict(vocab_size=416, hidden_size=48, intermediate_size=128, num_hidden_layers=3, num_attention_heads=3,
                    num_key_value_heads=1, tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=256),
    ),
    # Qwen2.5: biases on q/k/v, tied.
    "qwen2": dict(
        kind="qwen2", dtype="float32", shard=None,
        config=dict(vocab_size=416, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=256),
    ),
    # Qwen3: q/k norms, a head width that is not hidden / heads, untied.
    "qwen3": dict(
        kind="qwen3", dtype="float32", shard=None,
        config=dict(vocab_size=416, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=24, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    max_position_embeddings=256),
    ),
}

PROMPTS = [
    "The quick brown fox",
    "Craft 2 oak planks from 1 oak log; then craft a crafting table. Zürich — naïve café!",
    "<|im_start|>user\nWhat's 1234 + 5678?<|im_end|>\n<|im_start|>assistant\n",
    "emoji 🙂 and   runs of spaces\n\n\nand lines, 日本語のテキスト and more words to make this the longest prompt",
]


def model_classes(kind):
    import transformers as t
    return {"llama": (t.LlamaConfig, t.LlamaForCausalLM), "qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM), "qwen3": (t.Qwen3Config, t.Qwen3ForCausalLM)}[kind]


def load(path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def padded_logits(model, prompts):
    """Logits of a right-padded batch, each prompt's own positions only."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    return [logits[i, : len(p)].tolist() for i, p in enumerate(prompts)]


def greedy(model, prompt, n):
    """n tokens by argmax over full forward passes (no cache, no stopping)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def make(out):
    os.makedirs(out, exist_ok=True)
    tok_dir = os.path.join(out, "tokenizer")
    fast = make_tokenizer(tok_dir)
    from tokenizers import Tokenizer
    raw = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    texts = CORPUS + PROMPTS + ["", " ", "\n", "a<|im_end|>b", "<s>x</s>"]
    conversation = [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Hi 🙂"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Craft a table."}]
    with open(os.path.join(out, "tokenizer_expected.json"), "w") as f:
        json.dump({
            "texts": texts,
            "ids": [raw.encode(t).ids for t in texts],
            "ids_no_special": [raw.encode(t, add_special_tokens=False).ids for t in texts],
            "transformers_ids": [fast(t)["input_ids"] for t in texts],
            "decoded": [raw.decode(raw.encode(t).ids, skip_special_tokens=False) for t in texts],
            "conversation": conversation,
            "chat": fast.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True),
            "chat_no_prompt": fast.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False),
        }, f)
    prompts = [fast(p)["input_ids"] for p in PROMPTS]
    for i, (name, spec) in enumerate(MODELS.items()):
        config_class, model_class = model_classes(spec["kind"])
        cfg = config_class(bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, **spec["config"])
        model = model_class(cfg)
        randomize(model, seed=100 + i)
        path = os.path.join(out, name)
        model.to(getattr(torch, spec["dtype"]))
        kwargs = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
        model.save_pretrained(path, **kwargs)
        fast.save_pretrained(path)
        # What transformers computes from the files as written (bf16/f16 weights upcast to f32).
        ref = load(path)
        with open(os.path.join(path, "expected.json"), "w") as f:
            json.dump({"prompts": prompts, "logits": padded_logits(ref, prompts), "greedy": [greedy(ref, p, 32) for p in prompts]}, f)


def logits(path, ids_file):
    with open(ids_file) as f:
        prompts = json.load(f)
    json.dump(padded_logits(load(path), prompts), sys.stdout)


def peft_logits(base, adapter, ids_file):
    from peft import PeftModel
    with open(ids_file) as f:
        prompts = json.load(f)
    model = PeftModel.from_pretrained(load(base), adapter).eval()
    json.dump(padded_logits(model, prompts), sys.stdout)


def tiny(out):
    os.makedirs(out, exist_ok=True)
    fast = make_tokenizer(out)
    spec = MODELS["qwen3"]
    config_class, model_class = model_classes(spec["kind"])
    model = model_class(config_class(bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, **spec["config"]))
    randomize(model, seed=7)
    model.save_pretrained(out)
    fast.save_pretrained(out)


if __name__ == "__main__":
    {"make": make, "logits": logits, "peft": peft_logits, "tiny": tiny}[sys.argv[1]](*sys.argv[2:])
