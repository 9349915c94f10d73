"""The built-in tiny model: a small Llama-style causal LM with a byte-level tokenizer.

It needs no download: the package builds it from a config with a seeded initialisation, so two
builds with the same seed are identical. It is written out as an ordinary Hugging Face model
directory (``config.json``, ``model.safetensors``, ``tokenizer.json``, ``chat_template.jinja``),
which ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load like
any other model.

Tokenizer: token id ``b`` (0-255) is the byte ``b``; then the special tokens below. Text is
encoded as its UTF-8 bytes, with no tokens added (no BOS). Chat messages use ChatML::

    <|im_start|>user\\nWhat is 2+2?<|im_end|>\\n<|im_start|>assistant\\n4<|im_end|>\\n

Example::

    from tempering.local.tiny import build_tiny_model
    path = build_tiny_model("/tmp/tiny")          # or the CLI: tempering tiny-model /tmp/tiny
    tok = transformers.AutoTokenizer.from_pretrained(path)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from tempering.fs import naming
from tempering.local._hf import GLOBAL_RNG_LOCK, quiet_progress
from tempering.model_info import TINY_MODEL

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "TINY_MODEL",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "tiny_config",
    "tiny_model_dir",
]


_VERSION = 1
"""Bump when the architecture, tokenizer or initialisation changes (names the cache entry)."""

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|bos|>",  # 256
    "<|eos|>",  # 257
    "<|im_start|>",  # 258
    "<|im_end|>",  # 259: ends an assistant message; the tokenizer's eos_token
    "<|pad|>",  # 260
    "<|reserved_0|>",  # 261-263: pad the vocabulary to a multiple of 8
    "<|reserved_1|>",
    "<|reserved_2|>",
)
_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)
_BOS, _EOS, _IM_START, _IM_END, _PAD = 256, 257, 258, 259, 260

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (what ``ByteLevel`` uses)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The byte-level tokenizer of the tiny model: id ``b`` is byte ``b``, then the specials."""
    byte_chars = _bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    assert tokenizer.get_vocab_size() == _VOCAB_SIZE
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|bos|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config() -> LlamaConfig:
    """The architecture: 4 layers, hidden 128, 4 heads (2 KV heads), about 0.85M parameters."""
    return LlamaConfig(
        vocab_size=_VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=_BOS,
        eos_token_id=_IM_END,
        pad_token_id=_PAD,
    )


def build_tiny_model(directory: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write the tiny model (weights initialised from ``seed``) and its tokenizer to ``directory``.

    The directory is created if needed; files already there are overwritten. Returns its path.
    """
    path = Path(directory)
    with naming(path, doing="creating the model directory"):
        path.mkdir(parents=True, exist_ok=True)
    with GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(tiny_config())
    model.generation_config = GenerationConfig(
        bos_token_id=_BOS, eos_token_id=[_IM_END, _EOS], pad_token_id=_PAD
    )
    with naming(path, doing="writing the tiny model to"), quiet_progress():
        model.save_pretrained(path)
        build_tiny_tokenizer().save_pretrained(path)
    return path


def tiny_model_dir(root: str | os.PathLike[str], seed: int = 0) -> Path:
    """The tiny model built once under ``root/models``; later calls reuse it.

    Safe when several processes ask at once: each builds into a temporary directory and the
    first to rename it into place wins.
    """
    models_dir = Path(root) / "models"
    target = models_dir / f"tempering-tiny-v{_VERSION}-seed{seed}"
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".building-", dir=models_dir))
    try:
        build_tiny_model(scratch, seed=seed)
        try:
            scratch.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
