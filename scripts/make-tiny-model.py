"""Builds a tiny random-weight Llama, offline and reproducibly, for the live tests in tests/real/.

No model can be downloaded here, and the tests measure the relay, not the model: a tiny random
model produces real tokens through a real server's real streaming code, fast on a CPU.

- Tokenizer: a byte-level BPE of ~2k tokens trained on the licence texts every Debian machine
  has (/usr/share/common-licenses), read in sorted order, so the same machine kind trains the
  same vocabulary. Byte-level like GPT-2, which lets llama.cpp's converter name it `gpt-2`.
- Shape: hidden 256 with 4 heads (head_dim 64, the one vLLM's CPU attention supports; 16 dies
  with `Unsupported CPU attention configuration`), 2 layers, float32.
- A ChatML chat template, which both vLLM (jinja) and llama.cpp recognise.
- Weights from torch.manual_seed(SEED): the same files every run.

Usage: python scripts/make-tiny-model.py OUT_DIR   (needs torch, transformers, tokenizers:
scripts/install-vllm.sh's venv has them).
"""

from __future__ import annotations

import sys
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 2048
CORPUS_DIR = Path("/usr/share/common-licenses")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def corpus_files() -> list[str]:
    """Every regular file under the corpus dir, sorted so training sees one order."""
    files = sorted(str(p) for p in CORPUS_DIR.rglob("*") if p.is_file() and not p.is_symlink())
    if not files:
        sys.exit(f"make-tiny-model: no text under {CORPUS_DIR} to train the tokenizer on")
    return files


def train_tokenizer():
    """A byte-level BPE (the GPT-2 family's pre-tokenizer and decoder) wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train(corpus_files(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def build_model(tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    return LlamaForCausalLM(config).to(torch.float32)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    tokenizer = train_tokenizer()
    model = build_model(tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    print(f"make-tiny-model: {params:,} parameters, vocab {len(tokenizer)} -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
