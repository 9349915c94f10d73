"""Type stubs for the Rust extension ``tempering._core`` (hand-written, checked by stubtest)."""

import numpy as np
import numpy.typing as npt

__version__: str

class DataError(ValueError):
    """Bad input to the data core; the message names the problem, member and position."""

class InternalError(RuntimeError):
    """A bug inside the data core (a Rust panic), surfaced as an exception, never a crash."""

def group_advantages(
    rewards_PG: npt.NDArray[np.float64],
    offsets_P1: npt.NDArray[np.int64],
    /,
    *,
    baseline: str = "mean",
    normalize_std: bool = False,
    eps: float = 1e-06,
) -> npt.NDArray[np.float64]:
    """Group-relative advantages over ragged groups of rewards (flat rewards + offsets)."""
