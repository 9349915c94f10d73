"""Fixtures for the RL tests: one local-engine service client per session (CPU, float32, one
torch thread) with the tiny model built once."""

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
def service(local_root: Path) -> Iterator[ServiceClient]:
    client = ServiceClient(root=local_root, device="cpu", dtype="float32", num_threads=1)
    yield client
    client.close()
