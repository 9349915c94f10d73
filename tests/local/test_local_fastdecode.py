"""The static decoder (:mod:`tempering.local.fastdecode`) against the Hugging Face forward pass:
the same tokens and logprobs for one request, for coalesced requests of different prompt
lengths whose rows stop at different times (slot compaction), past the initial cache capacity
(growth), with a LoRA adapter unmerged and merged, and for a Qwen3-shaped model (q/k norms); and
parity with the trainer's forward in float32."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tinker
import torch
from local_helpers import qwen3_test_model, sft_datum

from tempering.local import LocalSamplingClient, LocalTrainingClient, ServiceClient
from tempering.local.checkpoints import CheckpointStore
from tempering.local.continuous import length_groups
from tempering.local.draws import draw_inverse_cdf
from tempering.local.fastdecode import supports_static_decoding
from tempering.local.loader import ModelLoader
from tempering.local.model import resolve_placement
from tempering.local.sampling import SamplerModel
from tempering.local.tiny import TINY_MODEL


@pytest.fixture(scope="module")
def trainer(service: ServiceClient) -> Iterator[LocalTrainingClient]:
    client = service.create_lora_training_client(TINY_MODEL, rank=4).result()
    rng = np.random.default_rng(1)
    for _ in range(3):
        client.forward_backward([sft_datum(list(rng.integers(32, 127, size=24)))], "cross_entropy")
        client.optim_step(tinker.AdamParams(learning_rate=2e-2))
    yield client
    client.close()


def _requests(client: LocalSamplingClient, max_tokens: int) -> list[tinker.SampleResponse]:
    prompts = [list(range(40, 40 + n)) for n in (3, 17, 8)]
    params = [
        tinker.SamplingParams(max_tokens=max_tokens, seed=i, temperature=t, stop=stop)
        for i, (t, stop) in enumerate([(1.0, list(range(60, 110))), (0.8, []), (1.2, list(range(100, 160)))])
    ]
    futures = [
        client.sample(tinker.ModelInput.from_ints(p), 4, sp) for p, sp in zip(prompts, params, strict=True)
    ]
    return [f.result() for f in futures]


def _both(
    monkeypatch: pytest.MonkeyPatch, sampler: SamplerModel, max_tokens: int
) -> tuple[list[tinker.SampleResponse], list[tinker.SampleResponse]]:
    static = LocalSamplingClient(sampler)
    try:
        fast = _requests(static, max_tokens)
    finally:
        static.close()
    monkeypatch.setenv("TEMPERING_STATIC_DECODING", "0")
    assert not supports_static_decoding(sampler.model)
    plain = LocalSamplingClient(sampler)
    try:
        slow = _requests(plain, max_tokens)
    finally:
        plain.close()
    monkeypatch.delenv("TEMPERING_STATIC_DECODING")
    return fast, slow


def _assert_same(fast: list[tinker.SampleResponse], slow: list[tinker.SampleResponse]) -> None:
    lengths: set[int] = set()
    for a, b in zip(fast, slow, strict=True):
        for sa, sb in zip(a.sequences, b.sequences, strict=True):
            assert sa.tokens == sb.tokens
            assert sa.stop_reason == sb.stop_reason
            np.testing.assert_allclose(sa.logprobs or [], sb.logprobs or [], atol=2e-5, rtol=0)
            lengths.add(len(sa.tokens))
    # Rows stopped at different steps, so slots were dropped and compacted on the way.
    assert len(lengths) > 2


@pytest.mark.parametrize("how", ["as-trained", "merge"])
def test_static_decoding_matches_the_hf_forward_with_an_adapter(
    trainer: LocalTrainingClient, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    monkeypatch.setenv("TEMPERING_LORA_DECODE", how)
    sampler = trainer.snapshot()
    assert sampler.lora == how
    assert supports_static_decoding(sampler.model)
    # The snapshot shares the frozen base weights with the trainer; only the adapter is copied.
    trainer_base = {id(p) for p in trainer._model.parameters() if not p.requires_grad}  # pyright: ignore[reportPrivateUsage]
    snap = list(sampler.model.parameters())
    assert sum(id(p) in trainer_base for p in snap) == len(trainer_base)
    assert any("lora_" in n for n, _ in sampler.model.named_parameters())
    fast, slow = _both(monkeypatch, sampler, max_tokens=24)
    _assert_same(fast, slow)


def test_static_cache_grows_past_its_first_capacity(
    trainer: LocalTrainingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache starts with room for 256 new tokens and doubles when a row needs more."""
    fast, slow = _both(monkeypatch, trainer.snapshot(), max_tokens=300)
    assert max(len(s.tokens) for r in fast for s in r.sequences) > 256
    _assert_same(fast, slow)


def test_static_decoding_of_a_qwen3_shaped_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """q/k norms and grouped-query attention (4 query heads per key/value head)."""
    tiny = ModelLoader(CheckpointStore(tmp_path / "store"), resolve_placement("cpu", "float32")).base(
        TINY_MODEL
    )
    model = qwen3_test_model(int(tiny.model.config.vocab_size))
    sampler = SamplerModel.create(
        model,
        base_model="qwen3-test",
        model_dir=tmp_path,
        placement=resolve_placement("cpu", "float32"),
        tokenizer=tiny.tokenizer,
    )
    assert supports_static_decoding(model)
    fast, slow = _both(monkeypatch, sampler, max_tokens=20)
    _assert_same(fast, slow)


@pytest.mark.parametrize("how", ["as-trained", "merge"])
def test_static_decoding_logprobs_match_the_trainer_forward(
    trainer: LocalTrainingClient, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """fp32: each sampled token's logprob is what the trainer's forward computes, to 1e-5, with
    the adapter as trained or merged."""
    monkeypatch.setenv("TEMPERING_LORA_DECODE", how)
    client = trainer.save_weights_and_get_sampling_client()
    prompt = [258, 117, 115, 101, 114, 10, 104, 105, 259, 10]
    response = client.sample(
        tinker.ModelInput.from_ints(prompt), 6, tinker.SamplingParams(max_tokens=32, seed=4, stop=[])
    ).result()
    client.close()
    data = [
        sft_datum(prompt + s.tokens, [0.0] * (len(prompt) - 1) + [1.0] * len(s.tokens))
        for s in response.sequences
    ]
    out = trainer.forward(data, "cross_entropy").result()
    for seq, o in zip(response.sequences, out.loss_fn_outputs, strict=True):
        forward = o["logprobs"].to_numpy()[len(prompt) - 1 :]
        np.testing.assert_allclose(seq.logprobs or [], forward, atol=1e-5, rtol=0)


def test_inverse_cdf_draws_follow_the_distribution() -> None:
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0]])
    u = torch.rand(20000, generator=torch.Generator().manual_seed(0))
    drawn = draw_inverse_cdf(probs[:1].expand(20000, 5), u)
    freq = torch.bincount(drawn, minlength=5).float() / 20000
    np.testing.assert_allclose(freq.numpy(), probs[0].numpy(), atol=0.015)
    # Zero-probability tokens are never drawn, even at the ends of [0, 1).
    edges = torch.tensor([0.0, 1.0 - 2**-24, 0.5])
    for row in probs:
        got = draw_inverse_cdf(row.expand(3, 5), edges)
        assert bool((row[got] > 0).all()), (row, got)


def test_a_request_joins_a_running_batch_and_is_answered_when_its_rows_stop(
    trainer: LocalTrainingClient,
) -> None:
    """Continuous batching: a short request that arrives while a long one decodes is answered
    when its own rows stop (before the long one ends), with the tokens it gets alone."""
    client = trainer.save_weights_and_get_sampling_client()
    long_prompt = tinker.ModelInput.from_ints(list(range(40, 60)))
    short_prompt = tinker.ModelInput.from_ints([258, 104, 105])
    short_params = tinker.SamplingParams(max_tokens=6, seed=11, stop=[])
    try:
        alone = client.sample(short_prompt, 3, short_params).result()
        long = client.sample(long_prompt, 4, tinker.SamplingParams(max_tokens=400, seed=1, stop=[]))
        while not long.future().running():  # the long request is decoding
            pass
        short = client.sample(short_prompt, 3, short_params)
        joined = short.result()
        assert not long.future().done()
        assert [s.tokens for s in joined.sequences] == [s.tokens for s in alone.sequences]
        for a, b in zip(alone.sequences, joined.sequences, strict=True):
            np.testing.assert_allclose(a.logprobs or [], b.logprobs or [], atol=1e-5)
        assert all(len(s.tokens) == 400 for s in long.result().sequences)
    finally:
        client.close()


def test_prompts_are_prefilled_in_groups_of_similar_length() -> None:
    lengths = [5, 100, 6, 98, 5, 7, 300]
    groups = length_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        longest = max(lengths[i] for i in group)
        assert longest * len(group) <= 1.25 * sum(lengths[i] for i in group) or len(group) == 1
    assert [sorted(lengths[i] for i in g) for g in groups] == [[5, 5, 6, 7], [98, 100], [300]]
