"""How a LoRA sampler applies its adapter when it decodes (``SamplerModel.decode_model``,
``$TEMPERING_LORA_DECODE``): merged weights sample what the adapter as trained samples, the
trainer's weights are never written, there is one decode copy per live weight version (remade
after an in-place update, returned when the sampler goes), unadapted weights are shared, a
half-precision model's adapter is cast to its dtype, and the ``auto`` policy."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import tinker
import torch
from local_helpers import sft_datum

from tempering.local import LocalSamplingClient, LocalTrainingClient, ServiceClient
from tempering.local.model import LORA_DECODE_ENV, hf_model, lora_decoding
from tempering.local.sampling import SamplerModel
from tempering.local.tiny import TINY_MODEL

PROMPT = [258, 117, 115, 101, 114, 10, 104, 105, 259, 10]


def _trained(service: ServiceClient) -> LocalTrainingClient:
    """A LoRA client (the unembedding adapted too) after a few steps: a non-zero adapter."""
    client = service.create_lora_training_client(TINY_MODEL, rank=4, train_unembed=True).result()
    rng = np.random.default_rng(5)
    for _ in range(3):
        client.forward_backward([sft_datum(list(rng.integers(32, 127, size=24)))], "cross_entropy")
        client.optim_step(tinker.AdamParams(learning_rate=2e-2)).result()
    return client


@pytest.fixture(scope="module")
def trainer(service: ServiceClient) -> Iterator[LocalTrainingClient]:
    client = _trained(service)
    yield client
    client.close()


def _sample(sampler: SamplerModel) -> tinker.SampleResponse:
    client = LocalSamplingClient(sampler)
    try:
        params = tinker.SamplingParams(max_tokens=24, seed=7, stop=[])
        return client.sample(tinker.ModelInput.from_ints(PROMPT), 4, params).result()
    finally:
        client.close()


def _snapshot(trainer: LocalTrainingClient, monkeypatch: pytest.MonkeyPatch, how: str) -> SamplerModel:
    monkeypatch.setenv(LORA_DECODE_ENV, how)
    return trainer.snapshot()


def test_merged_weights_sample_what_the_adapter_as_trained_samples(
    trainer: LocalTrainingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = {n: p.detach().clone() for n, p in trainer._model.named_parameters()}  # pyright: ignore[reportPrivateUsage]
    merged = _snapshot(trainer, monkeypatch, "merge")
    as_trained = _snapshot(trainer, monkeypatch, "as-trained")
    assert merged.lora == "merge"
    assert merged.decode_model() is not merged.model
    assert as_trained.decode_model() is as_trained.model
    a, b = _sample(merged), _sample(as_trained)
    for sa, sb in zip(a.sequences, b.sequences, strict=True):
        assert sa.tokens == sb.tokens
        np.testing.assert_allclose(sa.logprobs or [], sb.logprobs or [], atol=1e-5, rtol=0)
    # Merging wrote into weights of the copy's own, never into the trainer's (base or adapter).
    for name, p in trainer._model.named_parameters():  # pyright: ignore[reportPrivateUsage]
        assert torch.equal(p, weights[name]), name


def test_the_merged_copy_shares_the_unadapted_weights_and_goes_with_its_sampler(
    trainer: LocalTrainingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    sampler = _snapshot(trainer, monkeypatch, "merge")
    decode = sampler.decode_model()
    assert decode is sampler.decode_model()  # made once per weight version
    base = hf_model(trainer._model)  # pyright: ignore[reportPrivateUsage]
    embed = cast(torch.Tensor, base.get_input_embeddings().weight)
    assert hf_model(decode).get_input_embeddings().weight is embed  # not adapted: the same tensor
    names = dict(decode.named_parameters())
    trained = dict(base.named_parameters())
    for adapted in ("model.layers.0.self_attn.q_proj", "lm_head"):
        mine, shared = names[f"{adapted}.weight"], trained[f"{adapted}.base_layer.weight"]
        assert mine.data_ptr() != shared.data_ptr()
        assert not torch.equal(mine, shared)
    gone = weakref.ref(decode)
    del decode, sampler
    gc.collect()
    assert gone() is None


def test_an_in_place_adapter_update_remakes_the_merged_copy(
    trainer: LocalTrainingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    sampler = _snapshot(trainer, monkeypatch, "merge")
    before = _sample(sampler)
    first = sampler.decode_model()
    with torch.no_grad():  # what an inflight save does to a live sampler's adapter
        for name, p in sampler.model.named_parameters():
            if "lora_B" in name:
                p.mul_(3.0)
    assert sampler.decode_model() is not first
    after = _sample(sampler)
    monkeypatch.setenv(LORA_DECODE_ENV, "as-trained")
    expected = _sample(
        SamplerModel.create(
            sampler.model,
            base_model=sampler.base_model,
            model_dir=sampler.model_dir,
            placement=sampler.placement,
            tokenizer=sampler.tokenizer,
        )
    )
    for sa, se, sb in zip(after.sequences, expected.sequences, before.sequences, strict=True):
        np.testing.assert_allclose(sa.logprobs or [], se.logprobs or [], atol=1e-5, rtol=0)
        assert sa.tokens != sb.tokens or not np.allclose(sa.logprobs or [], sb.logprobs or [], atol=1e-3)


def test_a_half_precision_adapter_is_cast_to_the_model_dtype_for_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LORA_DECODE_ENV, "auto")
    service = ServiceClient(root=tmp_path, device="cpu", dtype="bfloat16", num_threads=1)
    try:
        client = _trained(service)
        sampler = client.snapshot()
        assert sampler.lora == "cast"
        decode = sampler.decode_model()
        adapters = {n: p for n, p in decode.named_parameters() if "lora_" in n}
        assert adapters
        assert all(p.dtype == torch.bfloat16 for p in adapters.values())
        # The snapshot keeps its float32 adapter (the copy's are its own); base weights shared.
        assert all(p.dtype == torch.float32 for n, p in sampler.model.named_parameters() if "lora_" in n)
        base = {id(p) for n, p in sampler.model.named_parameters() if "lora_" not in n}
        assert base == {id(p) for n, p in decode.named_parameters() if "lora_" not in n}
        cast_out = _sample(sampler)
        monkeypatch.setenv(LORA_DECODE_ENV, "as-trained")
        as_trained = _sample(client.snapshot())
        gaps = [
            np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs)).mean()
            for a, b in zip(cast_out.sequences, as_trained.sequences, strict=True)
            if a.tokens == b.tokens
        ]
        assert gaps  # a bfloat16 rounding of the adapter's products: the same samples, close logprobs
        assert max(gaps) < 0.05
        client.close()
    finally:
        service.close()


def test_the_auto_policy_merges_where_it_is_exact(
    trainer: LocalTrainingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = trainer._model  # pyright: ignore[reportPrivateUsage]
    monkeypatch.setenv(LORA_DECODE_ENV, "auto")
    assert lora_decoding(model) == "merge"  # float32: exact to rounding
    assert lora_decoding(hf_model(model)) == "as-trained"  # no adapter
    monkeypatch.setenv(LORA_DECODE_ENV, "cast")
    assert lora_decoding(model) == "cast"
    monkeypatch.setenv(LORA_DECODE_ENV, "sometimes")
    with pytest.raises(ValueError, match="TEMPERING_LORA_DECODE='sometimes'"):
        lora_decoding(model)
