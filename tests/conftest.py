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
