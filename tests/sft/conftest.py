"""A temporary ``TEMPERING_HOME`` (tiny model built once) and a CPU local service client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tempering.local import ServiceClient
from tempering.local.tiny import tiny_model_dir


@pytest.fixture(scope="session")
def tempering_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tempering-home")
    tiny_model_dir(root)
    return root


@pytest.fixture(scope="session")
def service(tempering_home: Path) -> Iterator[ServiceClient]:
    client = ServiceClient(root=tempering_home, device="cpu", dtype="float32", num_threads=1)
    yield client
    client.close()
