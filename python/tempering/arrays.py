"""The numpy array types the package annotates with, one name per dtype.

``Float32Array`` is ``npt.NDArray[np.float32]``, and so on; the shape is in the variable's
name (``logprobs_N``, ``offsets_D1``: docs/notation.md), not in the type. Defined once here so
that a module says ``Float32Array`` and every module means the same thing by it (the protocols'
``FloatArray`` is something else: any float sequence a caller may pass).

Example::

    from tempering.arrays import Float32Array

    def masked_mean(x_N: Float32Array, mask_N: Float32Array) -> float: ...
"""

from typing import TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = ["Float32Array", "Float64Array", "Int32Array", "Int64Array"]

Float32Array: TypeAlias = npt.NDArray[np.float32]
Float64Array: TypeAlias = npt.NDArray[np.float64]
Int32Array: TypeAlias = npt.NDArray[np.int32]
Int64Array: TypeAlias = npt.NDArray[np.int64]
