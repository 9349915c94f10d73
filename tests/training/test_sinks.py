"""The optional metric sinks, run for real: W&B in offline mode and TensorBoard event files,
each read back with the tool's own reader."""

from __future__ import annotations

import importlib
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tempering.training import TensorBoardSink, WandbSink, make_sinks

_BLOCK = 32768


def _wandb_records(raw: bytes) -> Iterator[bytes]:
    """The records of a ``.wandb`` run file: a 7-byte header (``:W&B``, magic, version), then
    LevelDB's log format (32 KiB blocks of ``crc32c u32, length u16, type u8, data``; type 1 is a
    whole record, 2/3/4 its first/middle/last fragment)."""
    assert raw[:4] == b":W&B", raw[:16]
    pos, pending = 7, b""
    while pos + 7 <= len(raw):
        left = _BLOCK - pos % _BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        data = raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:
            continue
        pending = data if kind in (1, 2) else pending + data
        if kind in (1, 4):
            yield pending
            pending = b""


def _key(item: Any) -> str:
    """A history or config item's name (``key``, or its ``nested_key`` path joined by ``/``)."""
    return str(item.key) or "/".join(item.nested_key)


STEPS = [{"loss": 2.0 - 0.25 * s, "optim/lr": 1e-3 * (s + 1)} for s in range(4)]


@pytest.mark.timeout(120)
def test_tensorboard_sink_event_files_read_back(tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="the logging extra (tensorboard) is not installed: pip install -e .[logging]",
    )
    sinks = make_sinks(tmp_path, {"lr": 1e-3}, wandb_project=None, tensorboard=True)
    assert len(sinks) == 1
    assert isinstance(sinks[0], TensorBoardSink)
    for step, metrics in enumerate(STEPS):
        sinks[0].log(metrics, step)
    sinks[0].close()

    acc: Any = event_accumulator.EventAccumulator(str(tmp_path / "logs"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"loss", "optim/lr"}
    for tag in ("loss", "optim/lr"):
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [0, 1, 2, 3]
        assert [e.value for e in events] == pytest.approx([m[tag] for m in STEPS], rel=1e-6)


@pytest.mark.timeout(180)
def test_wandb_sink_offline_run_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip(
        "wandb", reason="the logging extra (wandb) is not installed: pip install -e .[logging]"
    )
    wandb_internal_pb2: Any = importlib.import_module(
        "wandb.proto.wandb_internal_pb2"
    )  # wandb's record schema

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    run_dir = tmp_path / "run-7"
    run_dir.mkdir()
    sinks = make_sinks(run_dir, {"lr": 1e-3, "batch": 4}, wandb_project="tempering-test", tensorboard=False)
    assert len(sinks) == 1
    assert isinstance(sinks[0], WandbSink)
    for step, metrics in enumerate(STEPS):
        sinks[0].log(metrics, step)
    sinks[0].close()

    files = sorted(run_dir.glob("wandb/offline-run-*-run-7/run-run-7.wandb"))
    assert len(files) == 1, sorted(str(p) for p in run_dir.rglob("*"))
    history: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    for data in _wandb_records(files[0].read_bytes()):
        record: Any = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({_key(item): json.loads(item.value_json) for item in record.history.item})
        elif kind in ("config", "run"):
            updates = record.config.update if kind == "config" else record.run.config.update
            config.update({_key(item): json.loads(item.value_json) for item in updates})
    assert config.get("lr") == pytest.approx(1e-3)
    assert config.get("batch") == 4
    logged = [h for h in history if "loss" in h]
    assert [h["_step"] for h in logged] == [0, 1, 2, 3]
    for h, metrics in zip(logged, STEPS, strict=True):
        assert h["loss"] == pytest.approx(metrics["loss"])
        assert h["optim/lr"] == pytest.approx(metrics["optim/lr"])
