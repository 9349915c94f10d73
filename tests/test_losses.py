"""The one loss registry (``tempering/losses.py``): the CLI's choices, the RL loop's inputs and
the local engine's checks and objective all come from it, so a loss registered there alone is
trained by the local engine and sent its inputs by the RL loop; importing it needs no torch."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest
import tinker
import torch

from tempering.local import BUILTIN_LOSSES, ServiceClient
from tempering.losses import LOSSES, LossName, LossSpec, RLLossName
from tempering.rl.data import strip_loss_inputs
from tempering.rl.loss_inputs import loss_datums
from tempering.rl.train import RLConfig

ROOT = Path(__file__).resolve().parents[1]


def test_names_are_the_registry() -> None:
    assert tuple(LOSSES) == typing.get_args(LossName)
    assert BUILTIN_LOSSES is LOSSES  # the local engine (and serve through it) reads the registry
    policy_gradient = {name for name, spec in LOSSES.items() if "advantages" in spec.required}
    assert set(typing.get_args(RLLossName)) == policy_gradient
    hints = typing.get_type_hints(RLConfig, include_extras=False)
    assert set(typing.get_args(hints["loss_fn"])) == policy_gradient  # the CLI's --loss-fn choices
    for name, spec in LOSSES.items():
        assert spec.name == name
        assert set(spec.config_defaults) >= set(spec.per_token_config), name
        assert set(spec.nonzero) <= set(spec.required), name


def test_importing_the_registry_needs_no_torch() -> None:
    # torch made unimportable (the tinker SDK imports it only when it is installed)
    code = "import sys; sys.modules['torch'] = None; import tempering.losses, tempering.rl.loss_inputs"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


def _datum(mask: list[float], advantages: list[float]) -> tinker.Datum:
    n = len(mask)
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(list(range(1, n + 1))),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(np.arange(2, n + 2, dtype=np.int64)),
            "logprobs": tinker.TensorData.from_numpy(np.full(n, -1.0, dtype=np.float32)),
            "advantages": tinker.TensorData.from_numpy(np.asarray(advantages, dtype=np.float32)),
            "mask": tinker.TensorData.from_numpy(np.asarray(mask, dtype=np.float32)),
            "clip_low_threshold": tinker.TensorData.from_numpy(np.full(n, 0.5, dtype=np.float32)),
        },
    )


def _weighted_reinforce(
    lp: torch.Tensor, inputs: typing.Mapping[str, torch.Tensor], cfg: typing.Mapping[str, float]
) -> torch.Tensor:
    return -cfg["scale"] * lp * inputs["advantages"] * inputs["token_weight"]


def test_a_loss_registered_once_is_sent_and_trained(
    service: ServiceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new loss in the registry only: the RL loop fills its ``from_mask`` input and strips the
    rest, the local engine checks its inputs, applies its config default and its term."""
    spec = LossSpec(
        "weighted_reinforce",  # pyright: ignore[reportArgumentType]
        ("advantages", "token_weight"),
        _weighted_reinforce,
        config_defaults={"scale": 2.0},
        from_mask=("token_weight",),
    )
    monkeypatch.setitem(typing.cast("dict[str, LossSpec]", LOSSES), spec.name, spec)
    trained, untrained = _datum([0, 1, 1, 0], [0.0, 1.5, -0.5, 0.0]), _datum([0, 0, 0], [0, 0, 0])
    sent = loss_datums([trained, untrained], spec.name)  # pyright: ignore[reportArgumentType]
    assert len(sent) == 1
    assert set(sent[0].loss_fn_inputs) == {"target_tokens", "advantages", "token_weight"}
    stripped = strip_loss_inputs([trained], "ppo")[0].loss_fn_inputs.keys()
    assert stripped == {"target_tokens", "logprobs", "advantages", "clip_low_threshold"}
    client = service.create_lora_training_client("tempering/tiny", rank=4).result()
    try:
        out = client.forward_backward(sent, spec.name).result()  # pyright: ignore[reportArgumentType]
        lp = out.loss_fn_outputs[0]["logprobs"].to_numpy()
        expected = -2.0 * float((lp * np.array([0.0, 1.5, -0.5, 0.0])).sum())
        assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)
        with pytest.raises(ValueError, match="token_weight"):
            client.forward(strip_loss_inputs([trained], "ppo"), spec.name).result()  # pyright: ignore[reportArgumentType]
    finally:
        client.close()
