"""The training client through the protocol: optimizer settings, LoRA and full fine-tuning
parameter sets, request order and futures, checkpoints, and errors that change nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tinker
import torch
from local_helpers import random_tokens, reference_model, sft_datum

from tempering.local import (
    CheckpointNotFoundError,
    DatumError,
    IncompatibleCheckpointError,
    LocalTrainingClient,
    LossConfigError,
    ModelLoadError,
    ServiceClient,
    UnknownLossError,
)


def _data(seed: int = 0, n: int = 3) -> list[tinker.Datum]:
    rng = np.random.default_rng(seed)
    return [sft_datum(random_tokens(rng, int(rng.integers(6, 16)))) for _ in range(n)]


def _params(client: LocalTrainingClient) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in client._params.items()}


def _logprobs(client: LocalTrainingClient, data: list[tinker.Datum]) -> list[np.ndarray]:
    out = client.forward(data, "cross_entropy").result()
    return [o["logprobs"].to_numpy() for o in out.loss_fn_outputs]


# ---- optimizer -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "adam",
    [
        tinker.AdamParams(learning_rate=1e-2),
        tinker.AdamParams(learning_rate=3e-3, beta1=0.5, beta2=0.9, eps=1e-3, weight_decay=0.1),
        tinker.AdamParams(learning_rate=1e-2, grad_clip_norm=0.5),
    ],
    ids=["defaults", "betas-eps-decay", "clip"],
)
def test_optim_step_is_adamw_with_these_settings(
    service: ServiceClient, tiny_dir: Path, adam: tinker.AdamParams
) -> None:
    """Two steps on the client equal two torch.optim.AdamW steps (after clip_grad_norm_) on a
    plain copy of the model given the same gradients."""
    client = service.create_full_training_client("tempering/tiny").result()
    model = reference_model(tiny_dir)
    ref_params = dict(model.named_parameters())
    reference = torch.optim.AdamW(
        model.parameters(),
        lr=adam.learning_rate,
        betas=(adam.beta1, adam.beta2),
        eps=adam.eps,
        weight_decay=adam.weight_decay,
    )
    for step in range(2):
        client.forward_backward(_data(seed=step), "cross_entropy").result()
        for name, p in client._params.items():
            assert p.grad is not None
            ref_params[name].grad = p.grad.detach().clone()
        metrics = client.optim_step(adam).result().metrics
        max_norm = adam.grad_clip_norm if adam.grad_clip_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        assert metrics is not None
        assert metrics["grad_norm"] == pytest.approx(float(norm), rel=1e-5)
        reference.step()
        reference.zero_grad()
    moved = 0
    for name, p in _params(client).items():
        torch.testing.assert_close(p, ref_params[name].detach(), rtol=1e-5, atol=1e-7, msg=name)
        moved += int(not torch.equal(p, reference_model_param(tiny_dir, name)))
    assert moved == len(ref_params)
    client.close()


_INITIAL: dict[str, torch.Tensor] = {}


def reference_model_param(tiny_dir: Path, name: str) -> torch.Tensor:
    if not _INITIAL:
        _INITIAL.update({n: p.detach() for n, p in reference_model(tiny_dir).named_parameters()})
    return _INITIAL[name]


def test_optim_step_without_gradients_changes_nothing(service: ServiceClient) -> None:
    client = service.create_lora_training_client("tempering/tiny", rank=4).result()
    before = _params(client)
    client.optim_step(tinker.AdamParams(learning_rate=1.0, weight_decay=0.5)).result()
    for name, p in _params(client).items():
        torch.testing.assert_close(p, before[name], rtol=0, atol=0)


# ---- parameter sets --------------------------------------------------------------------------


def test_lora_and_full_parameter_sets(service: ServiceClient) -> None:
    full = service.create_full_training_client("tempering/tiny").result()
    lora = service.create_lora_training_client("tempering/tiny", rank=4).result()
    attn_only = service.create_lora_training_client(
        "tempering/tiny", rank=2, train_mlp=False, train_unembed=False
    ).result()
    total = sum(p.numel() for p in full._model.parameters())
    assert sum(p.numel() for p in full._params.values()) == total
    assert all("lora_" not in name for name in full._params)

    assert lora._params
    assert all("lora_A" in n or "lora_B" in n for n in lora._params)
    covered = {n.split(".lora_")[0] for n in lora._params}
    assert any(n.endswith("lm_head") for n in covered)
    assert any(".mlp." in n for n in covered)
    assert any(".self_attn." in n for n in covered)
    assert len(lora._params) == 2 * len(covered)
    assert all(p.shape[0] == 4 or p.shape[1] == 4 for p in lora._params.values())
    lora_info = lora.get_info()
    assert lora_info.is_lora
    assert lora_info.lora_rank == 4
    assert full.get_info().is_lora is False

    assert all(".self_attn." in n for n in attn_only._params)
    assert sum(p.numel() for p in attn_only._params.values()) < sum(p.numel() for p in lora._params.values())
    for c in (full, lora, attn_only):
        c.close()


def test_lora_training_moves_only_the_adapter(service: ServiceClient) -> None:
    client = service.create_lora_training_client("tempering/tiny", rank=4).result()
    frozen = {n: p.detach().clone() for n, p in client._model.named_parameters() if not p.requires_grad}
    data = _data()
    before = _logprobs(client, data)
    client.forward_backward(data, "cross_entropy")
    client.optim_step(tinker.AdamParams(learning_rate=1e-2)).result()
    # B starts at zero, so the first step moves only B; the output changes.
    after = _logprobs(client, data)
    assert not np.allclose(before[0], after[0])
    for n, p in client._model.named_parameters():
        if not p.requires_grad:
            torch.testing.assert_close(p, frozen[n], rtol=0, atol=0)
    client.close()


def test_adapter_initialisation_is_seeded(service: ServiceClient) -> None:
    a = service.create_lora_training_client("tempering/tiny", rank=4, seed=7).result()
    b = service.create_lora_training_client("tempering/tiny", rank=4, seed=7).result()
    c = service.create_lora_training_client("tempering/tiny", rank=4, seed=8).result()
    pa, pb, pc = _params(a), _params(b), _params(c)
    assert all(torch.equal(pa[n], pb[n]) for n in pa)
    assert any(not torch.equal(pa[n], pc[n]) for n in pa)


# ---- order and futures -----------------------------------------------------------------------


def test_requests_run_in_submission_order(service: ServiceClient) -> None:
    """fwd/bwd, step, forward, save, step, forward are queued at once and awaited backwards."""
    client = service.create_lora_training_client("tempering/tiny", rank=4).result()
    data = _data()
    adam = tinker.AdamParams(learning_rate=2e-2)
    first = client.forward(data, "cross_entropy")
    fb = client.forward_backward(data, "cross_entropy")
    step = client.optim_step(adam)
    middle = client.forward(data, "cross_entropy")
    saved = client.save_state("order")
    client.forward_backward(data, "cross_entropy")
    client.optim_step(adam)
    last = client.forward(data, "cross_entropy")
    losses = [f.result().metrics["loss:sum"] for f in (last, middle, fb, first)][::-1]
    step.result()
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)  # forward == forward_backward before the step
    assert losses[3] < losses[2] < losses[1]
    restored = service.create_training_client_from_state(saved.result().path).result()
    assert restored.forward(data, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(
        losses[2], rel=1e-6
    )
    client.close()
    restored.close()


def test_futures_are_awaitable_and_tinker_api_futures(service: ServiceClient) -> None:
    async def main() -> tuple[float, float]:
        client = await service.create_lora_training_client("tempering/tiny", rank=4)
        fb = client.forward_backward(_data(), "cross_entropy")
        step = client.optim_step(tinker.AdamParams(learning_rate=1e-3))
        assert isinstance(fb, tinker.APIFuture)
        out = await fb
        await step.result_async(timeout=60)
        coroutine_out = await asyncio.create_task(client.forward(_data(), "cross_entropy").coroutine())
        return out.metrics["loss:sum"], coroutine_out.metrics["loss:sum"]

    before, after = asyncio.run(main())
    assert after < before


# ---- checkpoints -----------------------------------------------------------------------------


def test_save_and_load_state_give_identical_outputs_and_training(service: ServiceClient) -> None:
    client = service.create_lora_training_client("tempering/tiny", rank=4).result()
    adam = tinker.AdamParams(learning_rate=1e-2)
    for seed in range(2):
        client.forward_backward(_data(seed), "cross_entropy")
        client.optim_step(adam)
    path = client.save_state("two-steps").result().path
    assert path.startswith("tempering://")
    assert path.endswith("/weights/two-steps")
    data = _data(5)
    expected = _logprobs(client, data)

    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    weights_only = service.create_training_client_from_state(path).result()
    for got in (_logprobs(resumed, data), _logprobs(weights_only, data)):
        for e, g in zip(expected, got, strict=True):
            np.testing.assert_array_equal(e, g)
    # With the optimizer state restored, the next step is the same step.
    for c in (client, resumed, weights_only):
        c.forward_backward(_data(9), "cross_entropy")
        c.optim_step(adam).result()
    p_client, p_resumed, p_fresh = _params(client), _params(resumed), _params(weights_only)
    assert all(torch.equal(p_client[n], p_resumed[n]) for n in p_client)
    assert any(not torch.equal(p_client[n], p_fresh[n]) for n in p_client)

    # load_state on an existing client brings the saved weights back.
    weights_only.load_state(path).result()
    for e, g in zip(expected, _logprobs(weights_only, data), strict=True):
        np.testing.assert_array_equal(e, g)
    for c in (client, resumed, weights_only):
        c.close()


def test_checkpoint_paths_survive_a_process_restart(service: ServiceClient, local_root: Path) -> None:
    client = service.create_full_training_client("tempering/tiny").result()
    client.forward_backward(_data(), "cross_entropy")
    client.optim_step(tinker.AdamParams(learning_rate=1e-3))
    path = client.save_state("restart").result().path
    sampler_path = client.save_weights_for_sampler("restart-sampler").result().path
    data = _data(3, n=1)
    expected = _logprobs(client, data)[0]
    code = textwrap.dedent(
        f"""
        import json, tinker
        from tempering.local import ServiceClient
        service = ServiceClient(root={str(local_root)!r}, device="cpu", num_threads=1)
        client = service.create_training_client_from_state({path!r}).result()
        tokens = {data[0].model_input.to_ints()!r}
        targets = {data[0].loss_fn_inputs["target_tokens"].tolist()!r}
        datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens),
                             loss_fn_inputs={{"target_tokens": targets, "weights": [1.0] * len(targets)}})
        out = client.forward([datum], "cross_entropy").result()
        sampler = service.create_sampling_client(model_path={sampler_path!r}).result()
        lps = sampler.compute_logprobs(tinker.ModelInput.from_ints(tokens + targets[-1:])).result()
        print(json.dumps([out.loss_fn_outputs[0]["logprobs"].tolist(), lps[1:]]))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    import json

    trainer_lps, sampler_lps = json.loads(proc.stdout.strip().splitlines()[-1])
    np.testing.assert_array_equal(np.asarray(trainer_lps, dtype=np.float32), expected)
    np.testing.assert_allclose(sampler_lps, expected, atol=1e-4)
    client.close()


def test_checkpoint_errors(service: ServiceClient, tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint"):
        service.create_training_client_from_state("tempering://run-nope/weights/x").result()
    with pytest.raises(CheckpointNotFoundError, match="not a checkpoint path"):
        service.create_training_client_from_state("tempering://../weights/x").result()
    with pytest.raises(CheckpointNotFoundError, match="tinker://"):
        service.create_sampling_client(model_path="tinker://abc/weights/x").result()
    with pytest.raises(CheckpointNotFoundError):
        service.create_sampling_client(model_path=str(tmp_path)).result()
    client = service.create_lora_training_client("tempering/tiny", rank=4).result()
    sampler_path = client.save_weights_for_sampler("for-sampling").result().path
    with pytest.raises(IncompatibleCheckpointError, match="save_weights_for_sampler"):
        client.load_state(sampler_path).result()
    other = service.create_lora_training_client("tempering/tiny", rank=2).result()
    state = other.save_state("rank-2").result().path
    with pytest.raises(IncompatibleCheckpointError, match="LoRA"):
        client.load_state(state).result()
    with pytest.raises(ValueError, match="checkpoint name"):
        client.save_state("../escape").result()
    client.close()
    other.close()


# ---- errors ----------------------------------------------------------------------------------


def _bad(datum: tinker.Datum, **fields: object) -> tinker.Datum:
    inputs = {**datum.loss_fn_inputs, **fields}
    return tinker.Datum(
        model_input=datum.model_input,
        loss_fn_inputs={k: v for k, v in inputs.items() if v is not None},  # type: ignore[misc]
    )


def test_bad_datums_fail_through_the_future_and_change_nothing(service: ServiceClient) -> None:
    client = service.create_lora_training_client("tempering/tiny", rank=4).result()
    good = _data()
    client.forward_backward(good, "cross_entropy").result()
    grads = {n: p.grad.detach().clone() for n, p in client._params.items() if p.grad is not None}
    params = _params(client)
    n = good[1].model_input.length
    cases: list[tuple[list[tinker.Datum], str, int, str]] = [
        ([good[0], _bad(good[1], weights=None)], "cross_entropy", 1, "weights"),
        ([good[0], good[1], _bad(good[2], weights=[1.0])], "cross_entropy", 2, "weights"),
        ([good[0], _bad(good[1], target_tokens=[300] * n)], "cross_entropy", 1, "target_tokens"),
        ([good[0], _bad(good[1], target_tokens=[1] * (n + 1))], "cross_entropy", 1, "target_tokens"),
        ([sft_datum([5, 999, 7])], "cross_entropy", 0, "model_input"),
        ([good[0], good[1]], "importance_sampling", 0, "logprobs"),
        ([_bad(good[0], weights=[float("nan")] * good[0].model_input.length)], "cross_entropy", 0, "weights"),
    ]
    for data, loss, index, field in cases:
        with pytest.raises(DatumError) as info:
            client.forward_backward(data, loss).result()  # type: ignore[arg-type]
        assert (info.value.index, info.value.field) == (index, field), str(info.value)
        assert f"datum {index}" in str(info.value)
    with pytest.raises(UnknownLossError, match="grpo"):
        client.forward_backward(good, "grpo").result()  # type: ignore[arg-type]
    with pytest.raises(LossConfigError, match="clip_ratio"):
        client.forward_backward(good, "cross_entropy", {"clip_ratio": 0.2}).result()
    with pytest.raises(ValueError, match="no data"):
        client.forward_backward([], "cross_entropy").result()

    def broken(_data: list[tinker.Datum], _lps: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        raise RuntimeError("user code failed")

    with pytest.raises(RuntimeError, match="user code failed"):
        client.forward_backward_custom(good, broken).result()
    # Nothing changed: the same gradients, the same weights; the client still works.
    for name, p in client._params.items():
        assert p.grad is not None
        torch.testing.assert_close(p.grad, grads[name], rtol=0, atol=0)
        torch.testing.assert_close(p.detach(), params[name], rtol=0, atol=0)
    assert client.optim_step(tinker.AdamParams(learning_rate=1e-3)).result().metrics
    client.close()


def test_model_errors(service: ServiceClient, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"not a directory with a config\.json"):
        service.create_lora_training_client("Qwen/Qwen3-8B").result()
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(ModelLoadError, match="could not load"):
        service.create_lora_training_client(str(tmp_path)).result()
    with pytest.raises(ValueError, match="covers no layer"):
        service.create_lora_training_client(
            "tempering/tiny", train_mlp=False, train_attn=False, train_unembed=False
        ).result()


def test_info_and_tokenizer(service: ServiceClient) -> None:
    client = service.create_lora_training_client("tempering/tiny", rank=8).result()
    info = client.get_info()
    assert info.model_data.model_name == "tempering/tiny"
    assert info.model_data.arch == "llama"
    assert info.model_id == client.model_id
    tok = client.get_tokenizer()
    assert tok.encode("hi", add_special_tokens=False) == [104, 105]
    assert tok.decode([104, 105]) == "hi"
    client.close()
