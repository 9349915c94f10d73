"""Fixtures shared by the tests that train or sample on the local engine: one checkpoint store
(``TEMPERING_HOME``, with the tiny model built once) and one service client per session, on the
CPU in float32 with one torch thread (the tiny model gains nothing from more, and CI machines
are shared).

``TEMPERING_TEST_DEVICE=cuda`` (and optionally ``TEMPERING_TEST_DTYPE``) runs the tests that use
the ``service`` fixture on a GPU instead: how the CUDA path of the local engine is checked on a
machine that has one (CI has none; see tests/local/test_local_cuda.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tempering.local import ServiceClient

# Ray 2.60 authenticates to a local cluster with a token it reads from ``~/.ray/auth_token``
# (creating it) and keeps for the rest of the process. The docs-command test runs `tempering rl
# --ray-workers 2` in this process with ``HOME`` pointed at a scratch directory, so a Ray started
# later by tests/rl/test_ray_executor.py (real ``HOME``, another token) refused the driver, and
# whether it happened depended on the random test order. The suite's clusters are local and
# short-lived: no token.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
from tempering.local.tiny import tiny_model_dir


@pytest.fixture(scope="session")
def local_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tempering-home")
    tiny_model_dir(root)
    return root


@pytest.fixture(scope="session")
def tempering_home(local_root: Path) -> Path:
    """The same store under the name the trainer tests use for the environment variable."""
    return local_root


@pytest.fixture(scope="session")
def tiny_dir(local_root: Path) -> Path:
    return tiny_model_dir(local_root)


@pytest.fixture(scope="session")
def service(local_root: Path) -> Iterator[ServiceClient]:
    device = os.environ.get("TEMPERING_TEST_DEVICE") or "cpu"
    dtype = os.environ.get("TEMPERING_TEST_DTYPE") or "float32"
    client = ServiceClient(root=local_root, device=device, dtype=dtype, num_threads=1)
    yield client
    client.close()
