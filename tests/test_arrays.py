"""``tempering.arrays`` is the one place the package names its numpy array types."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tempering import arrays

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "tempering"
DTYPE_ALIAS = re.compile(r"^\w+(?:: TypeAlias)? = npt\.NDArray\[np\.(?:float|int)\d+\]$", re.MULTILINE)


def test_each_alias_is_its_dtype() -> None:
    assert arrays.Float32Array == npt.NDArray[np.float32]
    assert arrays.Float64Array == npt.NDArray[np.float64]
    assert arrays.Int32Array == npt.NDArray[np.int32]
    assert arrays.Int64Array == npt.NDArray[np.int64]


def test_no_other_module_defines_a_dtype_alias() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}: {match.group(0)}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "arrays.py"
        for match in DTYPE_ALIAS.finditer(path.read_text(encoding="utf-8"))
    ]
    assert not found, f"import these from tempering.arrays instead: {found}"
