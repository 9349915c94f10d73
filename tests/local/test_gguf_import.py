"""Any GGUF file as ``base_model``: the tiny model written out as a llama GGUF here (as llama.cpp's
converter writes one: Q and K rows permuted for its rotary layout, a byte-level ``gpt2``
vocabulary, one tensor Q8_0-quantized), then loaded back through the model cache. The converted
model must compute what the tiny model computes with that one tensor dequantized."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from local_helpers import next_token_logprobs, reference_model

from tempering.local.checkpoints import default_root
from tempering.local.model import resolve_model_dir
from tempering.local.model_cache import MANIFEST, list_models
from tempering.local.tiny import CHAT_TEMPLATE, SPECIAL_TOKENS, build_tiny_tokenizer, tiny_config

QUANTIZED = "blk.0.ffn_up.weight"
"""The tensor stored as Q8_0 (the rest stay F32, so the comparison is exact)."""


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K row order (transformers undoes it when loading a llama GGUF)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_tiny_gguf(model_dir: Path, out: Path) -> dict[str, np.ndarray]:
    """The tiny model in ``model_dir`` as a GGUF file; returns the HF state dict as written
    (with the quantized tensor's dequantized values)."""
    config = tiny_config()
    model = reference_model(model_dir)
    state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    writer = gguf.GGUFWriter(out, "llama")
    writer.add_name("tempering tiny")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(config.hidden_size // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    tokenizer = build_tiny_tokenizer()
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([3 if token in SPECIAL_TOKENS else 1 for token, _ in vocab])
    writer.add_token_scores([0.0] * len(vocab))  # no merges: the tiny vocabulary is bytes only
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(259)
    writer.add_pad_token_id(260)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    parts = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(config.num_hidden_layers):
        for hf, gg in parts.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    assert set(names) == set(state)
    for hf_name, gguf_name in names.items():
        data = state[hf_name]
        if gguf_name.endswith("attn_q.weight"):
            data = _permute(data, heads)
        elif gguf_name.endswith("attn_k.weight"):
            data = _permute(data, kv_heads)
        if gguf_name == QUANTIZED:
            q = gguf.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(gguf_name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            state[hf_name] = gguf.dequantize(q, gguf.GGMLQuantizationType.Q8_0).reshape(data.shape)
        else:
            writer.add_tensor(gguf_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return state


@pytest.mark.timeout(120)
def test_a_gguf_file_loads_as_base_model(tiny_dir: Path, tmp_path: Path) -> None:
    gguf_path = tmp_path / "tiny.gguf"
    state = _write_tiny_gguf(tiny_dir, gguf_path)
    root = tmp_path / "home"
    model_dir = resolve_model_dir(str(gguf_path), root)
    assert model_dir.parent == root / "models"
    assert model_dir.name.startswith("gguf-")
    manifest = json.loads((model_dir / MANIFEST).read_text())
    assert manifest["architecture"] == "llama"
    assert manifest["quantization"] == ["F32", "Q8_0"]
    assert manifest["source"] == {"kind": "gguf-file", "file": str(gguf_path.resolve())}
    # Once: a directory holding the same file resolves to the same entry, without converting.
    before = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_dir(str(tmp_path), root) == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == before
    assert [m.name for m in list_models(root)] == [model_dir.name]

    converted = reference_model(model_dir)
    expected = reference_model(tiny_dir)
    expected.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    np.testing.assert_allclose(next_token_logprobs(converted), next_token_logprobs(expected), atol=1e-5)
    tok = build_tiny_tokenizer()
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(model_dir)
    text = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    assert loaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert loaded.chat_template == CHAT_TEMPLATE
    assert default_root() != root  # the user's cache was not touched
