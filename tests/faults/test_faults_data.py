"""Faults of data files and run directories (issue 15, item 12): bytes that are not UTF-8, lone
surrogates, a 50 MB line, ``--data.max-length -1``, a data file edited between a kill and a
resume, corrupt ``config.json`` / ``checkpoints.jsonl`` lines, and the ``--run.if-exists`` advice."""

from __future__ import annotations

import json
import time
from pathlib import Path

import attrs
import pytest

from tempering.cli import main
from tempering.data import MAX_LINE_BYTES, DataError, load_chat
from tempering.training import RunDir, RunExistsError
from tempering.training.rundir import CheckpointRecord, RunDirCorruptError


def _row(text: str) -> bytes:
    convo = {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]}
    return json.dumps(convo).encode() + b"\n"


# ------------------------------------------------------------------------------ data files


@pytest.mark.timeout(30)
def test_bytes_that_are_not_utf8_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    bad = _row("caf\u00e9").replace(b"caf\\u00e9", b"caf\xe9")  # Latin-1, not UTF-8
    path.write_bytes(_row("one") + bad + _row("three"))
    with pytest.raises(DataError) as exc:
        load_chat(path)
    assert exc.value.line == 2
    assert str(exc.value).startswith(f"{path}:2: not UTF-8: byte 0xe9 at byte ")
    assert "re-encode the file as UTF-8" in str(exc.value)
    data = load_chat(path, skip_bad_rows=True)  # skip_bad_rows is honoured
    assert data.origins == (f"{path}:1", f"{path}:3")
    assert data.bad_rows.count == 1


@pytest.mark.timeout(30)
def test_a_lone_surrogate_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_bytes(
        _row("fine")
        + _row("broken \ud800 here".encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass"))
    )
    text = path.read_text()
    assert "\\ud800" in text  # json.dumps wrote the escape
    with pytest.raises(
        DataError, match=r":2: a lone surrogate escape \(not valid Unicode\): '\\ud800' at character 8"
    ):
        load_chat(path)
    assert load_chat(path, skip_bad_rows=True).bad_rows.count == 1


@pytest.mark.timeout(60)
def test_a_50_mb_line_is_refused_at_load_time(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    with path.open("wb") as f:
        f.write(_row("first"))
        f.write(_row("x" * (50 * 1024 * 1024)))
        f.write(_row("third"))
    assert MAX_LINE_BYTES < 50 * 1024 * 1024
    t0 = time.perf_counter()
    with pytest.raises(DataError) as exc:
        load_chat(path)
    assert exc.value.line == 2
    assert f"{path}:2: the line is longer than {MAX_LINE_BYTES} bytes" in str(exc.value)
    data = load_chat(path, skip_bad_rows=True)
    assert data.origins == (f"{path}:1", f"{path}:3")
    assert time.perf_counter() - t0 < 30  # read once, never parsed (83 s and 10.5 GB before)


# ------------------------------------------------------------------------------ CLI flags


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["-1", "0"])
def test_a_bad_max_length_is_refused_before_the_run_dir(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(["sft", "--run.log-dir", str(log_dir), "--data.max-length", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "max_length must be >= 1" in err
    assert f"got {value}" in err
    assert not log_dir.exists()


# ------------------------------------------------------------------------------ run directories


@attrs.frozen
class _Config:
    data: str
    lr: float = 1e-3


def _started_run(tmp_path: Path, data: Path) -> RunDir:
    run, resumed = RunDir.open(tmp_path / "run", _Config(str(data)))
    assert not resumed
    run.append_metrics({"step": 0, "loss": 1.0})
    run.add_checkpoint(CheckpointRecord("step-1", 1, 0, 1, "tempering://r/weights/step-1"))
    return run


def test_a_changed_config_refusal_names_the_real_flag(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_bytes(_row("a"))
    _started_run(tmp_path, data)
    with pytest.raises(RunExistsError, match="fields lr") as exc:
        RunDir.open(tmp_path / "run", _Config(str(data), lr=2e-3))
    assert "--run.if-exists overwrite" in str(exc.value)
    assert " --if-exists" not in str(exc.value)


def test_a_data_file_edited_between_kill_and_resume_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_bytes(_row("a") + _row("b"))
    run = _started_run(tmp_path, data)
    assert str(data) in json.loads(run.config_path.read_text())["__files__"]
    assert RunDir.open(tmp_path / "run", _Config(str(data)))[1]  # unchanged: resumes
    data.write_bytes(_row("a") + _row("B"))
    metrics_before = run.metrics_path.read_bytes()
    with pytest.raises(RunExistsError) as exc:
        RunDir.open(tmp_path / "run", _Config(str(data)))
    message = str(exc.value)
    assert message.startswith(f"{data} changed since the run in {run.path} started")
    assert "--run.if-exists overwrite" in message
    assert run.metrics_path.read_bytes() == metrics_before  # nothing lost
    data.unlink()
    with pytest.raises(RunExistsError, match=r"this data file of the run .* is gone"):
        RunDir.open(tmp_path / "run", _Config(str(data)))


def test_a_relative_data_path_resumed_from_another_directory_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "train.jsonl").write_bytes(_row("a"))
    monkeypatch.chdir(tmp_path / "a")
    _started_run(tmp_path, Path("train.jsonl"))
    assert RunDir.open(tmp_path / "run", _Config("train.jsonl"))[1]  # same directory: resumes
    monkeypatch.chdir(tmp_path / "b")
    with pytest.raises(RunExistsError) as exc:
        RunDir.open(tmp_path / "run", _Config("train.jsonl"))
    message = str(exc.value)
    assert "is gone (a relative path, read from the current directory" in message
    assert str(tmp_path / "b") in message
    assert "resume from the directory the run started in" in message


def test_a_corrupt_config_json_names_the_file_and_line(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_bytes(_row("a"))
    run = _started_run(tmp_path, data)
    text = run.config_path.read_text().splitlines()
    text[2] = text[2][:-3] + "?!"
    run.config_path.write_text("\n".join(text) + "\n")
    with pytest.raises(RunDirCorruptError, match=rf"^{run.config_path}:3: not valid JSON"):
        RunDir.open(tmp_path / "run", _Config(str(data)))
    assert run.read_metrics() == [{"step": 0, "loss": 1.0}]


def test_a_config_json_that_is_not_an_object_names_the_file_and_the_remedy(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_bytes(_row("a"))
    run = _started_run(tmp_path, data)
    run.config_path.write_text("[1, 2]\n")
    with pytest.raises(RunDirCorruptError) as exc:
        RunDir.open(tmp_path / "run", _Config(str(data)))
    assert str(exc.value).startswith(
        f"{run.config_path}:1: not a JSON object but a list; the run's config is corrupt (restore it"
    )


def test_a_corrupt_checkpoint_index_line_names_the_file_and_line(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_bytes(_row("a"))
    run = _started_run(tmp_path, data)
    run.add_checkpoint(CheckpointRecord("step-2", 2, 0, 2, "tempering://r/weights/step-2"))
    lines = run.index_path.read_text().splitlines()
    run.index_path.write_text(lines[0][:20] + "\n" + lines[1] + "\n")
    with pytest.raises(RunDirCorruptError) as exc:
        run.last_checkpoint()
    assert str(exc.value).startswith(f"{run.index_path}:1: not valid JSON")
    assert isinstance(exc.value, RunExistsError)  # the CLI prints it as one line, exit 2
    # A torn last line (a kill mid-write) is still ignored, not an error.
    run.index_path.write_text(lines[0] + "\n" + lines[1][:10])
    last = run.last_checkpoint()
    assert last is not None
    assert last.name == "step-1"
