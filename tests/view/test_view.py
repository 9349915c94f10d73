"""``tempering view``: the JSON endpoints and the static page on a real SFT-style run directory
(written with :class:`RunDir`) and a real RL run (the tiny model, a few steps, trajectory logs
on); a resumed run, a corrupt Parquet part, a directory that is not a run, a port in use."""

from __future__ import annotations

import json
import math
import re
import socket
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
from starlette.testclient import TestClient

from tempering.backend import load_tokenizer
from tempering.cli import main
from tempering.training import CheckpointRecord, RunDir
from tempering.view import (
    NotARunError,
    PortInUseError,
    build_app,
    check_port,
    downsample,
    find_runs,
    write_static,
)

N_SFT = 3000


@attrs.frozen
class _Config:
    kind: str = "sft"
    lr: float = 1e-3


def _sft_run(path: Path) -> Path:
    run, resumed = RunDir.open(path, _Config())
    assert not resumed
    for s in range(N_SFT):
        run.append_metrics(
            {
                "step": s,
                "loss": 3.0 / (1 + s),
                "optim/lr": 1e-3,
                "time/step": 0.01,
                "test/nll": 2.0 - s / N_SFT,
            }
        )
    run.add_checkpoint(CheckpointRecord("000100", 100, 0, 100, "local://state/100", "local://sampler/100"))
    return path


def test_sft_metrics_grouped_downsampled_and_config(tmp_path: Path) -> None:
    client = TestClient(build_app(find_runs([_sft_run(tmp_path / "sft")])))
    runs = client.get("/api/runs").json()
    assert runs[0]["config"]["lr"] == 1e-3
    assert runs[0]["checkpoints"][0]["sampler_path"] == "local://sampler/100"
    m = client.get("/api/metrics", params={"run": 0}).json()
    assert m["steps"] == N_SFT
    assert m["last_step"] == N_SFT - 1
    assert set(m["groups"]) == {"main", "optim", "time", "test"}
    loss = m["groups"]["main"]["loss"]
    assert len(loss["x"]) <= 2000
    assert loss["x"][0] == 0
    assert loss["y"][0] == pytest.approx(3.0)  # the maximum survives the downsampling
    assert loss["x"][-1] == N_SFT - 1
    assert client.get("/api/steps", params={"run": 0}).json() == []
    assert client.get("/api/metrics", params={"run": 5}).status_code == 400
    assert client.get("/api/rollouts", params={"run": 0}).json() == {
        "error": "missing query parameter 'step'"
    }


def test_downsample_keeps_extremes() -> None:
    x = [float(i) for i in range(10_000)]
    y = [math.sin(i / 50) + (10.0 if i == 7777 else 0.0) for i in range(10_000)]
    dx, dy = downsample(x, y, 2000)
    assert len(dx) <= 2000
    assert dx == sorted(dx)
    assert max(dy) == pytest.approx(max(y))
    assert min(dy) == pytest.approx(min(y))


def test_resumed_run_reads_one_line_per_step(tmp_path: Path) -> None:
    path = _sft_run(tmp_path / "sft")
    run = RunDir(path)
    run.truncate_metrics(10)  # a crash, a resume from step 10: steps 10.. written again
    run.append_metrics({"step": 10, "loss": 42.0})
    with run.metrics_path.open("a") as f:
        f.write('{"step": 11, "loss": ')  # torn last line, mid-write
    m = TestClient(build_app(find_runs([path]))).get("/api/metrics").json()
    assert m["steps"] == 11
    assert m["groups"]["main"]["loss"]["y"][-1] == 42.0


@pytest.mark.timeout(300)
def test_rl_rollouts_paged_sorted_and_corrupt_part_skipped(rl_dir: Path) -> None:
    client = TestClient(build_app(find_runs([rl_dir])))
    assert client.get("/api/steps").json() == [0, 1]
    m = client.get("/api/metrics").json()
    assert m["steps"] == 2
    assert any(g.startswith("env") for g in m["groups"])
    full = client.get("/api/rollouts", params={"step": 1, "limit": 200, "sort": "best"}).json()
    assert full["total"] >= 2
    rewards = [e["total_reward"] for e in full["episodes"]]
    assert rewards == sorted(rewards, reverse=True)
    ep = full["episodes"][0]
    assert isinstance(ep["advantage"], float)
    assert ep["turns"][0]["ac_tokens"]
    assert len(ep["turns"][0]["ac_logprobs"]) == len(ep["turns"][0]["ac_tokens"])
    # The tiny model's tokenizer is built in: every token is shown as its text.
    tokenizer = load_tokenizer("tempering/tiny")
    for turn in ep["turns"]:
        assert turn["ac_pieces"] == [tokenizer.decode([t]) for t in turn["ac_tokens"]]
        assert len(turn["ac_pieces"]) == len(turn["ac_tokens"])
    text = json.loads((rl_dir / "trajectories/text/step-000001.jsonl").read_text().splitlines()[0])
    by_id = {e["episode_id"]: e for e in full["episodes"]}
    assert by_id[text["episode_id"]]["turns"][0]["action"] == text["turns"][0]["action"]
    page = client.get("/api/rollouts", params={"step": 1, "offset": 1, "limit": 1, "sort": "best"}).json()
    assert page["episodes"] == full["episodes"][1:2]
    assert full["end_reasons"]
    for reason in full["end_reasons"]:
        only = client.get("/api/rollouts", params={"step": 1, "limit": 200, "end_reason": reason}).json()
        assert only["total"] >= 1
        assert {e["end_reason"] for e in only["episodes"]} == {reason}
    for tag in full["tags"]:
        only = client.get("/api/rollouts", params={"step": 1, "limit": 200, "tag": tag}).json()
        assert all(tag in e["tags"] for e in only["episodes"])
    none = client.get("/api/rollouts", params={"step": 1, "tag": "no-such-tag"}).json()
    assert none["total"] == 0
    worst = client.get("/api/rollouts", params={"step": 1, "limit": 200, "sort": "worst"}).json()
    assert [e["total_reward"] for e in worst["episodes"]] == sorted(rewards)

    # A part cut off mid-write: skipped with a note naming it, never a 500.
    part = rl_dir / "trajectories/rl/step-000001.parquet"
    saved = part.read_bytes()
    try:
        part.write_bytes(saved[: len(saved) // 2])
        bad = client.get("/api/rollouts", params={"step": 1})
        assert bad.status_code == 200
        assert bad.json()["episodes"] == []
        assert "step-000001.parquet: skipped" in bad.json()["notes"][0]
    finally:
        part.write_bytes(saved)


@pytest.mark.timeout(300)
def test_static_page_is_self_contained(rl_dir: Path, tmp_path: Path) -> None:
    sft = _sft_run(tmp_path / "sft")
    out = tmp_path / "page.html"
    assert main(["view", str(sft), str(rl_dir), "--static", str(out)]) == 0
    html = out.read_text()
    assert "cdn" not in html.lower().split("<script>const data")[0][-2000:]
    assert 'src="http' not in html
    assert "Plotly" in html
    data: dict[str, Any] = json.loads(re.search(r"const DATA = (\{.*?\});</script>", html, re.S).group(1))  # type: ignore[union-attr]
    assert [r["name"] for r in data["runs"]] == ["sft", rl_dir.name]
    assert data["metrics"][0]["steps"] == N_SFT
    assert data["steps"][1] == [0, 1]
    assert data["rollouts"]["1:0"]["total"] >= 2


def test_served_page_and_plotly_js(tmp_path: Path) -> None:
    client = TestClient(build_app(find_runs([_sft_run(tmp_path / "sft")])))
    page = client.get("/")
    assert page.status_code == 200
    assert '<script src="/plotly.js">' in page.text
    js = client.get("/plotly.js")
    assert js.status_code == 200
    assert "plotly.js" in js.text[:2000].lower()


def test_not_a_run_lists_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotARunError, match=r"no config\.json and no metrics\.jsonl"):
        find_runs([tmp_path / "empty"])
    with pytest.raises(NotARunError, match="no such directory"):
        find_runs([tmp_path / "nope"])
    assert main(["view", str(tmp_path / "empty"), "--static", str(tmp_path / "x.html")]) == 2
    assert "is not a run directory" in capsys.readouterr().err


def test_recipe_dir_of_stages_is_several_runs(tmp_path: Path) -> None:
    _sft_run(tmp_path / "demo" / "sft")
    _sft_run(tmp_path / "demo" / "rl")
    assert [r.name for r in find_runs([tmp_path / "demo"])] == ["demo/rl", "demo/sft"]
    _sft_run(tmp_path / "demo")  # a run of its own beside its stages
    assert [r.name for r in find_runs([tmp_path / "demo"])] == ["demo", "demo/rl", "demo/sft"]


def test_port_in_use_is_a_named_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"port {port} on 127.0.0.1 is in use"):
            check_port("127.0.0.1", port)
        assert main(["view", str(_sft_run(tmp_path / "sft")), "--port", str(port)]) == 2
    assert "is in use" in capsys.readouterr().err


def test_write_static_api(tmp_path: Path) -> None:
    out = write_static([_sft_run(tmp_path / "sft")], tmp_path / "a" / "b.html")
    assert out.is_file()


@pytest.mark.timeout(120)
def test_demo_without_view_extra_says_which_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without plotly (the ``view`` extra) the demo stops before training, in one line naming the
    extra, and writes nothing."""
    from tempering.recipes import demo
    from tempering.view import page

    page.plotly_js.cache_clear()  # an earlier test may have loaded plotly.js
    monkeypatch.setitem(sys.modules, "plotly.offline", None)  # import fails
    out = tmp_path / "run"
    tiny = demo.DemoConfig(
        model="tiny", out=str(out), sft_steps=2, rl_steps=1, n_test=8, eval_seeds=1, progress=False
    )
    try:
        assert demo.main(tiny) == 1
    finally:
        page.plotly_js.cache_clear()
    err = capsys.readouterr().err
    assert err.startswith("tempering demo:")
    assert "tempering[view]" in err
    assert err.count("\n") == 1
    assert not out.exists()
