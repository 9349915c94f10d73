"""Each built-in loss against a hand-written reference: value, per-datum logprobs and the
gradient of every parameter, on the tiny model with full fine-tuning (so parameter names match a
plain transformers model)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tinker
import torch
from local_helpers import reference_logprobs, reference_model, rl_datum, sft_datum

from tempering.local import LocalTrainingClient, ServiceClient

Reference = Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]


@pytest.fixture
def full_client(service: ServiceClient) -> Iterator[LocalTrainingClient]:
    client = service.create_full_training_client("tempering/tiny").result()
    yield client
    client.close()


def _grads(client: LocalTrainingClient) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, p in client._params.items():
        assert p.grad is not None, name
        out[name] = p.grad.detach().clone()
    return out


def _reference_grads(
    tiny_dir: Path, data: list[tinker.Datum], per_datum_loss: Reference
) -> tuple[dict[str, torch.Tensor], float, list[torch.Tensor]]:
    """Loss summed datum by datum on an unpadded forward of each, then backward."""
    model = reference_model(tiny_dir)
    total = torch.zeros(())
    logprobs = []
    for datum in data:
        inputs = {k: v.to_torch() for k, v in datum.loss_fn_inputs.items()}
        lp = reference_logprobs(model, datum.model_input.to_ints(), inputs["target_tokens"])
        logprobs.append(lp.detach())
        total = total + per_datum_loss(lp, inputs)
    total.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return grads, float(total.detach()), logprobs


def _rl_data(tiny_dir: Path, seed: int) -> list[tinker.Datum]:
    """Three sequences of different lengths; sampler logprobs = the model's own, jittered so
    that some ratios fall outside PPO's clip range."""
    rng = np.random.default_rng(seed)
    model = reference_model(tiny_dir)
    data = []
    for length in (9, 14, 6):
        tokens = [int(t) for t in rng.integers(0, 256, size=length)]
        with torch.no_grad():
            lp = reference_logprobs(model, tokens[:-1], torch.tensor(tokens[1:]))
        q = lp.numpy() + rng.uniform(-0.5, 0.5, size=length - 1)
        advantages = rng.normal(size=length - 1)
        data.append(rl_datum(tokens, q, advantages))
    return data


def _ratio(lp: torch.Tensor, x: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.exp(lp - x["logprobs"])


REFERENCES: dict[str, tuple[dict[str, float], Reference]] = {
    "importance_sampling": ({}, lambda lp, x: -(_ratio(lp, x) * x["advantages"]).sum()),
    "ppo": (
        {},
        lambda lp, x: (
            -torch.min(
                _ratio(lp, x) * x["advantages"], torch.clamp(_ratio(lp, x), 0.8, 1.2) * x["advantages"]
            ).sum()
        ),
    ),
    "ppo-config": (
        {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05},
        lambda lp, x: (
            -torch.min(
                _ratio(lp, x) * x["advantages"], torch.clamp(_ratio(lp, x), 0.9, 1.05) * x["advantages"]
            ).sum()
        ),
    ),
    "cispo": (
        {},
        lambda lp, x: -(torch.clamp(_ratio(lp, x), 0.0, 4.0).detach() * lp * x["advantages"]).sum(),
    ),
    "cispo-config": (
        {"clip_low_threshold": 0.95, "clip_high_threshold": 1.1},
        lambda lp, x: -(torch.clamp(_ratio(lp, x), 0.95, 1.1).detach() * lp * x["advantages"]).sum(),
    ),
    "dro": ({}, lambda lp, x: -(lp * x["advantages"] - 0.05 * (lp - x["logprobs"]) ** 2).sum()),
    "dro-config": (
        {"beta": 0.7},
        lambda lp, x: -(lp * x["advantages"] - 0.35 * (lp - x["logprobs"]) ** 2).sum(),
    ),
}


def _check(
    client: LocalTrainingClient,
    tiny_dir: Path,
    data: list[tinker.Datum],
    loss: str,
    config: dict[str, float],
    reference: Reference,
) -> None:
    out = client.forward_backward(data, loss, config or None).result()  # type: ignore[arg-type]
    ref_grads, ref_loss, ref_lps = _reference_grads(tiny_dir, data, reference)
    assert out.metrics["loss:sum"] == pytest.approx(ref_loss, rel=1e-4, abs=1e-4)
    assert len(out.loss_fn_outputs) == len(data)
    for output, datum, ref_lp in zip(out.loss_fn_outputs, data, ref_lps, strict=True):
        lp = output["logprobs"].to_numpy()
        assert list(lp.shape) == list(datum.loss_fn_inputs["target_tokens"].to_numpy().shape)
        np.testing.assert_allclose(lp, ref_lp.numpy(), rtol=1e-5, atol=1e-5)
    grads = _grads(client)
    assert set(grads) == set(ref_grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.parametrize("case", sorted(REFERENCES))
def test_rl_loss_gradients_match_reference(
    full_client: LocalTrainingClient, tiny_dir: Path, case: str
) -> None:
    config, reference = REFERENCES[case]
    loss = case.split("-")[0]
    if loss == "dro" and not config:
        config = {}
        reference = REFERENCES["dro"][1]  # default beta = 0.1: 0.5 * beta = 0.05
    _check(full_client, tiny_dir, _rl_data(tiny_dir, seed=len(case)), loss, config, reference)


def test_cross_entropy_gradient_matches_reference(full_client: LocalTrainingClient, tiny_dir: Path) -> None:
    rng = np.random.default_rng(0)
    data = []
    for length in (12, 5, 20):
        tokens = [int(t) for t in rng.integers(0, 256, size=length)]
        weights = rng.uniform(0, 1, size=length - 1) * (rng.uniform(size=length - 1) > 0.3)
        data.append(sft_datum(tokens, list(weights)))
    _check(full_client, tiny_dir, data, "cross_entropy", {}, lambda lp, x: -(lp * x["weights"]).sum())


def test_cross_entropy_soft_targets(full_client: LocalTrainingClient, tiny_dir: Path) -> None:
    """[N, K] target tokens with [N, K] weights (top-K distillation), mixed with a [N] datum."""
    rng = np.random.default_rng(1)
    tokens = [int(t) for t in rng.integers(0, 256, size=10)]
    targets_NK = rng.integers(0, 264, size=(9, 3))
    weights_NK = rng.dirichlet(np.ones(3), size=9).astype(np.float32)
    soft = tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(targets_NK.astype(np.int64)),
            "weights": tinker.TensorData.from_numpy(weights_NK),
        },
    )
    hard = sft_datum([int(t) for t in rng.integers(0, 256, size=7)])
    _check(full_client, tiny_dir, [soft, hard], "cross_entropy", {}, lambda lp, x: -(lp * x["weights"]).sum())


def test_per_token_clip_thresholds_override_config(full_client: LocalTrainingClient, tiny_dir: Path) -> None:
    data = _rl_data(tiny_dir, seed=3)
    datum = data[0]
    n = datum.model_input.length
    low = np.full(n, 0.5, dtype=np.float32)
    high = np.full(n, 1.5, dtype=np.float32)
    data[0] = tinker.Datum(
        model_input=datum.model_input,
        loss_fn_inputs={**datum.loss_fn_inputs, "clip_low_threshold": low, "clip_high_threshold": high},
    )

    def reference(lp: torch.Tensor, x: dict[str, torch.Tensor]) -> torch.Tensor:
        lo = x.get("clip_low_threshold", torch.tensor(0.8))
        hi = x.get("clip_high_threshold", torch.tensor(1.2))
        r = _ratio(lp, x)
        return -torch.min(r * x["advantages"], torch.clamp(r, lo, hi) * x["advantages"]).sum()

    _check(full_client, tiny_dir, data, "ppo", {}, reference)


def test_custom_loss_dpo_gradient_matches_reference(full_client: LocalTrainingClient, tiny_dir: Path) -> None:
    """A DPO-style loss over (chosen, rejected) pairs, as forward_backward_custom user code."""
    rng = np.random.default_rng(2)
    prompt = [int(t) for t in rng.integers(0, 256, size=5)]
    chosen = sft_datum([*prompt, 97, 98, 99], [0.0] * 4 + [1.0] * 3)
    rejected = sft_datum([*prompt, 120, 121], [0.0] * 4 + [1.0] * 2)
    data = [chosen, rejected]
    ref_chosen, ref_rejected, beta = -5.0, -6.0, 0.1
    seen_shapes: list[tuple[int, ...]] = []

    def dpo(batch: list[tinker.Datum], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        seen_shapes.extend(tuple(lp.shape) for lp in logprobs)
        assert all(lp.requires_grad and lp.device.type == "cpu" for lp in logprobs)
        w = [d.loss_fn_inputs["weights"].to_torch() for d in batch]
        margin = (logprobs[0] * w[0]).sum() - ref_chosen - ((logprobs[1] * w[1]).sum() - ref_rejected)
        loss = -torch.nn.functional.logsigmoid(beta * margin)
        return loss, {"dpo/margin": float(margin.detach())}

    out = full_client.forward_backward_custom(data, dpo).result()
    assert seen_shapes == [(7,), (6,)]
    assert "dpo/margin" in out.metrics

    model = reference_model(tiny_dir)
    lps = []
    for d in data:
        lp = reference_logprobs(model, d.model_input.to_ints(), d.loss_fn_inputs["target_tokens"].to_torch())
        lps.append((lp * d.loss_fn_inputs["weights"].to_torch()).sum())
    ref_loss = -torch.nn.functional.logsigmoid(beta * (lps[0] - ref_chosen - (lps[1] - ref_rejected)))
    ref_loss.backward()
    assert out.metrics["loss:sum"] == pytest.approx(float(ref_loss.detach()), rel=1e-5)
    ref_params = dict(model.named_parameters())
    for name, grad in _grads(full_client).items():
        ref_grad = ref_params[name].grad
        assert ref_grad is not None
        torch.testing.assert_close(grad, ref_grad, rtol=1e-3, atol=1e-6, msg=name)


def test_forward_computes_without_gradients(full_client: LocalTrainingClient) -> None:
    data = [sft_datum(range(40, 60))]
    fwd = full_client.forward(data, "cross_entropy").result()
    assert all(p.grad is None for p in full_client._params.values())
    fb = full_client.forward_backward(data, "cross_entropy").result()
    assert fwd.metrics["loss:sum"] == pytest.approx(fb.metrics["loss:sum"], rel=1e-6)
    np.testing.assert_allclose(
        fwd.loss_fn_outputs[0]["logprobs"].to_numpy(), fb.loss_fn_outputs[0]["logprobs"].to_numpy(), rtol=1e-6
    )


def test_gradients_accumulate_until_the_step(full_client: LocalTrainingClient) -> None:
    a, b = [sft_datum(range(30, 45))], [sft_datum(range(100, 110))]
    full_client.forward_backward(a, "cross_entropy").result()
    grads_a = _grads(full_client)
    full_client.forward_backward(b, "cross_entropy").result()
    grads_ab = _grads(full_client)
    full_client.optim_step(tinker.AdamParams(learning_rate=0.0)).result()
    assert all(p.grad is None for p in full_client._params.values())
    full_client.forward_backward(b, "cross_entropy").result()
    grads_b = _grads(full_client)
    for name, g in grads_ab.items():
        torch.testing.assert_close(g, grads_a[name] + grads_b[name], rtol=1e-5, atol=1e-7)
