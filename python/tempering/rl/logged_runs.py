"""An RL run directory read back as a source of data (its trajectory log, its checkpoints):
whether its task's train/held-out split is the one a later stage evaluates on.

Example::

    check_dataset_split("runs/demo/rl", seed=0, n_test=200)   # ValueError naming --n-test if it differs
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["check_dataset_split"]


def check_dataset_split(run_dir: str | Path, **expected: int) -> None:
    """Refuse an RL run directory whose ``config.json`` records a dataset with another value of
    one of ``expected`` (the fields that fix the split, e.g. ``seed`` and ``n_test``): a
    ``ValueError`` naming the flag to pass, so the held-out items evaluated later are ones the
    logged policy never trained on. ``FileNotFoundError`` when there is no ``config.json``."""
    config_path = Path(run_dir) / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: not found; {run_dir} is not an RL run directory")
    config: dict[str, Any] = json.loads(config_path.read_text())
    dataset: Any = config.get("dataset")
    if isinstance(dataset, dict):
        fields: dict[str, Any] = dataset
        for name, mine in expected.items():
            theirs = fields.get(name)
            if isinstance(theirs, int) and theirs != mine:
                raise ValueError(
                    f"{config_path}: the logged run's dataset has {name}={theirs}, but the split evaluated "
                    f"here has {name}={mine}; pass --{name.replace('_', '-')} {theirs} so the held-out "
                    "items are ones the logged policy never trained on"
                )
