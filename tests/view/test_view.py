"""``tempering view``: the JSON endpoints and the static page on a real SFT-style run directory
(written with :class:`RunDir`) and a real RL run (the tiny model, a few steps, trajectory logs
on); a resumed run, a corrupt Parquet part, a directory that is not a run, a port in use."""

from __future__ import annotations

import json
import math
import os
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
    write_eval_rollouts,
    write_static,
)
from tempering.view.curves import key_metrics

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
    # The key curves first (held-out evaluation, loss, learning rate), each once: not in a group.
    assert m["key"] == ["test/nll", "loss", "optim/lr"]
    assert set(m["groups"]) == {"time"}
    loss = m["curves"]["loss"]
    assert len(loss["x"]) <= 2000
    assert loss["x"][0] == 0
    assert loss["y"][0] == pytest.approx(3.0)  # the maximum survives the downsampling
    assert loss["x"][-1] == N_SFT - 1
    assert m["scalars"] == {}
    assert m["stages"] == []
    assert m["clock"] == {"x": [], "t": []}  # no time/elapsed logged
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
    assert m["curves"]["loss"]["y"][-1] == 42.0


@pytest.mark.timeout(300)
def test_rl_rollouts_by_group_sorted_and_corrupt_part_skipped(rl_dir: Path) -> None:
    client = TestClient(build_app(find_runs([rl_dir])))
    steps = client.get("/api/steps").json()
    assert steps == [{"stage": "", "step": s, "global": s, "kinds": ["train"]} for s in (0, 1)]
    m = client.get("/api/metrics").json()
    assert m["steps"] == 2
    assert m["key"][0] == "env/reward/mean"
    full = client.get("/api/rollouts", params={"step": 1, "sort": "best"}).json()
    assert full["total"] >= 2
    # One group at a time: every group summarised, best mean reward first; the first one shown.
    means = [g["mean_reward"] for g in full["groups"]]
    assert means == sorted(means, reverse=True)
    assert sum(g["size"] for g in full["groups"]) == full["total"]
    assert full["group"] == full["groups"][0]["group"]
    assert {e["group"] for e in full["episodes"]} == {full["group"]}
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
    every: list[dict[str, Any]] = []
    for g in full["groups"]:
        page = client.get("/api/rollouts", params={"step": 1, "group": g["group"]}).json()
        assert page["group"] == g["group"]
        assert len(page["episodes"]) == g["size"]
        every += page["episodes"]
    text = json.loads((rl_dir / "trajectories/text/step-000001.jsonl").read_text().splitlines()[0])
    by_id = {e["episode_id"]: e for e in every}
    assert by_id[text["episode_id"]]["turns"][0]["action"] == text["turns"][0]["action"]
    assert full["end_reasons"]
    for reason in full["end_reasons"]:
        only = client.get("/api/rollouts", params={"step": 1, "end_reason": reason}).json()
        assert only["total"] >= 1
        assert {e["end_reason"] for e in only["episodes"]} == {reason}
    for tag in full["tags"]:
        only = client.get("/api/rollouts", params={"step": 1, "tag": tag}).json()
        assert all(tag in e["tags"] for e in only["episodes"])
    none = client.get("/api/rollouts", params={"step": 1, "tag": "no-such-tag"}).json()
    assert none["total"] == 0
    assert none["episodes"] == []
    assert none["group"] is None
    worst = client.get("/api/rollouts", params={"step": 1, "sort": "worst"}).json()
    assert [g["mean_reward"] for g in worst["groups"]] == sorted(means)
    assert client.get("/api/rollouts", params={"step": 1, "stage": "nope"}).status_code == 409

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
    assert [s["step"] for s in data["steps"][1]] == [0, 1]
    assert data["rollouts"]["1::0"]["total"] >= 2
    assert sum(len(g["members"]) for g in data["rollouts"]["1::0"]["groups"]) >= 2


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


def _stage(path: Path, n: int, t0: float, **extra: float) -> Path:
    run, _ = RunDir.open(path, _Config())
    for s in range(n):
        run.append_metrics({"step": s, "loss": 1.0 / (1 + s), "time/elapsed": 2.0 * (s + 1), **extra})
    os.utime(path / "config.json", (t0, t0))
    return path


def test_recipe_dir_is_one_run_with_stages_on_one_axis(tmp_path: Path) -> None:
    """A recipe's directory: one run, its stages in the order they started, laid end to end
    (stage k's step s at offset_k + s + 1), each metric one series; a stage alone is a run."""
    _stage(tmp_path / "demo" / "sft", 5, 1000.0, **{"test/accuracy": 0.5})
    _stage(tmp_path / "demo" / "rl", 3, 2000.0, **{"env/reward/mean": 0.25})
    (tmp_path / "demo" / "data").mkdir()  # not a run: not a stage
    (run,) = find_runs([tmp_path / "demo"])
    assert run.name == "demo"
    assert [s.name for s in run.stages] == ["sft", "rl"]  # by start, not by name
    m = TestClient(build_app([run])).get("/api/metrics").json()
    assert m["steps"] == 8
    assert m["stages"] == [
        {"name": "sft", "start": 1, "end": 5, "offset": 0},
        {"name": "rl", "start": 6, "end": 8, "offset": 5},
    ]
    assert m["key"] == ["env/reward/mean", "test/accuracy", "loss"]
    assert m["curves"]["loss"]["x"] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert m["curves"]["env/reward/mean"]["x"] == [6, 7, 8]
    # Wall time runs on across stages: the RL stage starts where SFT ended (10 s).
    assert m["clock"] == {"x": [1, 2, 3, 4, 5, 6, 7, 8], "t": [2, 4, 6, 8, 10, 12, 14, 16]}
    (alone,) = find_runs([tmp_path / "demo" / "rl"])
    assert (alone.name, alone.stages) == ("rl", ())
    assert TestClient(build_app([alone])).get("/api/metrics").json()["curves"]["loss"]["x"] == [0, 1, 2]


def test_single_points_are_scalars_and_intervals_are_bands(tmp_path: Path) -> None:
    run, _ = RunDir.open(tmp_path / "r", _Config())
    run.append_metrics({"step": 0, "loss": 2.0, "initial/test/accuracy": 0.1})
    for s in (1, 2):
        run.append_metrics(
            {
                "step": s,
                "loss": 1.0,
                "test/accuracy": 0.5,
                "test/accuracy/ci95_low": 0.4,
                "test/accuracy/ci95_high": 0.6,
            }
        )
    m = TestClient(build_app(find_runs([tmp_path / "r"]))).get("/api/metrics").json()
    assert m["scalars"] == {"initial/test/accuracy": {"x": 0.0, "y": 0.1}}
    assert m["curves"]["test/accuracy"] == {"x": [1, 2], "y": [0.5, 0.5], "lo": [0.4, 0.4], "hi": [0.6, 0.6]}
    every = {n for g in m["groups"].values() for n in g} | set(m["curves"]) | set(m["scalars"])
    assert every == {"loss", "test/accuracy", "initial/test/accuracy"}  # the bounds are no series


def _eval_ep(p: int, g: int, question: str, answer: str, reward: float) -> dict[str, Any]:
    turn = {"turn": 0, "reward": reward, "observation": question, "action": answer, "ac_tokens": [1]}
    return {
        "episode_id": f"p{p}-g{g}", "group": p, "member": g, "tags": ["sft", "eval"], "note": "expected 4",
        "total_reward": reward, "turns": [{**turn, "ac_logprobs": [-0.1], "ac_pieces": [answer]}],
    }  # fmt: skip


def test_evaluation_comparison_matches_items_and_marks_changes(tmp_path: Path) -> None:
    """The same held-out items before and after, matched by prompt (not by position): fixed
    (mean reward up), broken (down), the same; items evaluated once are counted, not paired."""
    _stage(tmp_path / "demo" / "sft", 2, 1000.0)
    _stage(tmp_path / "demo" / "rl", 2, 2000.0)
    demo = tmp_path / "demo"
    before = [("2+2=", "5", 0.0), ("1+1=", "2", 1.0), ("3+3=", "6", 1.0), ("9+9=", "1", 0.0)]
    after = [("3+3=", "6", 1.0), ("1+1=", "3", 0.0), ("2+2=", "4", 1.0)]
    write_eval_rollouts(demo, 0, [_eval_ep(p, 0, *x) for p, x in enumerate(before)])
    write_eval_rollouts(
        demo, 4, [*(_eval_ep(p, 0, *x) for p, x in enumerate(after)), _eval_ep(2, 1, *after[2])]
    )
    client = TestClient(build_app(find_runs([demo])))
    cmp = client.get("/api/compare").json()  # default: the first and the last evaluation
    assert (cmp["before"], cmp["after"]) == ({"stage": "", "step": 0}, {"stage": "", "step": 4})
    assert [(it["prompt"], it["change"]) for it in cmp["items"]] == [
        ("2+2=", "fixed"),
        ("1+1=", "broken"),
        ("3+3=", "same"),
    ]
    assert cmp["items"][0]["before"] == [{"text": "5", "reward": 0.0}]
    assert cmp["items"][0]["after"] == [{"text": "4", "reward": 1.0}, {"text": "4", "reward": 1.0}]
    assert (cmp["fixed"], cmp["broken"], cmp["only_before"], cmp["only_after"]) == (1, 1, 1, 0)
    assert cmp["before_mean"] == pytest.approx(2 / 3)
    assert cmp["after_mean"] == pytest.approx(2 / 3)
    same = client.get("/api/compare", params={"before": 4, "after": 4}).json()
    assert {it["change"] for it in same["items"]} == {"same"}
    assert client.get("/api/compare", params={"before": 4}).status_code == 400  # no after


def test_key_metrics_order() -> None:
    names = ["time/step", "optim/lr", "loss", "kl/sample_train_v1", "test/nll", "test/accuracy",
             "env/reward/mean", "env/arithmetic/reward/mean", "initial/test/accuracy",
             "test/accuracy/ci95_low"]  # fmt: skip
    assert key_metrics(names) == [
        "env/reward/mean",
        "test/accuracy",
        "test/nll",
        "kl/sample_train_v1",
        "loss",
        "optim/lr",
    ]


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
        model="tiny",
        out=str(out),
        sft=demo.DemoSFT(steps=2),
        rl=demo.DemoRL(steps=1),
        n_test=8,
        eval_seeds=1,
        progress=False,
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
