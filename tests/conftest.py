"""Fixtures shared by the tests that train or sample on the local engine: one checkpoint store
(``TEMPERING_HOME``, with the tiny model built once) and one service client per session, on the
CPU in float32 with one torch thread (the tiny model gains nothing from more, and CI machines
are shared)."""

from __future__ import annotations

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
    client = ServiceClient(root=local_root, device="cpu", dtype="float32", num_threads=1)
    yield client
    client.close()
