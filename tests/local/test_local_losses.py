"""Each built-in loss against a hand-written reference: value, per-datum logprobs and the
gradient of every parameter, on the tiny model with full fine-tuning (so parameter names match a
plain transformers model)."""

from __future__ import annotations

import math
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
    *,
    tight: bool = False,
) -> None:
    """Loss value, per-datum logprobs and every parameter's gradient against ``reference``;
    ``tight``: all to 1e-5 (and some gradient must be nonzero)."""
    loss_rtol, grad_rtol = (1e-5, 1e-5) if tight else (1e-4, 1e-3)
    out = client.forward_backward(data, loss, config or None).result()  # type: ignore[arg-type]
    ref_grads, ref_loss, ref_lps = _reference_grads(tiny_dir, data, reference)
    assert out.metrics["loss:sum"] == pytest.approx(ref_loss, rel=loss_rtol, abs=loss_rtol)
    assert len(out.loss_fn_outputs) == len(data)
    for output, datum, ref_lp in zip(out.loss_fn_outputs, data, ref_lps, strict=True):
        lp = output["logprobs"].to_numpy()
        assert list(lp.shape) == list(datum.loss_fn_inputs["target_tokens"].to_numpy().shape)
        np.testing.assert_allclose(lp, ref_lp.numpy(), rtol=1e-5, atol=1e-5)
    grads = _grads(client)
    assert set(grads) == set(ref_grads)
    if tight:
        assert any(float(g.abs().max()) > 1e-4 for g in grads.values()), "no gradient at all"
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=grad_rtol, atol=1e-5, msg=name)


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


# ---- gspo and stable_reinforce -------------------------------------------------------------------
# The references below are written from the definitions (docs/rl.md), not from the engine's code:
# each returns the loss's value with the analytic gradient with respect to every logprob
# attached as ``value + g * (lp - sg(lp))``, so value and gradient are checked separately.


def _with_gradient(value: torch.Tensor, lp: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return value.detach().sum() + (g.detach() * (lp - lp.detach())).sum()


def _gspo_reference(low: float, high: float) -> Reference:
    """GSPO-token: ``s = exp(mean over marked tokens of (lp - q))``; token ``t``'s loss is
    ``-min(s A_t, clip(s) A_t)``; its gradient w.r.t. ``lp_t`` is ``-s A_t`` where the unclipped
    branch is the minimum (``s`` inside the band, or past it on the side that lowers the
    objective), else 0. Per-token thresholds in the datum override ``low``/``high``."""

    def reference(lp_grad: torch.Tensor, x: dict[str, torch.Tensor]) -> torch.Tensor:
        lp = lp_grad.detach()
        marked = [t for t in range(lp.shape[0]) if float(x["sequence_ratio_mask"][t]) != 0.0]
        log_s = sum(float(lp[t]) - float(x["logprobs"][t]) for t in marked) / len(marked)
        s = math.exp(log_s)
        values, grads = [], []
        for t in range(lp.shape[0]):
            lo = float(x["clip_low_threshold"][t]) if "clip_low_threshold" in x else low
            hi = float(x["clip_high_threshold"][t]) if "clip_high_threshold" in x else high
            a = float(x["advantages"][t])
            clipped = min(max(s, lo), hi)
            values.append(-min(s * a, clipped * a))
            unclipped_is_min = lo <= s <= hi or (a > 0 and s < lo) or (a < 0 and s > hi)
            grads.append(-s * a if unclipped_is_min else 0.0)
        return _with_gradient(torch.tensor(values, dtype=torch.float64), lp_grad, torch.tensor(grads))

    return reference


def _stable_reinforce_reference(kl_coeff: float) -> Reference:
    """``-sg(r) A lp + kl_coeff (r - 1 - log r)`` per token, ``r = exp(lp - q)``; the gradient
    w.r.t. ``lp`` is ``-r A + kl_coeff (r - 1)``."""

    def reference(lp_grad: torch.Tensor, x: dict[str, torch.Tensor]) -> torch.Tensor:
        lp = lp_grad.detach()
        values, grads = [], []
        for t in range(lp.shape[0]):
            log_r = float(lp[t]) - float(x["logprobs"][t])
            r, a = math.exp(log_r), float(x["advantages"][t])
            values.append(-r * a * float(lp[t]) + kl_coeff * (r - 1.0 - log_r))
            grads.append(-r * a + kl_coeff * (r - 1.0))
        return _with_gradient(torch.tensor(values, dtype=torch.float64), lp_grad, torch.tensor(grads))

    return reference


def _ragged_rl_data(
    tiny_dir: Path, seed: int, *, jitter: float, clip_inputs: bool = False
) -> list[tinker.Datum]:
    """Five datums of random lengths; a prompt part (advantage 0, outside the ratio mask) and a
    sampled part, sampler logprobs = the model's own jittered by up to ``jitter``."""
    rng = np.random.default_rng(seed)
    model = reference_model(tiny_dir)
    data = []
    for _ in range(5):
        length = int(rng.integers(4, 24))
        prompt = int(rng.integers(1, length - 1))
        tokens = [int(t) for t in rng.integers(0, 256, size=length)]
        with torch.no_grad():
            lp = reference_logprobs(model, tokens[:-1], torch.tensor(tokens[1:])).numpy()
        n = length - 1
        sampled = np.arange(n) >= prompt - 1
        q = np.where(sampled, lp + rng.uniform(-jitter, jitter, size=n), 0.0)
        advantages = np.where(sampled, rng.normal(size=n), 0.0)
        inputs: dict[str, object] = {
            "target_tokens": tokens[1:],
            "logprobs": q.astype(np.float32),
            "advantages": advantages.astype(np.float32),
            "sequence_ratio_mask": sampled.astype(np.float32),
        }
        if clip_inputs:
            inputs["clip_low_threshold"] = rng.uniform(0.5, 1.0, size=n).astype(np.float32)
            inputs["clip_high_threshold"] = rng.uniform(1.0, 1.5, size=n).astype(np.float32)
        data.append(
            tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)  # type: ignore[arg-type]
        )
    return data


SEQUENCE_CASES: dict[str, tuple[str, dict[str, float], Reference, float, bool]] = {
    # name: (loss, config, reference, sampler jitter, per-token clip inputs)
    "gspo-default": ("gspo", {}, _gspo_reference(1 - 3e-4, 1 + 4e-4), 0.0005, False),
    "gspo-config": (
        "gspo",
        {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
        _gspo_reference(0.9, 1.1),
        0.4,
        False,
    ),
    "gspo-per-token": ("gspo", {}, _gspo_reference(0.0, 0.0), 0.4, True),
    "stable_reinforce-default": ("stable_reinforce", {}, _stable_reinforce_reference(0.01), 0.5, False),
    "stable_reinforce-config": (
        "stable_reinforce",
        {"kl_coeff": 0.7},
        _stable_reinforce_reference(0.7),
        0.5,
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(SEQUENCE_CASES))
def test_sequence_losses_match_reference(full_client: LocalTrainingClient, tiny_dir: Path, case: str) -> None:
    loss, config, reference, jitter, clip_inputs = SEQUENCE_CASES[case]
    data = _ragged_rl_data(tiny_dir, seed=len(case), jitter=jitter, clip_inputs=clip_inputs)
    _check(full_client, tiny_dir, data, loss, config, reference, tight=True)


def test_gspo_clips_whole_sequences(full_client: LocalTrainingClient, tiny_dir: Path) -> None:
    """A sequence whose ratio is past the band on the clipped side has no gradient at all,
    whatever its tokens' own ratios; one inside the band has."""
    data = _ragged_rl_data(tiny_dir, seed=11, jitter=0.0)
    datum = data[0]
    x = {k: v.to_numpy() for k, v in datum.loss_fn_inputs.items()}
    marked = x["sequence_ratio_mask"] != 0
    # q lowered by 0.5 on the marked tokens: s = e^0.5 > 1.0004; positive advantages: clipped.
    shifted = {
        **x,
        "logprobs": np.where(marked, x["logprobs"] - 0.5, 0.0).astype(np.float32),
        "advantages": np.where(marked, 1.0, 0.0).astype(np.float32),
    }
    clipped = tinker.Datum(model_input=datum.model_input, loss_fn_inputs=shifted)  # type: ignore[arg-type]
    out = full_client.forward_backward([clipped], "gspo").result()
    assert math.isfinite(out.metrics["loss:sum"])
    assert all(float(g.abs().max()) == 0.0 for g in _grads(full_client).values())


def test_gspo_needs_a_sequence_ratio_mask(full_client: LocalTrainingClient, tiny_dir: Path) -> None:
    from tempering.local.errors import DatumError

    data = _ragged_rl_data(tiny_dir, seed=5, jitter=0.1)
    x = dict(data[1].loss_fn_inputs)
    missing = tinker.Datum(
        model_input=data[1].model_input,
        loss_fn_inputs={k: v for k, v in x.items() if k != "sequence_ratio_mask"},
    )
    n = data[1].model_input.length
    empty = tinker.Datum(
        model_input=data[1].model_input,
        loss_fn_inputs={
            **x,
            "sequence_ratio_mask": tinker.TensorData.from_numpy(np.zeros(n, dtype=np.float32)),
        },
    )
    for bad, what in ((missing, "is missing"), (empty, "all zero")):
        with pytest.raises(DatumError, match=what) as info:
            full_client.forward_backward([data[0], bad], "gspo").result()
        assert (info.value.index, info.value.field) == (1, "sequence_ratio_mask")
