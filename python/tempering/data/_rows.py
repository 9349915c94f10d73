"""Reading rows from local files, with errors that name the file and line.

JSONL is read here, line by line (so an invalid line is reported, or skipped, by number);
``json``, ``parquet`` and ``arrow`` files go through Hugging Face ``datasets`` (imported only
then), read as a stream so nothing is cached on disk.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, Literal, TypeAlias, TypeVar

import attrs

from tempering.data.jsontext import JSONNestingError, loads_bounded
from tempering.fs import path_kind

__all__ = [
    "MAX_LINE_BYTES",
    "BadRows",
    "DataError",
    "Format",
    "RowError",
    "check_max_length",
    "infer_format",
    "parse_rows",
]

_T = TypeVar("_T")

Format: TypeAlias = Literal["jsonl", "json", "parquet", "arrow"]
"""``jsonl``: read by tempering, line by line. The others: read through Hugging Face ``datasets``."""

_SUFFIXES: dict[str, Format] = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}

log = logging.getLogger("tempering.data")


class RowError(ValueError):
    """A row that does not have the expected shape (raised by row parsers, without a location)."""


class DataError(ValueError):
    """A malformed row or unreadable file; the message starts with ``path:line``.

    ``line`` is the 1-based line of a JSONL file, or the 1-based row of another format
    (``None`` when the whole file is unreadable).

    Example::

        try:
            load_chat("chat.jsonl")
        except DataError as err:
            str(err)   # "chat.jsonl:17: message 1 has no role (a non-empty string)"
            err.line   # 17
    """

    path: str
    line: int | None
    reason: str

    def __init__(self, path: str, line: int | None, reason: str, *, unit: str = "line") -> None:
        where = path if line is None else (f"{path}:{line}" if unit == "line" else f"{path}: row {line}")
        super().__init__(f"{where}: {reason}")
        self.path, self.line, self.reason, self.unit = path, line, reason, unit

    def __reduce__(self) -> tuple[Callable[..., DataError], tuple[str, int | None, str, str]]:
        return (_data_error, (self.path, self.line, self.reason, self.unit))

    @property
    def location(self) -> str:
        """``path:line`` (or ``path: row N``), to label the row elsewhere."""
        return str(self).removesuffix(f": {self.reason}")


def _data_error(path: str, line: int | None, reason: str, unit: str) -> DataError:
    return DataError(path, line, reason, unit=unit)


@attrs.define
class BadRows:
    """Rows skipped because of ``skip_bad_rows=True``: how many, and the first few errors.

    Example::

        data = load_chat("chat.jsonl", skip_bad_rows=True)
        data.bad_rows.count        # 3
        data.bad_rows.errors[0]    # DataError("chat.jsonl:17: empty conversation")
    """

    count: int = 0
    errors: list[DataError] = attrs.field(factory=list[DataError])
    keep: int = 20

    def add(self, error: DataError) -> None:
        self.count += 1
        if len(self.errors) < self.keep:
            self.errors.append(error)

    def report(self, path: str) -> None:
        """Log a warning when rows were skipped."""
        if self.count:
            log.warning(
                "%s: skipped %d malformed row(s); first: %s",
                path,
                self.count,
                "; ".join(str(e) for e in self.errors[:3]),
            )


def check_max_length(instance: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    """An attrs validator: ``value`` is ``None`` (no limit) or a token count >= 1.

    Example::

        max_length: int | None = attrs.field(default=None, validator=check_max_length)
    """
    if value is not None and (isinstance(value, bool) or value < 1):
        raise ValueError(
            f"{attribute.name} must be >= 1 (the tokens kept per datum) or None (no limit), got {value}"
        )


def infer_format(path: str | os.PathLike[str], format: Format | None = None) -> Format:
    """The file format: ``format`` if given, else from the suffix.

    Example::

        infer_format("train.parquet")  # "parquet"
    """
    if format is not None:
        if format not in _SUFFIXES.values():
            raise ValueError(f"unknown format {format!r}; known: jsonl, json, parquet, arrow")
        return format
    suffix = Path(path).suffix.lower()
    if suffix not in _SUFFIXES:
        raise ValueError(f"{path}: cannot tell the format from the suffix {suffix!r}; pass format=")
    return _SUFFIXES[suffix]


MAX_LINE_BYTES = 16 * 1024 * 1024
"""The longest JSONL line read (16 MiB): a longer one is a malformed row (refused, or skipped
with ``skip_bad_rows``) before it is parsed, rather than exhausting memory later."""


def _lone_surrogate(value: object) -> str | None:
    """The first string in ``value`` holding a lone surrogate (a ``\\ud800`` escape), if any."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"{item[exc.start]!r} at character {exc.start + 1} of {item[:40]!r}"
        elif isinstance(item, dict):
            stack.extend(item.values())  # pyright: ignore[reportUnknownArgumentType, reportUnknownMemberType]
            stack.extend(item.keys())  # pyright: ignore[reportUnknownArgumentType, reportUnknownMemberType]
        elif isinstance(item, list):
            stack.extend(item)  # pyright: ignore[reportUnknownArgumentType]
    return None


def _read_line(f: BinaryIO) -> tuple[bytes, bool]:
    """The next line (at most ``MAX_LINE_BYTES``; the rest of a longer one is consumed) and
    whether it was longer."""
    line = f.readline(MAX_LINE_BYTES + 1)
    if len(line) <= MAX_LINE_BYTES or line.endswith(b"\n"):
        return line, False
    while True:  # skip the rest of the over-long line without holding it
        rest = f.readline(1024 * 1024)
        if not rest or rest.endswith(b"\n"):
            return line[:MAX_LINE_BYTES], True


def _jsonl_rows(path: str) -> Iterator[tuple[int, object, str | None]]:
    with open(path, "rb") as f:
        number = 0
        while True:
            raw, too_long = _read_line(f)
            if not raw:
                return
            number += 1
            if too_long:
                yield (
                    number,
                    None,
                    (
                        f"the line is longer than {MAX_LINE_BYTES} bytes (tempering.data.MAX_LINE_BYTES); "
                        "a row this long is almost certainly malformed (a missing newline?)"
                    ),
                )
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield (
                    number,
                    None,
                    (
                        f"not UTF-8: byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line "
                        f"({exc.reason}); re-encode the file as UTF-8"
                    ),
                )
                continue
            if not line.strip():
                continue
            try:
                row = loads_bounded(line)
            except json.JSONDecodeError as exc:
                yield number, None, f"invalid JSON ({exc.msg} at column {exc.colno})"
                continue
            except JSONNestingError as exc:
                yield number, None, f"{exc} (tempering.data.jsontext.MAX_JSON_DEPTH)"
                continue
            if "\\u" in line and (bad := _lone_surrogate(row)) is not None:
                yield number, None, f"a lone surrogate escape (not valid Unicode): {bad}"
                continue
            yield number, row, None


def _hf_rows(path: str, format: Format) -> Iterator[tuple[int, object, str | None]]:
    try:
        import datasets  # optional: the `data` extra
        from datasets.exceptions import DatasetsError
    except ImportError as exc:
        raise ImportError(
            f"reading {format} files needs Hugging Face datasets: pip install 'tempering[data]'"
        ) from exc
    try:
        stream = datasets.load_dataset(format, data_files=path, split="train", streaming=True)
        for number, row in enumerate(stream, start=1):
            yield number, row, None
    except (DatasetsError, OSError, ValueError) as exc:
        # Arrow parses a whole block at once: the failing row is not known.
        raise DataError(path, None, f"could not be read as {format} ({type(exc).__name__}: {exc})") from exc


def parse_rows(
    path: str | os.PathLike[str],
    parse: Callable[[object], _T],
    *,
    format: Format | None = None,
    skip_bad_rows: bool = False,
    bad_rows: BadRows | None = None,
) -> Iterator[tuple[str, _T]]:
    """Parse every row of a file, yielding ``(location, item)``.

    A row that is invalid JSON or that ``parse`` rejects with :class:`RowError` raises
    :class:`DataError` naming the file and line, or, with ``skip_bad_rows``, is counted in
    ``bad_rows`` and skipped.

    Example::

        for where, convo in parse_rows("chat.jsonl", parse_chat_row):
            ...  # where == "chat.jsonl:1"
    """
    fmt = infer_format(path, format)
    name = os.fspath(path)
    kind = path_kind(name)
    if kind.startswith("missing"):
        raise FileNotFoundError(errno.ENOENT, f"{name}: no such file ({kind})", name)
    if kind != "a regular file":  # a FIFO would block, a directory reads as "no such file"
        raise DataError(name, None, f"is {kind}, not a regular file; give the path of a data file")
    unit = "line" if fmt == "jsonl" else "row"
    rows = _jsonl_rows(name) if fmt == "jsonl" else _hf_rows(name, fmt)
    for number, row, error in rows:
        if error is None:
            try:
                item = parse(row)
            except RowError as exc:
                error = str(exc)
            else:
                yield (f"{name}:{number}" if unit == "line" else f"{name}: row {number}"), item
                continue
        err = DataError(name, number, error, unit=unit)
        if not skip_bad_rows:
            raise err
        if bad_rows is not None:
            bad_rows.add(err)
