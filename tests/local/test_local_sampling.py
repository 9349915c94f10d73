"""The sampling client through the protocol: seeds, the logprobs of the distribution sampled
from, parity with the trainer's forward, stop conditions, prompt logprobs, and coalescing."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tinker
import torch
from local_helpers import reference_model, sft_datum
from transformers import DynamicCache

from tempering.local import LocalSamplingClient, LocalTrainingClient, ServiceClient
from tempering.local.decoding import cache_kwargs
from tempering.local.tiny import TINY_MODEL

PROMPT = tinker.ModelInput.from_ints([258, 117, 115, 101, 114, 10, 104, 105, 259, 10, 258, 97, 10])


@pytest.fixture(scope="module")
def trainer(service: ServiceClient) -> Iterator[LocalTrainingClient]:
    """A LoRA client trained a few steps, so its adapter is not the identity."""
    client = service.create_lora_training_client(TINY_MODEL, rank=4).result()
    rng = np.random.default_rng(0)
    for _ in range(3):
        client.forward_backward([sft_datum(list(rng.integers(32, 127, size=20)))], "cross_entropy")
        client.optim_step(tinker.AdamParams(learning_rate=2e-2))
    yield client
    client.close()


@pytest.fixture(scope="module")
def sampler(trainer: LocalTrainingClient) -> Iterator[LocalSamplingClient]:
    client = trainer.save_weights_and_get_sampling_client()
    yield client
    client.close()


def _sample(
    sampler: LocalSamplingClient, n: int = 4, prompt: tinker.ModelInput = PROMPT, **params: object
) -> tinker.SampleResponse:
    return sampler.sample(prompt, n, tinker.SamplingParams(**params)).result()  # type: ignore[arg-type]


def test_fixed_seed_is_reproducible(sampler: LocalSamplingClient) -> None:
    a = _sample(sampler, 8, max_tokens=12, seed=3, stop=[])
    b = _sample(sampler, 8, max_tokens=12, seed=3, stop=[])
    c = _sample(sampler, 8, max_tokens=12, seed=4, stop=[])
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    assert [s.logprobs for s in a.sequences] == [s.logprobs for s in b.sequences]
    assert [s.tokens for s in a.sequences] != [s.tokens for s in c.sequences]
    assert len({tuple(s.tokens) for s in a.sequences}) > 1  # samples differ from each other
    assert len({s.sequence_id for s in a.sequences}) == 8


def test_sampler_logprobs_match_trainer_forward(
    sampler: LocalSamplingClient, trainer: LocalTrainingClient
) -> None:
    """At temperature 1, each sampled token's logprob is what forward computes (1e-4, fp32 CPU)."""
    response = _sample(sampler, 6, max_tokens=16, seed=0, stop=[])
    prompt = PROMPT.to_ints()
    data = []
    for seq in response.sequences:
        full = prompt + seq.tokens
        weights = [0.0] * (len(prompt) - 1) + [1.0] * len(seq.tokens)
        data.append(sft_datum(full, weights))
    out = trainer.forward(data, "cross_entropy").result()
    for seq, o in zip(response.sequences, out.loss_fn_outputs, strict=True):
        assert seq.logprobs is not None
        forward_lps = o["logprobs"].to_numpy()[len(prompt) - 1 :]
        np.testing.assert_allclose(seq.logprobs, forward_lps, atol=1e-4, rtol=0)


def _processed_logprobs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Reference: temperature, then top-k, then top-p (the smallest set reaching top_p)."""
    scaled = logits / temperature
    probs = torch.softmax(scaled, dim=-1)
    order = torch.argsort(probs, descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    kept_mass = 0.0
    for rank, token in enumerate(order.tolist()):
        if top_k > 0 and rank >= top_k:
            break
        keep[token] = True
        kept_mass += float(probs[token])
        if top_k > 0:
            continue
        if kept_mass >= top_p:
            break
    if top_k > 0 and top_p < 1:  # top-p on the renormalised top-k distribution
        kept = probs * keep
        kept = kept / kept.sum()
        keep2 = torch.zeros_like(keep)
        mass = 0.0
        for token in torch.argsort(kept, descending=True).tolist():
            if not keep[token]:
                break
            keep2[token] = True
            mass += float(kept[token])
            if mass >= top_p:
                break
        keep = keep2
    return torch.log_softmax(scaled.masked_fill(~keep, -math.inf), dim=-1)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(0.7, -1, 1.0), (1.3, 5, 1.0), (1.0, -1, 0.6), (0.8, 10, 0.7)]
)
def test_logprobs_are_those_of_the_distribution_sampled_from(
    service: ServiceClient, tiny_dir: Path, temperature: float, top_k: int, top_p: float
) -> None:
    sampler = service.create_sampling_client(base_model=TINY_MODEL).result()
    response = _sample(
        sampler, 4, max_tokens=6, seed=1, stop=[], temperature=temperature, top_k=top_k, top_p=top_p
    )
    model = reference_model(tiny_dir)
    prompt = PROMPT.to_ints()
    for seq in response.sequences:
        assert seq.logprobs is not None
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + seq.tokens])).logits[0].float()
        for i, (token, lp) in enumerate(zip(seq.tokens, seq.logprobs, strict=True)):
            ref = _processed_logprobs(logits[len(prompt) - 1 + i], temperature, top_k, top_p)
            assert math.isfinite(float(ref[token])), "sampled a token outside the allowed set"
            assert lp == pytest.approx(float(ref[token]), abs=1e-4)


def test_greedy_and_top_k_one(sampler: LocalSamplingClient, trainer: LocalTrainingClient) -> None:
    greedy = _sample(sampler, 3, max_tokens=10, temperature=0.0, stop=[])
    top1 = _sample(sampler, 2, max_tokens=10, top_k=1, seed=5, stop=[])
    tokens = {tuple(s.tokens) for s in [*greedy.sequences, *top1.sequences]}
    assert len(tokens) == 1
    # Greedy logprobs are the model's own (temperature 1); top-1's are log(1) = 0.
    assert all(lp == pytest.approx(0.0, abs=1e-6) for lp in top1.sequences[0].logprobs or [])
    prompt = PROMPT.to_ints()
    seq = greedy.sequences[0]
    out = trainer.forward(
        [sft_datum(prompt + seq.tokens, [0.0] * (len(prompt) - 1) + [1.0] * 10)], "cross_entropy"
    ).result()
    np.testing.assert_allclose(
        seq.logprobs or [], out.loss_fn_outputs[0]["logprobs"].to_numpy()[len(prompt) - 1 :], atol=1e-4
    )


def test_stop_conditions(sampler: LocalSamplingClient) -> None:
    base = _sample(sampler, 1, max_tokens=12, temperature=0.0, stop=[]).sequences[0]
    assert base.stop_reason == "length"
    assert len(base.tokens) == 12
    assert not set(base.tokens) & {257, 259}  # no end-of-sequence token: those stop too
    # A stop token: generation ends on its first occurrence, the token included.
    stop_token = base.tokens[5]
    first = base.tokens.index(stop_token)
    by_token = _sample(sampler, 1, max_tokens=12, temperature=0.0, stop=[stop_token]).sequences[0]
    assert by_token.stop_reason == "stop"
    assert by_token.tokens == base.tokens[: first + 1]
    # A stop string: ends on the token that completes it.
    tok = sampler.get_tokenizer()
    text = tok.decode(base.tokens)
    stop_text = text[4:6]
    by_string = _sample(sampler, 1, max_tokens=12, temperature=0.0, stop=[stop_text]).sequences[0]
    assert by_string.stop_reason == "stop"
    got = tok.decode(by_string.tokens)
    assert got.endswith(stop_text) or stop_text in got
    assert stop_text not in tok.decode(by_string.tokens[:-1])
    assert by_string.tokens == base.tokens[: len(by_string.tokens)]
    # A single string works too, and max_tokens bounds every sequence.
    single = _sample(sampler, 8, max_tokens=5, seed=2, stop="\x00\x01")
    for seq in single.sequences:
        # Ends at max_tokens, or earlier only on an end-of-sequence token (still a stop token).
        if seq.stop_reason == "length":
            assert len(seq.tokens) == 5
        else:
            assert len(seq.tokens) <= 5
            assert seq.tokens[-1] in {257, 259}
    assert any(s.stop_reason == "length" for s in single.sequences)


def test_default_stop_is_eos(service: ServiceClient) -> None:
    """Train the model to answer with <|im_end|>; with stop=None sampling stops there."""
    client = service.create_lora_training_client(TINY_MODEL, rank=8).result()
    prompt = PROMPT.to_ints()
    answer = [104, 105, 259]  # "hi<|im_end|>"
    datum = sft_datum(prompt + answer, [0.0] * (len(prompt) - 1) + [1.0] * 3)
    for _ in range(40):
        client.forward_backward([datum], "cross_entropy")
        client.optim_step(tinker.AdamParams(learning_rate=3e-3))
    sampler = client.save_weights_and_get_sampling_client()
    response = _sample(sampler, 4, max_tokens=10, temperature=0.0)
    for seq in response.sequences:
        assert seq.tokens == answer
        assert seq.stop_reason == "stop"
    client.close()


def test_prompt_logprobs_and_compute_logprobs(
    sampler: LocalSamplingClient, trainer: LocalTrainingClient
) -> None:
    prompt = PROMPT.to_ints()
    response = sampler.sample(PROMPT, 2, tinker.SamplingParams(max_tokens=3, seed=0), True).result()
    computed = sampler.compute_logprobs(PROMPT).result()
    forward = trainer.forward([sft_datum(prompt)], "cross_entropy").result()
    expected = forward.loss_fn_outputs[0]["logprobs"].to_numpy()
    for lps in (response.prompt_logprobs, computed):
        assert lps is not None
        assert lps[0] is None
        assert len(lps) == len(prompt)
        np.testing.assert_allclose(np.asarray(lps[1:], dtype=np.float32), expected, atol=1e-4)
    assert _sample(sampler, 1, max_tokens=2, seed=0).prompt_logprobs is None


def test_concurrent_requests_are_coalesced_and_match_running_alone(sampler: LocalSamplingClient) -> None:
    prompts = [tinker.ModelInput.from_ints(list(range(40, 40 + n))) for n in (3, 11, 7, 11)]
    params = [
        tinker.SamplingParams(max_tokens=8, seed=i, stop=[], temperature=[1.0, 0.7, 0.0, 1.0][i])
        for i in range(4)
    ]
    alone = [sampler.sample(p, 3, sp).result() for p, sp in zip(prompts, params, strict=True)]
    together = [sampler.sample(p, 3, sp) for p, sp in zip(prompts, params, strict=True)]
    for a, t in zip(alone, together, strict=True):
        got = t.result()
        for sa, st in zip(a.sequences, got.sequences, strict=True):
            assert sa.tokens == st.tokens
            np.testing.assert_allclose(sa.logprobs or [], st.logprobs or [], atol=1e-4)


def test_compute_logprobs_coalesced_with_sampling(sampler: LocalSamplingClient) -> None:
    """max_tokens=0 requests (compute_logprobs) batched with decoding ones return no tokens."""
    alone = sampler.compute_logprobs(PROMPT).result()
    params = tinker.SamplingParams(max_tokens=5, seed=0, stop=[])
    futures = [
        sampler.sample(PROMPT, 2, params),
        sampler.compute_logprobs(PROMPT),
        sampler.sample(PROMPT, 3, params),
    ]
    first, logprobs, last = (f.result() for f in futures)
    assert isinstance(first, tinker.SampleResponse)
    assert isinstance(last, tinker.SampleResponse)
    assert [len(s.tokens) for s in [*first.sequences, *last.sequences]] == [5] * 5
    assert logprobs[0] is None
    np.testing.assert_allclose(np.array(logprobs[1:]), np.array(alone[1:]), atol=1e-5)
    zero = sampler.sample(PROMPT, 2, tinker.SamplingParams(max_tokens=0)).result()
    assert [s.tokens for s in zero.sequences] == [[], []]


def test_num_samples_share_the_prompt(sampler: LocalSamplingClient) -> None:
    response = _sample(sampler, 16, max_tokens=4, seed=9, stop=[])
    assert len(response.sequences) == 16
    assert all(len(s.tokens) == 4 for s in response.sequences)
    empty = _sample(sampler, 2, max_tokens=0)
    assert all(s.tokens == [] and s.stop_reason == "length" for s in empty.sequences)


def test_sampling_client_from_saved_weights(service: ServiceClient, trainer: LocalTrainingClient) -> None:
    path = trainer.save_weights_for_sampler("sampling-test").result().path
    assert "/sampler_weights/" in path
    from_path = service.create_sampling_client(model_path=path).result()
    from_trainer = trainer.save_weights_and_get_sampling_client()
    a = _sample(from_path, 4, max_tokens=8, seed=11, stop=[])
    b = _sample(from_trainer, 4, max_tokens=8, seed=11, stop=[])
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    assert from_path.get_base_model() == TINY_MODEL
    from_path.close()
    from_trainer.close()


def test_snapshot_is_frozen_at_submission(service: ServiceClient) -> None:
    """A sampler taken before a step keeps the old weights."""
    client = service.create_lora_training_client(TINY_MODEL, rank=4).result()
    before = client.save_weights_and_get_sampling_client()
    client.forward_backward([sft_datum(list(range(60, 80)))], "cross_entropy")
    client.optim_step(tinker.AdamParams(learning_rate=5e-2))
    after = client.save_weights_and_get_sampling_client()
    untouched = service.create_sampling_client(base_model=TINY_MODEL).result()
    lp_before = before.compute_logprobs(PROMPT).result()
    lp_after = after.compute_logprobs(PROMPT).result()
    lp_base = untouched.compute_logprobs(PROMPT).result()
    np.testing.assert_allclose(np.array(lp_before[1:]), np.array(lp_base[1:]), atol=1e-5)
    assert not np.allclose(np.array(lp_before[1:]), np.array(lp_after[1:]), atol=1e-3)
    client.close()


def test_sampling_errors(sampler: LocalSamplingClient) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sampler.sample(
            tinker.ModelInput.from_ints([1, 5000]), 1, tinker.SamplingParams(max_tokens=2)
        ).result()
    with pytest.raises(ValueError, match="context"):
        sampler.sample(PROMPT, 1, tinker.SamplingParams(max_tokens=10_000)).result()
    with pytest.raises(ValueError, match="num_samples"):
        sampler.sample(PROMPT, 0, tinker.SamplingParams(max_tokens=2)).result()
    with pytest.raises(ValueError, match="empty"):
        sampler.sample(tinker.ModelInput.empty(), 1, tinker.SamplingParams(max_tokens=2)).result()
    with pytest.raises(ValueError, match="top_p"):
        sampler.sample(PROMPT, 1, tinker.SamplingParams(max_tokens=2, top_p=0.0)).result()
    # The client still works afterwards.
    assert len(_sample(sampler, 1, max_tokens=2, seed=0).sequences) == 1


class _OldForward(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, past_key_values: object = None) -> None: ...


class _NewForward(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, cache: object = None) -> None: ...


class _Wrapper(torch.nn.Module):
    """Shaped like a PEFT model: keywords pass through to what ``get_base_model`` returns."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def get_base_model(self) -> torch.nn.Module:
        return self.inner

    def forward(self, *args: object, **kwargs: object) -> None: ...


def test_the_cache_keyword_follows_the_models_forward() -> None:
    """transformers 5.24 renamed ``past_key_values`` to ``cache``; the decoder passes whichever
    the (wrapped) model's forward declares, so neither version warns or drops the cache."""
    cache = DynamicCache()
    assert cache_kwargs(_OldForward(), cache) == {"past_key_values": cache}
    assert cache_kwargs(_NewForward(), cache) == {"cache": cache}
    assert cache_kwargs(_Wrapper(_NewForward()), cache) == {"cache": cache}
    assert cache_kwargs(_Wrapper(_OldForward()), cache) == {"past_key_values": cache}


# ---- top-K and target logprobs (the SDK's topk_prompt_logprobs, topk_sample_logprobs,
# target_prompt_logprobs), checked against a plain forward pass of the same weights ------------


def _log_softmax_of(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=torch.tensor([tokens])).logits[0].float(), dim=-1)


def _assert_topk(got: list[tuple[int, float]] | None, logp_V: torch.Tensor, k: int) -> None:
    assert got is not None
    values, ids = logp_V.topk(k)
    assert [t for t, _ in got] == ids.tolist()
    np.testing.assert_allclose([lp for _, lp in got], values.numpy(), atol=1e-5, rtol=0)


def test_topk_and_target_logprobs_match_a_forward_pass(service: ServiceClient, tiny_dir: Path) -> None:
    sampler = service.create_sampling_client(base_model=TINY_MODEL).result()
    prompt = PROMPT.to_ints()
    ids = torch.full((len(prompt) - 1, 3), -1, dtype=torch.int64)
    ids[:, 0] = torch.tensor(prompt[1:])  # the prompt's own tokens: equal to its prompt logprobs
    ids[2, 1], ids[5, 2], ids[-1, 1] = 7, 250, 0
    response = sampler.sample(
        PROMPT,
        3,
        tinker.SamplingParams(max_tokens=6, seed=2, stop=[]),
        True,
        topk_prompt_logprobs=5,
        topk_sample_logprobs=4,
        target_prompt_logprobs=tinker.TensorData.from_torch(ids),
    ).result()
    model = reference_model(tiny_dir)
    logp = _log_softmax_of(model, prompt)
    topk = response.topk_prompt_logprobs
    assert topk is not None
    assert len(topk) == len(prompt)
    assert topk[0] is None  # position 0 has no context
    for i in range(1, len(prompt)):
        _assert_topk(topk[i], logp[i - 1], 5)
    target = response.target_prompt_logprobs
    assert target is not None
    assert target.shape == [len(prompt) - 1, 3]
    expected = torch.where(ids >= 0, logp[:-1].gather(1, ids.clamp(min=0)), 0.0)
    np.testing.assert_allclose(target.to_numpy(), expected.numpy(), atol=1e-5, rtol=0)
    assert response.prompt_logprobs is not None
    np.testing.assert_allclose(target.to_numpy()[:, 0], response.prompt_logprobs[1:], atol=1e-6)
    for seq in response.sequences:
        assert seq.topk_logprobs is not None
        assert seq.logprobs is not None
        assert len(seq.topk_logprobs) == len(seq.tokens) == 6
        full = _log_softmax_of(model, prompt + seq.tokens)
        for i, token in enumerate(seq.tokens):
            position = full[len(prompt) - 1 + i]  # the distribution token i was drawn from (T=1)
            _assert_topk(seq.topk_logprobs[i], position, 4)
            assert seq.logprobs[i] == pytest.approx(float(position[token]), abs=1e-5)


def test_topk_sample_logprobs_follow_the_sampling_distribution(
    service: ServiceClient, tiny_dir: Path
) -> None:
    """With top-k / temperature the top-K list is that of the distribution sampled from (the
    tokens it excludes are left out); at temperature 0 it is the model's own."""
    sampler = service.create_sampling_client(base_model=TINY_MODEL).result()
    prompt = PROMPT.to_ints()
    model = reference_model(tiny_dir)
    params = tinker.SamplingParams(max_tokens=4, seed=3, stop=[], temperature=0.8, top_k=3)
    (seq,) = sampler.sample(PROMPT, 1, params, topk_sample_logprobs=6).result().sequences
    assert seq.topk_logprobs is not None
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + seq.tokens])).logits[0].float()
    for i, row in enumerate(seq.topk_logprobs):
        ref = _processed_logprobs(logits[len(prompt) - 1 + i], 0.8, 3, 1.0)
        assert row is not None
        assert len(row) == 3  # three tokens can be drawn; the other slots are empty
        _assert_topk(row, ref, 3)
        assert seq.tokens[i] in [t for t, _ in row]
    (greedy,) = (
        sampler.sample(
            PROMPT, 1, tinker.SamplingParams(max_tokens=3, temperature=0.0, stop=[]), topk_sample_logprobs=2
        )
        .result()
        .sequences
    )
    full = _log_softmax_of(model, prompt + greedy.tokens)
    for i, row in enumerate(greedy.topk_logprobs or []):
        _assert_topk(row, full[len(prompt) - 1 + i], 2)
        assert row is not None
        assert row[0][0] == greedy.tokens[i]


def test_sparse_target_prompt_logprobs_keep_their_layout(sampler: LocalSamplingClient) -> None:
    prompt = PROMPT.to_ints()
    ids = torch.full((len(prompt) - 1, 4), -1, dtype=torch.int64)
    ids[3, 2], ids[7, 0] = 42, 101
    sparse = tinker.TensorData.from_torch_sparse(ids, pad_value=-1)
    assert sparse.sparse_crow_indices is not None  # the SDK's own encoding
    dense = tinker.TensorData.from_torch(ids)
    params = tinker.SamplingParams(max_tokens=1, seed=0)
    got = sampler.sample(PROMPT, 1, params, target_prompt_logprobs=sparse).result().target_prompt_logprobs
    ref = sampler.sample(PROMPT, 1, params, target_prompt_logprobs=dense).result().target_prompt_logprobs
    assert got is not None
    assert ref is not None
    assert got.sparse_crow_indices == sparse.sparse_crow_indices
    assert got.sparse_col_indices == sparse.sparse_col_indices
    np.testing.assert_allclose(got.to_numpy(pad_value=0), ref.to_numpy(), atol=1e-6)
    assert (ref.to_numpy() != 0).sum() == 2


def test_topk_and_target_refusals(sampler: LocalSamplingClient) -> None:
    params = tinker.SamplingParams(max_tokens=1)
    with pytest.raises(ValueError, match="topk_prompt_logprobs=100000 is larger than the model's vocabulary"):
        sampler.sample(PROMPT, 1, params, topk_prompt_logprobs=100_000).result()
    with pytest.raises(ValueError, match="topk_sample_logprobs must be >= 0"):
        sampler.sample(PROMPT, 1, params, topk_sample_logprobs=-1).result()
    n = len(PROMPT.to_ints()) - 1
    bad_id = tinker.TensorData.from_torch(torch.full((n, 1), 5000, dtype=torch.int64))
    with pytest.raises(ValueError, match="token id 5000 is outside the vocabulary"):
        sampler.sample(PROMPT, 1, params, target_prompt_logprobs=bad_id).result()
    wrong_rows = tinker.TensorData.from_torch(torch.zeros((n + 1, 1), dtype=torch.int64))
    with pytest.raises(ValueError, match=r"shape \[len\(prompt\) - 1, K\]"):
        sampler.sample(PROMPT, 1, params, target_prompt_logprobs=wrong_rows).result()
    out_of_range = tinker.TensorData(
        data=[3],
        dtype="int64",
        shape=[n, 2],
        sparse_crow_indices=[0, 1] + [1] * (n - 1),
        sparse_col_indices=[2],
    )
    with pytest.raises(ValueError, match="column index 2 is out of range"):
        sampler.sample(PROMPT, 1, params, target_prompt_logprobs=out_of_range).result()
    assert len(_sample(sampler, 1, max_tokens=2, seed=0).sequences) == 1  # still serving
