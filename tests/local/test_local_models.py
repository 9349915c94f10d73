"""Any Hugging Face causal LM from a local directory: here a small Qwen2-style model with tied
embeddings and attention biases, which exercises LoRA on a tied unembedding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tinker
import torch
from local_helpers import sft_datum
from transformers import Qwen2Config, Qwen2ForCausalLM

from tempering.local import ServiceClient
from tempering.local._hf import quiet_progress
from tempering.local.tiny import build_tiny_tokenizer


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen2-tiny")
    config = Qwen2Config(
        vocab_size=264,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=259,
        bos_token_id=256,
        pad_token_id=260,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = Qwen2ForCausalLM(config)
    with quiet_progress():
        model.save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    return path


def test_lora_on_a_tied_unembedding_trains_and_samples_consistently(
    service: ServiceClient, qwen_dir: Path
) -> None:
    client = service.create_lora_training_client(str(qwen_dir), rank=4).result()
    assert client.get_info().model_data.arch == "qwen2"
    assert any("lm_head" in n for n in client._params)
    embed_before = client._model.get_base_model().get_input_embeddings().weight.detach().clone()
    datum = sft_datum(list(range(60, 90)))
    for _ in range(3):
        client.forward_backward([datum], "cross_entropy")
        client.optim_step(tinker.AdamParams(learning_rate=2e-2))
    # The sampler merges the adapters into its own copy; the unembedding's adapter must not
    # leak into the (tied) embedding. Parity with the trainer's forward checks both.
    sampler = client.save_weights_and_get_sampling_client()
    response = sampler.sample(
        tinker.ModelInput.from_ints([60, 61, 62]), 4, tinker.SamplingParams(max_tokens=10, stop=[], seed=0)
    ).result()
    data = [
        sft_datum([60, 61, 62, *s.tokens], [0.0, 0.0] + [1.0] * len(s.tokens)) for s in response.sequences
    ]
    out = client.forward(data, "cross_entropy").result()
    for seq, o in zip(response.sequences, out.loss_fn_outputs, strict=True):
        np.testing.assert_allclose(seq.logprobs or [], o["logprobs"].to_numpy()[2:], atol=1e-4)
    embed_after = client._model.get_base_model().get_input_embeddings().weight
    torch.testing.assert_close(embed_after, embed_before, rtol=0, atol=0)
    # And it round-trips through a checkpoint.
    path = client.save_state("qwen").result().path
    resumed = service.create_training_client_from_state(path).result()
    again = resumed.forward(data, "cross_entropy").result()
    for a, b in zip(out.loss_fn_outputs, again.loss_fn_outputs, strict=True):
        np.testing.assert_array_equal(a["logprobs"].to_numpy(), b["logprobs"].to_numpy())
    client.close()
    resumed.close()


def test_full_fine_tuning_of_a_local_directory(service: ServiceClient, qwen_dir: Path) -> None:
    client = service.create_full_training_client(str(qwen_dir)).result()
    data = [sft_datum(list(range(100, 120)))]
    before = client.forward(data, "cross_entropy").result().metrics["loss:sum"]
    for _ in range(5):
        client.forward_backward(data, "cross_entropy")
        client.optim_step(tinker.AdamParams(learning_rate=1e-2))
    after = client.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert after < before
    client.close()
