"""Seeds derived from names: one function every sampler and evaluator uses, so the same
(run seed, kind, step, item) gives the same draws everywhere.

Example::

    sampling_seed(0, "train", 5, 2)    # run seed 0, step 5, group 2
"""

from __future__ import annotations

import hashlib

__all__ = ["sampling_seed"]


def sampling_seed(*key: int | str) -> int:
    """A 63-bit seed for ``SamplingParams.seed``, a hash of ``key`` (stable across processes,
    platforms and Python versions; different keys give unrelated seeds).

    Example::

        sampling_seed(0, "train", 5, 2)    # run seed 0, step 5, group 2
    """
    text = "/".join(f"{type(k).__name__}:{k}" for k in key)
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
