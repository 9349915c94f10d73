"""Optional metric sinks beside ``metrics.jsonl``: Weights & Biases and TensorBoard.

Each is used only when a config asks for it (never because a package happens to be
installed); asking for one whose package is missing is an error, not a silent no-op.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

__all__ = ["MetricSink", "TensorBoardSink", "WandbSink", "make_sinks"]


class MetricSink(Protocol):
    """Receives each step's numeric metrics.

    Example::

        sink.log({"loss": 1.2}, step=3)
    """

    def log(self, metrics: Mapping[str, float], step: int, /) -> None: ...

    def close(self) -> None: ...


class WandbSink:
    """Logs to Weights & Biases (``pip install wandb``); resumes the W&B run of a resumed run."""

    def __init__(self, project: str, run_dir: Path, config: Mapping[str, Any], run_id: str) -> None:
        try:
            wandb: Any = importlib.import_module("wandb")
        except ImportError as exc:
            raise ImportError("wandb_project is set but wandb is not installed: pip install wandb") from exc
        self._run: Any = wandb.init(
            project=project, dir=str(run_dir), config=dict(config), id=run_id, resume="allow"
        )

    def log(self, metrics: Mapping[str, float], step: int, /) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class TensorBoardSink:
    """Writes TensorBoard event files under ``<run_dir>/logs`` (needs torch's tensorboard support)."""

    def __init__(self, run_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter  # pyright: ignore[reportMissingImports]
        except ImportError as exc:
            raise ImportError(
                "tensorboard=True needs torch and tensorboard: pip install tensorboard"
            ) from exc
        self._writer: Any = SummaryWriter(log_dir=str(run_dir / "logs"))

    def log(self, metrics: Mapping[str, float], step: int, /) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def make_sinks(
    run_dir: Path,
    config: Mapping[str, Any],
    *,
    wandb_project: str | None,
    tensorboard: bool,
) -> list[MetricSink]:
    """The sinks a run asked for (none by default)."""
    sinks: list[MetricSink] = []
    if wandb_project:
        sinks.append(WandbSink(wandb_project, run_dir, config, run_id=run_dir.resolve().name))
    if tensorboard:
        sinks.append(TensorBoardSink(run_dir))
    return sinks
