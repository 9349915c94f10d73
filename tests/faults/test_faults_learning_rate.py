"""Fault catalogue (issue 15), case 5: NaN / infinite learning rates and loss settings.

Each is refused with a ``ValueError`` naming the field (the CLI flag before the run directory
exists), nothing already trained is lost, and ``metrics.jsonl`` never holds ``NaN`` /
``Infinity`` (which are not JSON).
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tinker
import torch

from tempering.local import LocalTrainingClient, ServiceClient
from tempering.local.errors import LossConfigError
from tempering.training import AdamConfig, LRSchedule, RunDir

NAN, INF = float("nan"), float("inf")


def _params(client: LocalTrainingClient) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in client._params.items()}  # pyright: ignore[reportPrivateUsage]


def _datum(advantage: float = 1.0) -> tinker.Datum:
    tokens = [5, 9, 2, 7, 3]
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": np.full(4, -2.0, dtype=np.float32),
            "advantages": np.full(4, advantage, dtype=np.float32),
        },
    )


# ------------------------------------------------------------------------------ local engine


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("learning_rate", NAN),
        ("learning_rate", INF),
        ("learning_rate", -1e-3),
        ("eps", NAN),
        ("weight_decay", INF),
        ("grad_clip_norm", NAN),
        ("beta1", NAN),
        ("beta2", 1.0),
    ],
)
def test_optim_step_refuses_a_bad_setting_naming_it(service: ServiceClient, field: str, value: float) -> None:
    """Before: NaN passed the ``< 0`` check and turned every weight into NaN; the error for the
    other settings printed the whole ``AdamParams`` without saying which field was wrong."""
    client = service.create_lora_training_client("tempering/tiny", rank=4, seed=0).result()
    client.forward_backward([_datum()], "importance_sampling").result()
    before = _params(client)
    params = tinker.AdamParams(learning_rate=1e-2).model_copy(update={field: value})
    with pytest.raises(ValueError, match=rf"invalid AdamParams: {field} must be"):
        client.optim_step(params).result()
    for name, p in _params(client).items():
        torch.testing.assert_close(p, before[name], rtol=0, atol=0)
    # The refused step lost nothing: the gradients are still there, and a valid step uses them.
    client.optim_step(tinker.AdamParams(learning_rate=1e-2)).result()
    after = _params(client)
    assert all(torch.isfinite(p).all() for p in after.values())
    assert any(not torch.equal(after[n], before[n]) for n in before)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("loss", ["ppo", "cispo"])
@pytest.mark.parametrize("key", ["clip_low_threshold", "clip_high_threshold"])
def test_clip_thresholds_must_be_finite(service: ServiceClient, loss: str, key: str) -> None:
    """Before: ``clip_low_threshold=NaN`` was accepted (``clamp`` with NaN gives NaN losses)."""
    client = service.create_lora_training_client("tempering/tiny", rank=4, seed=0).result()
    with pytest.raises(LossConfigError, match=rf"config '{key}' must be a finite number, got nan"):
        client.forward_backward([_datum()], loss, loss_fn_config={key: NAN}).result()
    assert isinstance(LossConfigError("x"), ValueError)
    # Still usable afterwards.
    out = client.forward_backward([_datum()], loss).result()
    assert all(math.isfinite(float(v)) for v in out.metrics.values())


# ------------------------------------------------------------------------------ configs and CLI


@pytest.mark.timeout(10)
def test_rl_config_refuses_a_nan_clip_threshold(tmp_path: Path) -> None:
    """Refused when the config is built, before any run directory or rollout."""
    from tempering.envs.tasks import ArithmeticTask
    from tempering.rl import RLConfig
    from tempering.training import RunConfig

    with pytest.raises(
        ValueError, match=r"^loss_fn_config\['clip_low_threshold'\] must be a finite number, got nan$"
    ):
        RLConfig(
            run=RunConfig(log_dir=str(tmp_path / "run")),
            dataset=ArithmeticTask(),
            loss_fn="ppo",
            loss_fn_config={"clip_low_threshold": NAN},
        )
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("field", ["eps", "weight_decay", "grad_clip_norm"])
@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_adam_config_refuses_non_finite_values(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must be a finite number >= 0, got {value}$"):
        AdamConfig(**{field: value})  # pyright: ignore[reportArgumentType]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("value", [NAN, INF, -INF, 0.0, -1e-3])
def test_adam_config_refuses_a_learning_rate_that_is_not_positive(value: float) -> None:
    """Before: 0 was accepted (and a recipe's 0 was replaced by its default)."""
    says = rf"^learning_rate must be a positive number, got {value}; leave it unset"
    with pytest.raises(ValueError, match=says):
        AdamConfig(learning_rate=value)


@pytest.mark.timeout(10)
def test_adam_config_refuses_bad_betas_and_min_lr_ratio() -> None:
    with pytest.raises(ValueError, match=r"^beta2 must be in \[0, 1\), got nan$"):
        AdamConfig(beta2=NAN)
    with pytest.raises(ValueError, match=r"^min_lr_ratio must be a finite number >= 0, got inf$"):
        LRSchedule(min_lr_ratio=INF)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0"])
def test_cli_refuses_a_non_finite_learning_rate_before_the_run_dir(tmp_path: Path, value: str) -> None:
    """Before: ``--adam.learning-rate inf`` exited 0 with NaN losses in metrics.jsonl."""
    log_dir = tmp_path / "run"
    env = {**os.environ, "TEMPERING_HOME": str(tmp_path / "home"), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tempering.cli",
            "sft",
            f"--run.log-dir={log_dir}",
            "--run.no-progress",
            "--max-steps=1",
            "--adam.learning-rate",
            value,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert proc.returncode != 0
    assert "learning_rate must be a positive number" in proc.stderr
    assert not log_dir.exists()


# ------------------------------------------------------------------------------ metrics.jsonl


@pytest.mark.timeout(10)
def test_metrics_jsonl_never_holds_nan_or_infinity(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: ``NaN`` / ``Infinity`` were written as they are (not JSON), with no word."""
    run = RunDir(tmp_path)
    run.append_metrics({"step": 0, "loss": 1.5})
    with caplog.at_level(logging.WARNING, logger="tempering.training.rundir"):
        run.append_metrics({"step": 1, "loss": NAN, "optim/lr": INF, "n": 3})
        run.append_metrics({"step": 2, "loss": NAN, "optim/lr": 1e-4, "n": 4})
    (record,) = caplog.records  # once per metric, not once per step
    assert (
        f"{run.metrics_path} step 1: loss, optim/lr not finite (loss=nan, optim/lr=inf); written as null"
        in (record.getMessage())
    )
    run.truncate_metrics(3)  # a resume rewrites the file: still strict JSON

    def no_constants(c: str) -> object:
        raise AssertionError(f"non-JSON constant {c} in metrics.jsonl")

    text = run.metrics_path.read_text()
    assert "NaN" not in text
    assert "Infinity" not in text
    lines = [json.loads(x, parse_constant=no_constants) for x in text.splitlines()]
    assert lines == [
        {"step": 0, "loss": 1.5},
        {"step": 1, "loss": None, "optim/lr": None, "n": 3},
        {"step": 2, "loss": None, "optim/lr": 1e-4, "n": 4},
    ]
    # Read back in process, a null is NaN again (recipes take float() of metrics).
    back = run.read_metrics()
    assert back[0] == {"step": 0, "loss": 1.5}
    assert math.isnan(back[1]["loss"])
    assert math.isnan(back[1]["optim/lr"])
    assert back[2]["optim/lr"] == 1e-4
