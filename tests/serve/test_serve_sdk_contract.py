"""The SDK's optional features against ``tempering serve``, each honoured or refused by name:
sparse CSR loss inputs, top-K and target logprobs, ``ttl_seconds`` and ``user_metadata`` on
saves, ``copy_weights``, ``list_checkpoints(training_client.model_id)``, session metadata,
``kind="inflight"``, and the refusals of ``record_stability_info`` and the Dimuon optimizer."""

from __future__ import annotations

import datetime as dt
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "local"))

from local_helpers import reference_model  # pyright: ignore[reportMissingImports]  # tests/local

from tempering.serve.state import GAP_TIMEOUT_S
from tempering.serve.testing import API_KEY, ServerProcess

pytestmark = pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")  # the SDK's leak (conftest)

TOKENS = list(b"the quick brown fox jumps over the lazy dog")  # the tiny tokenizer: id b is byte b
ERROR_DEADLINE_S = 15.0


def _datum(tokens: list[int]) -> tinker.Datum:
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


@pytest.fixture(scope="module")
def trainer(service: tinker.ServiceClient, tiny_dir: Path) -> tinker.TrainingClient:
    return service.create_lora_training_client(
        str(tiny_dir), rank=4, seed=1, user_metadata={"team": "tempering", "purpose": "tests"}
    ).result(timeout=120)


@pytest.fixture(scope="module")
def rest(server: ServerProcess) -> tinker.RestClient:
    return tinker.RestClient(base_url=server.url, api_key=API_KEY)


def _soft_targets(rng: np.random.Generator, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[n, k]`` targets and weights, two live cells per row (so the SDK sends them as CSR)."""
    targets = torch.zeros((n, k), dtype=torch.int64)
    weights = torch.zeros((n, k), dtype=torch.float32)
    for row in range(n):
        cols = rng.choice(k, size=2, replace=False)
        targets[row, cols] = torch.from_numpy(rng.integers(1, 250, size=2))
        weights[row, cols] = torch.tensor([0.7, 0.3])
    return targets, weights


def test_sparse_soft_targets_train_like_dense_ones(trainer: tinker.TrainingClient) -> None:
    """Soft-target cross-entropy with ``[T, K]`` torch tensors: the SDK sends them as sparse CSR;
    the server densifies them, so the loss and logprobs equal those of the same dense arrays."""
    rng = np.random.default_rng(0)
    inputs = TOKENS[:24]
    targets, weights = _soft_targets(rng, len(inputs), 8)
    sparse = tinker.Datum(
        model_input=tinker.ModelInput.from_ints(inputs),
        loss_fn_inputs={"target_tokens": targets, "weights": weights},  # pyright: ignore[reportArgumentType]
    )
    assert sparse.loss_fn_inputs["weights"].sparse_crow_indices is not None  # sent as CSR
    assert sparse.loss_fn_inputs["target_tokens"].sparse_crow_indices is not None
    dense = tinker.Datum(
        model_input=tinker.ModelInput.from_ints(inputs),
        loss_fn_inputs={"target_tokens": targets.numpy(), "weights": weights.numpy()},
    )
    got = trainer.forward([sparse], "cross_entropy").result(timeout=60)
    want = trainer.forward([dense], "cross_entropy").result(timeout=60)
    assert np.isfinite(got.metrics["loss:sum"])
    assert got.metrics["loss:sum"] == pytest.approx(want.metrics["loss:sum"], rel=1e-6)
    np.testing.assert_allclose(
        got.loss_fn_outputs[0]["logprobs"].to_numpy(), want.loss_fn_outputs[0]["logprobs"].to_numpy()
    )
    trainer.forward_backward([sparse], "cross_entropy").result(timeout=60)  # and it trains


def test_out_of_range_sparse_indices_are_a_named_400(trainer: tinker.TrainingClient) -> None:
    n = 6
    bad = tinker.TensorData(
        data=[1.0],
        dtype="float32",
        shape=[n, 4],
        sparse_crow_indices=[0, 1] + [1] * (n - 1),
        sparse_col_indices=[9],
    )
    datum = tinker.Datum(
        model_input=tinker.ModelInput.from_ints(TOKENS[:n]),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(np.ones((n, 4), np.int64)),
            "weights": bad,
        },
    )
    start = time.monotonic()
    with pytest.raises(tinker.BadRequestError, match=r"field 'weights'.*column index 9 is out of range"):
        trainer.forward([datum], "cross_entropy").result(timeout=30)
    assert time.monotonic() - start < ERROR_DEADLINE_S
    # The refused request used up its number: the next one does not wait for it (GAP_TIMEOUT_S).
    start = time.monotonic()
    assert trainer.forward([_datum(TOKENS[:10])], "cross_entropy").result(timeout=30).metrics["loss:sum"] > 0
    assert time.monotonic() - start < GAP_TIMEOUT_S / 2


def test_topk_and_target_logprobs_equal_a_forward_pass(service: tinker.ServiceClient, tiny_dir: Path) -> None:
    sampler = service.create_sampling_client(base_model=str(tiny_dir)).result(timeout=120)
    prompt = TOKENS[:12]
    ids = torch.full((len(prompt) - 1, 3), -1, dtype=torch.int64)
    ids[1, 0], ids[4, 2], ids[-1, 1] = 101, 7, 255
    target = tinker.TensorData.from_torch_sparse(ids, pad_value=-1)
    assert target.sparse_crow_indices is not None
    response = sampler.sample(
        tinker.ModelInput.from_ints(prompt),
        2,
        tinker.SamplingParams(max_tokens=5, seed=4, stop=[]),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=4,
        topk_sample_logprobs=3,
        target_prompt_logprobs=target,
    ).result(timeout=60)
    model = reference_model(tiny_dir)

    def log_softmax(tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(input_ids=torch.tensor([tokens])).logits[0].float(), dim=-1)

    def check(row: list[tuple[int, float]] | None, logp: torch.Tensor, k: int) -> None:
        assert row is not None
        values, best = logp.topk(k)
        assert [t for t, _ in row] == best.tolist()
        np.testing.assert_allclose([lp for _, lp in row], values.numpy(), atol=1e-5, rtol=0)

    logp = log_softmax(prompt)
    topk = response.topk_prompt_logprobs
    assert topk is not None
    assert topk[0] is None
    for i in range(1, len(prompt)):
        check(topk[i], logp[i - 1], 4)
    got = response.target_prompt_logprobs
    assert got is not None
    assert got.sparse_crow_indices == target.sparse_crow_indices  # the request's layout
    expected = torch.where(ids >= 0, logp[:-1].gather(1, ids.clamp(min=0)), 0.0)
    np.testing.assert_allclose(got.to_numpy(pad_value=0), expected.numpy(), atol=1e-5, rtol=0)
    for seq in response.sequences:
        assert seq.topk_logprobs is not None
        assert len(seq.topk_logprobs) == len(seq.tokens) == 5
        full = log_softmax(prompt + seq.tokens)
        for i, row in enumerate(seq.topk_logprobs):
            check(row, full[len(prompt) - 1 + i], 3)


def test_sampling_refusals_name_the_feature(
    service: tinker.ServiceClient, trainer: tinker.TrainingClient, tiny_dir: Path
) -> None:
    sampler = service.create_sampling_client(base_model=str(tiny_dir)).result(timeout=120)
    prompt = tinker.ModelInput.from_ints(TOKENS[:8])
    params = tinker.SamplingParams(max_tokens=2, seed=0)
    assert len(sampler.sample(prompt, 1, params).result(timeout=60).sequences) == 1  # weights ready
    start = time.monotonic()
    with pytest.raises(
        tinker.BadRequestError, match="topk_prompt_logprobs=100000 is larger than the model's"
    ):
        sampler.sample(prompt, 1, params, topk_prompt_logprobs=100_000).result(timeout=30)
    ids = tinker.TensorData.from_numpy(np.full((7, 1), 4000, dtype=np.int64))
    with pytest.raises(tinker.BadRequestError, match="token id 4000 is outside the vocabulary"):
        sampler.sample(prompt, 1, params, target_prompt_logprobs=ids).result(timeout=30)
    with pytest.raises(tinker.BadRequestError, match="prompt_alt_tokens_k"):
        sampler.sample(prompt, 1, params, prompt_alt_tokens_k=2).result(timeout=30)
    with pytest.raises(tinker.BadRequestError, match="prompt_logprobs_last_n"):
        sampler.sample(prompt, 1, params, True, prompt_logprobs_last_n=2).result(timeout=30)
    path = trainer.save_weights_for_sampler("for-stability").result(timeout=60).path
    stable = trainer.create_sampling_client(path, record_stability_info=True).result(timeout=60)
    with pytest.raises(tinker.BadRequestError, match="record_stability_info"):
        stable.sample(prompt, 1, params).result(timeout=30)
    assert time.monotonic() - start < ERROR_DEADLINE_S


def test_dimuon_is_refused_by_name(
    service: tinker.ServiceClient, trainer: tinker.TrainingClient, tiny_dir: Path
) -> None:
    start = time.monotonic()
    with pytest.raises(tinker.BadRequestError, match="Dimuon"):
        service.create_lora_training_client(
            str(tiny_dir), rank=2, optimizer=tinker.types.DimuonOptimizerConfig()
        ).result(timeout=30)
    with pytest.raises(tinker.BadRequestError, match="Dimuon"):
        trainer.optim_step(tinker.types.DimuonParams(learning_rate=1e-3)).result(timeout=30)
    assert trainer.optim_step(tinker.AdamParams(learning_rate=1e-3)).result(timeout=30) is not None
    assert time.monotonic() - start < ERROR_DEADLINE_S


def _when(value: dt.datetime | None) -> float:
    assert value is not None
    return value.timestamp()


def test_ttl_and_user_metadata_on_saves(
    service: tinker.ServiceClient, rest: tinker.RestClient, trainer: tinker.TrainingClient
) -> None:
    """``list_checkpoints(training_client.model_id)`` finds the client's checkpoints, with the
    expiry times and metadata they were saved with; an expired one goes at the next listing."""
    saved_at = time.time()
    kept = trainer.save_state("kept", ttl_seconds=3600, user_metadata={"step": "1"}).result(timeout=60).path
    long = trainer.save_weights_for_sampler("long", ttl_seconds=7200).result(timeout=60).path
    plain = trainer.save_state("plain").result(timeout=60).path
    listed = {
        c.tinker_path: c for c in rest.list_checkpoints(trainer.model_id).result(timeout=30).checkpoints
    }
    assert {kept, long, plain} <= set(listed)
    assert _when(listed[kept].expires_at) == pytest.approx(saved_at + 3600, abs=60)
    assert listed[kept].user_metadata == {"step": "1"}
    assert _when(listed[long].expires_at) == pytest.approx(saved_at + 7200, abs=60)
    assert listed[plain].expires_at is None
    assert listed[plain].user_metadata is None
    run = rest.get_training_run(trainer.model_id).result(timeout=30)
    assert run.user_metadata == {"team": "tempering", "purpose": "tests"}
    assert run.training_run_id == tinker.ParsedCheckpointTinkerPath.from_tinker_path(kept).training_run_id
    # A checkpoint whose TTL has passed is gone: refused when named, left out of listings.
    short = trainer.save_weights_for_sampler("short", ttl_seconds=1).result(timeout=60).path
    time.sleep(1.5)
    with pytest.raises(tinker.NotFoundError, match="expired"):
        service.create_sampling_client(model_path=short).result(timeout=30)
    short_state = trainer.save_state("short-state", ttl_seconds=1).result(timeout=60).path
    time.sleep(1.5)
    after = {c.tinker_path for c in rest.list_checkpoints(trainer.model_id).result(timeout=30).checkpoints}
    assert {kept, long, plain} <= after
    assert short not in after
    assert short_state not in after
    with pytest.raises(tinker.BadRequestError, match="ttl_seconds must be a positive"):
        trainer.save_state("negative", ttl_seconds=-5).result(timeout=30)
    with pytest.raises(tinker.BadRequestError, match="ttl_seconds must be a positive"):
        trainer.save_weights_for_sampler("negative", ttl_seconds=0).result(timeout=30)
    assert "negative" not in str(rest.list_checkpoints(trainer.model_id).result(timeout=30))


def test_session_user_metadata(server: ServerProcess, rest: tinker.RestClient, tiny_dir: Path) -> None:
    service = tinker.ServiceClient(
        user_metadata={"experiment": "e1"}, display_name="local run", base_url=server.url, api_key=API_KEY
    )
    try:
        client = service.create_lora_training_client(str(tiny_dir), rank=2).result(timeout=120)
        sampler = client.save_weights_and_get_sampling_client().result(timeout=60)
        session_id = service.holder.get_session_id()
        info = rest.get_session(session_id).result(timeout=30)
        assert info.user_metadata == {"experiment": "e1"}
        assert info.display_name == "local run"
        assert info.training_run_ids == [client.model_id]
        assert len(info.sampler_ids) == 1
        done = sampler.sample(tinker.ModelInput.from_ints([1, 2]), 1, tinker.SamplingParams(max_tokens=1))
        assert len(done.result(timeout=60).sequences) == 1
    finally:
        service.close("success").result(timeout=30)
    with pytest.raises(tinker.NotFoundError, match="unknown session"):
        rest.get_session("session-nope").result(timeout=30)


def test_copy_weights(
    server: ServerProcess,
    service: tinker.ServiceClient,
    rest: tinker.RestClient,
    trainer: tinker.TrainingClient,
) -> None:
    data = [_datum(TOKENS[:16])]
    state = trainer.save_state("to-copy").result(timeout=60).path
    for_sampler = trainer.save_weights_for_sampler("to-copy").result(timeout=60).path
    before = (
        trainer.forward(data, "cross_entropy").result(timeout=60).loss_fn_outputs[0]["logprobs"].to_numpy()
    )
    copied = rest.copy_weights(state, "proj-local", ttl_seconds=7200).result(timeout=60)
    copied_sampler = rest.copy_weights(for_sampler, "proj-local").result(timeout=60)
    source_run = tinker.ParsedCheckpointTinkerPath.from_tinker_path(state).training_run_id
    parsed = tinker.ParsedCheckpointTinkerPath.from_tinker_path(copied)
    assert parsed.training_run_id != source_run  # a new run, of the same kind and name
    assert parsed.checkpoint_id == "weights/to-copy"
    assert copied_sampler.endswith("/sampler_weights/to-copy")
    rest.delete_checkpoint_from_tinker_path(state).result(timeout=30)  # the copy stands alone
    resumed = service.create_training_client_from_state(copied, user_metadata={"from": "copy"}).result(
        timeout=120
    )
    got = resumed.forward(data, "cross_entropy").result(timeout=60).loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_allclose(got, before, rtol=1e-6)
    resumed.save_state("resumed").result(timeout=60)
    assert rest.get_training_run(resumed.model_id).result(timeout=30).user_metadata == {"from": "copy"}
    archive = tinker.ServiceClient(project_id="proj-archive", base_url=server.url, api_key=API_KEY)
    try:  # ServiceClient.copy_weights: into its project
        assert archive.copy_weights(copied).result(timeout=60).endswith("/weights/to-copy")
    finally:
        archive.close("success").result(timeout=30)
    sampler = service.create_sampling_client(model_path=copied_sampler).result(timeout=120)
    assert sampler.compute_logprobs(tinker.ModelInput.from_ints(TOKENS[:8])).result(timeout=60)[0] is None
    listed = {
        c.tinker_path: c for c in rest.list_checkpoints(parsed.training_run_id).result(timeout=30).checkpoints
    }
    assert listed[copied].expires_at is not None
    # A retry with the same idempotency key makes no second copy; another key does.
    headers = {"X-API-Key": API_KEY, "X-Idempotency-Key": "copy-key-1"}
    body = {"source_path": for_sampler, "destination_project_id": "proj-local"}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        first = http.post("/api/v1/copy_weights", json=body, headers=headers).json()["tinker_path"]
        again = http.post("/api/v1/copy_weights", json=body, headers=headers).json()["tinker_path"]
        other = http.post(
            "/api/v1/copy_weights", json=body, headers={**headers, "X-Idempotency-Key": "copy-key-2"}
        ).json()["tinker_path"]
        assert first == again != other
        refused = http.post("/api/v1/copy_weights", json={"source_path": for_sampler}, headers=headers)
        assert refused.status_code == 400
        assert "destination_project_id" in refused.json()["detail"]
        negative = http.post("/api/v1/copy_weights", json={**body, "ttl_seconds": -1}, headers=headers)
        assert negative.status_code == 400
        assert "ttl_seconds" in negative.json()["detail"]
    with pytest.raises(tinker.NotFoundError):
        rest.copy_weights(f"tinker://{source_run}/weights/missing", "proj-local").result(timeout=30)


def test_inflight_kind_is_accepted(trainer: tinker.TrainingClient) -> None:
    sampler = trainer.save_weights_and_get_sampling_client(kind="inflight").result(timeout=60)
    response = sampler.sample(tinker.ModelInput.from_ints(TOKENS[:6]), 2, tinker.SamplingParams(max_tokens=3))
    assert [len(s.tokens) for s in response.result(timeout=60).sequences] == [3, 3]
