"""``tempering view`` on a synthetic big run: 10,000 steps of 40 metrics, and 1,000 trajectory-log
parts of 1,000 transitions each (1M transitions; ``view_workload.py``). ``make bench`` runs
these; docs/view.md has the figures."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient
from view_workload import big_run

from tempering.view import build_app, find_runs
from tempering.view import curves as view_curves


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    return TestClient(build_app(find_runs([big_run(tmp_path_factory.mktemp("big"))])))


@pytest.mark.benchmark(group="view")
def test_metrics_cold(benchmark: Any, client: TestClient) -> None:
    def run() -> int:
        view_curves._SERIES_CACHE.clear()  # pyright: ignore[reportPrivateUsage]
        r = client.get("/api/metrics")
        assert r.status_code == 200
        return len(r.content)

    benchmark(run)


@pytest.mark.benchmark(group="view")
def test_metrics_poll_unchanged(benchmark: Any, client: TestClient) -> None:
    benchmark(lambda: client.get("/api/metrics").status_code)


@pytest.mark.benchmark(group="view")
def test_rollout_page(benchmark: Any, client: TestClient) -> None:
    def run() -> int:
        r = client.get("/api/rollouts", params={"step": 9990})
        page = r.json()
        assert len(page["groups"]) == 125  # 1,000 episodes in groups of 8: every group summarised
        assert len(page["episodes"]) == 8  # the best group shown
        return r.status_code

    benchmark(run)


@pytest.mark.benchmark(group="view")
def test_steps(benchmark: Any, client: TestClient) -> None:
    benchmark(lambda: client.get("/api/steps").status_code)
