"""The run directory: what a training run writes, and how a killed run is picked up again.

Layout (every file is written atomically, or append-only with a torn last line ignored)::

    <log_dir>/config.json        the run's config (JSON form of the attrs config), and under
                                 ``"__files__"`` the SHA-256 of every data file it names
    <log_dir>/metrics.jsonl      one line per completed optimizer step, in step order
    <log_dir>/checkpoints.jsonl  the checkpoint index: one record per saved state
    <log_dir>/state.json         values fixed when the run starts (e.g. DPO's reference weights)

Step numbers: the metrics line of step ``s`` (0-based) is written once that step's
``optim_step`` has completed. A checkpoint record with ``step == k`` holds the weights and
optimizer state after ``k`` optimizer steps: the run continues with step ``k``. It is written
only after the metrics lines of steps ``0..k-1``, so that after a resume from it the metrics file
can be cut back to exactly those lines and every later line is computed once more.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, TypeAlias, cast

import attrs

from tempering.data.jsontext import NotJSONObjectError, loads_object
from tempering.fs import DirLock, DirLockedError, naming, require_directory

__all__ = [
    "CheckpointRecord",
    "IfExists",
    "RunDir",
    "RunDirCorruptError",
    "RunExistsError",
    "RunLockedError",
    "config_to_json",
    "opened_run_dirs",
]

IfExists: TypeAlias = Literal["resume", "refuse", "overwrite"]
"""What to do when the run directory already holds a run (see :meth:`RunDir.open`)."""

_log = logging.getLogger(__name__)

_RUN_FILES = ("config.json", "metrics.jsonl", "checkpoints.jsonl", "state.json")
_RUN_FOLDERS = ("logs", "inspect")
"""Folders of a run that an overwrite empties: TensorBoard's, and the inspect logs of the
evaluation suite's inspect tasks (``tempering.evals.inspect_eval``)."""


class RunExistsError(RuntimeError):
    """The run directory holds a run that may not be resumed (or ``if_exists="refuse"``)."""


class RunLockedError(RunExistsError):
    """Another process is writing the run directory; the message names it (pid, host, start time)."""


class RunDirCorruptError(RunExistsError):
    """A file of the run directory cannot be read back; the message names the file and line."""


_FILES_KEY = "__files__"
_OVERWRITE = "start again with --run.if-exists overwrite (RunConfig.if_exists='overwrite')"


def _file_strings(value: object) -> Iterator[str]:
    """Every string of a config's JSON form that names an existing file."""
    if isinstance(value, str):
        if value and "\n" not in value and len(value) < 4096 and os.path.isfile(value):
            yield value
    elif isinstance(value, dict):
        for v in cast("dict[str, object]", value).values():
            yield from _file_strings(v)
    elif isinstance(value, list):
        for v in cast("list[object]", value):
            yield from _file_strings(v)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _data_files(config_json: Mapping[str, Any], ignore: frozenset[str]) -> dict[str, str]:
    """``{path: sha256}`` of the files the config names (fields in ``ignore`` aside)."""
    paths = {p for k, v in config_json.items() if k not in ignore for p in _file_strings(v)}
    return {p: _sha256(p) for p in sorted(paths)}


def _parse_json(
    path: Path, text: str, *, line: int = 1, damage: str = "the file is corrupt"
) -> dict[str, Any]:
    """``text`` (from ``path``, starting at line ``line``) as a JSON object, or
    :class:`RunDirCorruptError` naming the file and line."""
    try:
        return loads_object(text)
    except NotJSONObjectError as exc:
        raise RunDirCorruptError(
            f"{path}:{line + exc.lineno - 1}: {exc}; {damage} (restore it from a backup, or {_OVERWRITE})"
        ) from None


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader sees the old file or the new one, never a mix."""
    with naming(path):
        _write_atomic_unnamed(path, text)


def _write_atomic_unnamed(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _json_value(value: object) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in cast("Mapping[object, object]", value).items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in cast("list[object]", value)]
    if isinstance(value, os.PathLike):
        return os.fspath(cast("os.PathLike[str]", value))
    if attrs.has(type(value)):
        return config_to_json(value)
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    module = getattr(value, "__module__", None) or type(value).__module__
    return f"<{module}.{name}>"


def config_to_json(config: object) -> dict[str, Any]:
    """The JSON form of an attrs config: fields by name, nested configs as objects, with the
    class under ``"__type__"``; callables and other objects as ``"<module.name>"``.

    Example::

        config_to_json(AdamConfig())  # {"__type__": "tempering.training.schedule.AdamConfig", ...}
    """
    cls = type(config)
    out: dict[str, Any] = {"__type__": f"{cls.__module__}.{cls.__qualname__}"}
    for field in attrs.fields(cls):
        out[field.name] = _json_value(getattr(config, field.name))
    return out


@attrs.frozen
class CheckpointRecord:
    """One entry of the checkpoint index.

    ``step``: optimizer steps done (the run continues with step ``step``); ``epoch`` and
    ``batch``: the data position of that next step; ``state_path``: the ``save_state`` path
    (weights and optimizer); ``sampler_path``: weights for sampling, when saved; ``final``:
    written at the end of the run.
    """

    name: str
    step: int
    epoch: int
    batch: int
    state_path: str
    sampler_path: str | None = None
    final: bool = False

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @staticmethod
    def from_json(raw: Mapping[str, Any]) -> CheckpointRecord:
        return CheckpointRecord(
            name=str(raw["name"]),
            step=int(raw["step"]),
            epoch=int(raw["epoch"]),
            batch=int(raw["batch"]),
            state_path=str(raw["state_path"]),
            sampler_path=None if raw.get("sampler_path") is None else str(raw["sampler_path"]),
            final=bool(raw.get("final", False)),
        )


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The complete lines of a JSON-lines file; a torn last line (a kill mid-write) is skipped."""
    if not path.is_file():
        return
    text = path.read_text()
    lines = text.split("\n")
    if not text.endswith("\n"):
        lines = lines[:-1]  # the last line was never finished
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield _parse_json(path, line, line=number)


def _metrics_json(line: Mapping[str, Any]) -> str:
    """One metrics line as strict JSON: NaN and infinities become ``null``."""
    return json.dumps(
        {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in line.items()},
        allow_nan=False,
    )


def _check_data_files(config_path: Path, recorded: object) -> None:
    """Refuse a resume when a data file recorded in ``config.json`` changed or went away."""
    if not isinstance(recorded, dict):
        return  # a run started before files were recorded
    for name, digest in cast("dict[str, object]", recorded).items():
        if not os.path.isfile(name):
            where = (
                ""
                if os.path.isabs(name)
                else f" (a relative path, read from the current directory {os.getcwd()}: resume from "
                "the directory the run started in)"
            )
            raise RunExistsError(
                f"{name}: this data file of the run in {config_path.parent} is gone{where}; restore "
                f"it to resume, or {_OVERWRITE}"
            )
        if _sha256(name) != digest:
            raise RunExistsError(
                f"{name} changed since the run in {config_path.parent} started (its SHA-256 is "
                f"recorded in {config_path}); resuming would train on other data: restore the "
                f"file, use another --run.log-dir, or {_OVERWRITE}"
            )


EXTENDABLE = frozenset({"max_steps", "num_steps", "num_epochs"})
"""Config fields a resume may raise: a finished (or running) run is extended to more steps."""


def _extends(key: str, old: object, new: object) -> bool:
    return (
        key in EXTENDABLE
        and isinstance(old, int)
        and isinstance(new, int)
        and not isinstance(old, bool)
        and new > old
    )


def _short(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


_OPENED: dict[Path, RunDir] = {}
"""The run directories this process opened for a run, oldest first (:func:`opened_run_dirs`)."""


def opened_run_dirs() -> list[RunDir]:
    """The run directories this process opened with :meth:`RunDir.open`, each once, in order
    (the CLI says after Ctrl-C how each one resumes)."""
    return list(_OPENED.values())


class RunDir:
    """A run directory (see the module docstring for the layout).

    Example::

        run = RunDir.open("runs/sft-1", config, if_exists="resume")
        last = run.last_checkpoint()           # None for a fresh run
        run.truncate_metrics(last.step if last else 0)
        run.append_metrics({"step": 0, "loss": 1.2})
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._warned_non_finite: set[str] = set()
        self._lock: DirLock | None = None

    @property
    def locked(self) -> bool:
        """Whether this object holds the directory's lock (taken by :meth:`open` and :meth:`lock`)."""
        return self._lock is not None and self._lock.held

    def lock(self) -> RunDir:
        """Take the directory's exclusive lock (:class:`tempering.fs.DirLock`) until :meth:`close`.

        Raises :class:`RunLockedError` naming the process that holds it.
        """
        if not self.locked:
            try:
                self._lock = DirLock.acquire(self.path, what="run directory")
            except DirLockedError as exc:
                raise RunLockedError(str(exc)) from None
        return self

    def close(self) -> None:
        """Release the lock (idempotent); the files stay."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def index_path(self) -> Path:
        return self.path / "checkpoints.jsonl"

    @property
    def state_path(self) -> Path:
        return self.path / "state.json"

    def exists(self) -> bool:
        """Whether a run was started here (its ``config.json`` was written)."""
        return self.config_path.is_file()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        config: object,
        if_exists: IfExists = "resume",
        *,
        ignore_on_resume: frozenset[str] = frozenset(),
    ) -> tuple[RunDir, bool]:
        """Open ``path`` for the run of ``config``; return it and whether it resumes a run.

        A directory holding a run is resumed (``"resume"``: only when its ``config.json``
        equals this config, top-level fields in ``ignore_on_resume`` aside), refused
        (``"refuse"``), or emptied of the run's files and started afresh (``"overwrite"``).
        Nothing is ever asked interactively. Raises :class:`RunExistsError`.

        The returned run directory holds its lock (one writer at a time; :meth:`close` releases
        it): a run directory in use by another process raises :class:`RunLockedError`.
        """
        run = cls(path)
        new_json = config_to_json(config)
        require_directory(run.path, "run directory", "--run.log-dir")
        run.lock()
        _OPENED.setdefault(run.path.resolve(), run)
        try:
            resumed = run._open(new_json, if_exists, ignore_on_resume)
        except BaseException:
            run.close()
            raise
        return run, resumed

    def _open(self, new_json: dict[str, Any], if_exists: IfExists, ignore_on_resume: frozenset[str]) -> bool:
        if self.exists():
            if if_exists == "refuse":
                raise RunExistsError(
                    f"{self.path} already holds a run; pass --run.if-exists resume to continue it, "
                    "or --run.if-exists overwrite to start again"
                )
            if if_exists == "resume":
                old_json = self.read_config()
                diff = sorted(
                    k
                    for k in (set(old_json) | set(new_json)) - {_FILES_KEY}
                    if k not in ignore_on_resume and old_json.get(k) != new_json.get(k)
                )
                extended = [k for k in diff if _extends(k, old_json.get(k), new_json.get(k))]
                rest = [k for k in diff if k not in extended]
                if rest:
                    changes = "; ".join(
                        f"{k}: {_short(old_json.get(k))} -> {_short(new_json.get(k))}" for k in rest
                    )
                    raise RunExistsError(
                        f"{self.path} holds a run with a different config (fields {changes}); only a "
                        f"larger {' / '.join(sorted(EXTENDABLE))} may change on resume; use another "
                        f"log directory (--run.log-dir), or {_OVERWRITE}"
                    )
                _check_data_files(self.config_path, old_json.get(_FILES_KEY))
                if extended:  # a longer run: record the new length, so later resumes compare to it
                    new_json[_FILES_KEY] = old_json.get(_FILES_KEY)
                    _write_atomic(self.config_path, json.dumps(new_json, indent=2) + "\n")
                return True
            for name in _RUN_FILES:
                (self.path / name).unlink(missing_ok=True)
            for folder in _RUN_FOLDERS:
                shutil.rmtree(self.path / folder, ignore_errors=True)
        new_json[_FILES_KEY] = _data_files(new_json, ignore_on_resume)
        _write_atomic(self.config_path, json.dumps(new_json, indent=2) + "\n")
        return False

    def read_config(self) -> dict[str, Any]:
        """``config.json``; :class:`RunDirCorruptError` naming the file and line if it is not JSON."""
        text = self.config_path.read_text(encoding="utf-8", errors="replace")
        return _parse_json(self.config_path, text, damage="the run's config is corrupt")

    # ---- metrics -----------------------------------------------------------------------------

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every complete line of ``metrics.jsonl``; a ``null`` value (a metric that was NaN or
        infinite, see :meth:`append_metrics`) is read back as NaN."""
        return [
            {k: math.nan if v is None else v for k, v in m.items()} for m in _read_jsonl(self.metrics_path)
        ]

    def append_metrics(self, line: Mapping[str, Any]) -> None:
        """Append one step's line (flushed and synced before returning).

        The file stays strict JSON: a NaN or infinite value is written as ``null``, with a
        WARNING naming the metric and the step the first time each metric is not finite
        (``NaN`` / ``Infinity`` are not JSON, and a diverged run must not look like a quiet one).
        """
        bad = sorted(k for k, v in line.items() if isinstance(v, float) and not math.isfinite(v))
        new = [k for k in bad if k not in self._warned_non_finite]
        if new:
            self._warned_non_finite.update(new)
            _log.warning(
                "%s step %s: %s not finite (%s); written as null (reported once per metric)",
                self.metrics_path,
                line.get("step", "?"),
                ", ".join(new),
                ", ".join(f"{k}={line[k]}" for k in new),
            )
        with naming(self.metrics_path), self.metrics_path.open("a") as f:
            f.write(_metrics_json(line) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def truncate_metrics(self, steps_done: int) -> None:
        """Keep the lines of steps ``0..steps_done-1`` only (and drop a torn last line)."""
        kept = [m for m in self.read_metrics() if int(m["step"]) < steps_done]
        _write_atomic(self.metrics_path, "".join(_metrics_json(m) + "\n" for m in kept))

    # ---- checkpoint index ----------------------------------------------------------------------

    def checkpoints(self) -> list[CheckpointRecord]:
        """The checkpoint index, oldest first."""
        return [CheckpointRecord.from_json(r) for r in _read_jsonl(self.index_path)]

    def last_checkpoint(self) -> CheckpointRecord | None:
        records = self.checkpoints()
        return records[-1] if records else None

    def unreadable_checkpoint(self, record: CheckpointRecord, exc: BaseException) -> RunDirCorruptError:
        """The error for a recorded checkpoint that cannot be loaded (missing, truncated): it
        names the index line and the path, and how to resume from the previous checkpoint."""
        records = self.checkpoints()
        line = next((i for i, r in enumerate(records, start=1) if r == record), len(records))
        where = f"{self.index_path}:{line}"
        text = (
            f"{where}: checkpoint {record.name!r} (step {record.step}, {record.state_path}) cannot be "
            f"loaded ({type(exc).__name__}: {exc}). "
        )
        if line >= 2:
            previous = records[line - 2]
            text += (
                f"To resume from the previous checkpoint {previous.name!r} (step {previous.step}), delete "
                f"line {line} of {self.index_path} and run again (steps {previous.step}.."
                f"{record.step - 1} are trained again); or {_OVERWRITE}"
            )
        else:
            text += f"No earlier checkpoint is recorded: {_OVERWRITE}"
        return RunDirCorruptError(text)

    def add_checkpoint(self, record: CheckpointRecord) -> None:
        """Add ``record`` to the index (the whole index is rewritten atomically)."""
        records = [r for r in self.checkpoints() if r.name != record.name]
        records.append(record)
        self.replace_checkpoints(records)

    def replace_checkpoints(self, records: list[CheckpointRecord]) -> None:
        """Rewrite the index to hold exactly ``records`` (atomically; used by pruning)."""
        _write_atomic(self.index_path, "".join(json.dumps(r.to_json()) + "\n" for r in records))

    # ---- run state -----------------------------------------------------------------------------

    def read_state(self) -> dict[str, Any]:
        """The values recorded with :meth:`update_state` (empty for a new run)."""
        if not self.state_path.is_file():
            return {}
        return cast("dict[str, Any]", json.loads(self.state_path.read_text()))

    def update_state(self, **values: Any) -> None:
        """Record values that must survive a resume (written atomically)."""
        state = self.read_state() | values
        _write_atomic(self.state_path, json.dumps(state, indent=2) + "\n")
