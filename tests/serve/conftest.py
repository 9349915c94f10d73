"""One ``tempering serve`` subprocess per test module (tiny model, CPU, one torch thread), with
its own data directory and ``TEMPERING_HOME``, always stopped at the end.

The tinker SDK (0.38) never closes the connection pool it opens for ``/client/config``, so its
sockets are garbage-collected with a ``ResourceWarning``; the tests ignore that one warning
(``pytestmark`` in each module) and collect the SDK's garbage before leaving the module, so the
warning cannot fire in someone else's test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker

from tempering.local.tiny import build_tiny_model
from tempering.serve.testing import API_KEY, ServerProcess, collect_sdk_garbage


@pytest.fixture(scope="module")
def serve_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve")


@pytest.fixture(scope="module")
def tiny_dir(serve_root: Path) -> Path:
    """The tiny model as a model directory (what ``tempering tiny-model DIR`` writes)."""
    return build_tiny_model(serve_root / "tiny")


@pytest.fixture(scope="module")
def server(serve_root: Path, tiny_dir: Path) -> Iterator[ServerProcess]:
    del tiny_dir
    process = ServerProcess(serve_root / "data", serve_root / "home", "--max-request-mb", "4")
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def service(server: ServerProcess) -> Iterator[tinker.ServiceClient]:
    client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    yield client
    client.close("success").result(timeout=30)


@pytest.fixture(scope="module", autouse=True)
def _collect_sdk_garbage() -> Iterator[None]:
    yield
    collect_sdk_garbage()
