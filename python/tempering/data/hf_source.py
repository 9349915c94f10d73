"""``hf:`` data paths: chat (SFT) and preference (DPO) rows from a Hugging Face dataset.

Wherever a data file path is accepted (``tempering sft --data.path``, ``ChatSource``,
``load_chat``, ``load_comparisons``, ``tempering dpo --data.path``), ``hf:NAME[:split]`` reads
the rows through ``datasets.load_dataset`` instead (:func:`tempering.data.hub.hub_rows`):
``NAME`` is a hub name (``hf:HuggingFaceH4/no_robots:train``), a local dataset directory or
file (``hf:/data/my_copy:test``), or a builder name whose ``data_files`` are given in the
column mapping's ``data_files=`` entry (``hf:json``). The split defaults to ``train``.

A column mapping renames the dataset's columns to the fields tempering reads, as
``field=column`` pairs separated by commas (a ``Mapping`` in Python):

=============== ============================================================================
chat rows       ``messages`` (a list of ``{"role", "content"}``), or ``prompt`` and
                ``completion`` (strings: one user and one assistant message; an optional
                ``system``)
preference rows ``prompt``, ``chosen``, ``rejected`` (strings or message lists), or
                ``prompt_conversation``, ``completion_A``, ``completion_B``, ``label``
other keys      ``config=NAME`` (the dataset's config), ``data_files=PATH``
=============== ============================================================================

A malformed row raises :class:`~tempering.data.DataError` naming the dataset, the row and the
field, like a local file.

Example::

    load_chat("hf:HuggingFaceH4/no_robots:train")
    load_chat("hf:openai/gsm8k:train", columns="prompt=question,completion=answer,config=main")
    load_comparisons("hf:json", columns="data_files=pairs.jsonl,chosen=good,rejected=bad")
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeAlias, TypeVar

import attrs

from tempering.data._parse import Conversation, parse_chat_row, parse_comparison_row
from tempering.data._rows import BadRows, DataError, RowError
from tempering.data.hub import hub_rows
from tempering.data.named import is_named, named_rows

__all__ = [
    "HF_PREFIX",
    "Columns",
    "HFSource",
    "is_hf",
    "parse_columns",
    "parse_hf_rows",
    "parse_mapped_chat_row",
]

HF_PREFIX = "hf:"
"""A data path starting with this names a Hugging Face dataset."""

Columns: TypeAlias = "str | Mapping[str, str] | None"
"""A column mapping: ``"field=column,..."``, a mapping, or None (the columns are the fields)."""

_T = TypeVar("_T")
_OPTIONS = ("config", "data_files")


def is_hf(path: str | os.PathLike[str]) -> bool:
    """Whether a data path is an ``hf:`` dataset, or a ``named:`` one
    (:mod:`tempering.data.named`, also read through ``datasets``)."""
    return os.fspath(path).startswith(HF_PREFIX) or is_named(os.fspath(path))


def parse_columns(columns: Columns) -> dict[str, str]:
    """``"prompt=question,completion=answer"`` → ``{"prompt": "question", "completion": "answer"}``.

    Example::

        parse_columns("messages=conversations")   # {"messages": "conversations"}
    """
    if columns is None:
        return {}
    if not isinstance(columns, str):
        return dict(columns)
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in columns.split(","))):
        field, sep, column = part.partition("=")
        if not sep or not field.strip() or not column.strip():
            raise ValueError(f"column mapping {columns!r}: {part!r} is not field=column")
        out[field.strip()] = column.strip()
    return out


@attrs.frozen
class HFSource:
    """A parsed ``hf:NAME[:split]`` path with its column mapping.

    Example::

        HFSource.parse("hf:openai/gsm8k:test", "config=main,prompt=question")
        # HFSource(name='openai/gsm8k', split='test', columns={'prompt': 'question'}, config='main')
    """

    name: str
    split: str = "train"
    columns: Mapping[str, str] = attrs.field(factory=dict[str, str])
    config: str | None = None
    data_files: str | None = None

    @classmethod
    def parse(cls, path: str | os.PathLike[str], columns: Columns = None) -> HFSource:
        text = os.fspath(path)
        if not is_hf(text):
            raise ValueError(f"{text!r} is not an hf: path (hf:NAME[:split])")
        body = text[len(HF_PREFIX) :]
        name, sep, split = body.rpartition(":")
        if not sep or not split or "/" in split or not name:
            name, split = body, "train"
        if not name:
            raise ValueError(f"{text!r}: no dataset name (hf:NAME[:split])")
        mapping = parse_columns(columns)
        options = {k: mapping.pop(k) for k in _OPTIONS if k in mapping}
        return cls(name, split, mapping, options.get("config"), options.get("data_files"))

    @property
    def label(self) -> str:
        """How rows of this source are named in errors: ``hf:NAME [split]``."""
        return f"{HF_PREFIX}{self.name} [{self.split}]"

    def rows(self, *, streaming: bool = True) -> Iterator[dict[str, object]]:
        """The rows with the mapped columns renamed to their fields."""
        renamed = {column: field for field, column in self.columns.items()}
        for row in hub_rows(
            self.name, split=self.split, config=self.config, data_files=self.data_files, streaming=streaming
        ):
            yield {renamed.get(k, k): v for k, v in row.items()}


def parse_mapped_chat_row(row: object) -> Conversation:
    """A chat row after renaming: ``messages``, or ``prompt`` + ``completion`` (+ ``system``)
    built into messages; the conversation (:func:`~tempering.data.parse_chat_row`)."""
    if isinstance(row, Mapping) and "messages" not in row and ("prompt" in row or "completion" in row):
        fields: Mapping[str, object] = row  # pyright: ignore[reportUnknownVariableType]
        messages: list[object] = []
        system = fields.get("system")
        if isinstance(system, str) and system:
            messages.append({"role": "system", "content": system})
        for key, role in (("prompt", "user"), ("completion", "assistant")):
            value = fields.get(key)
            if isinstance(value, str):
                messages.append({"role": role, "content": value})
            elif isinstance(value, list):
                messages.extend(value)  # pyright: ignore[reportUnknownArgumentType]
            else:
                raise RowError(f"field {key!r} is {value!r}, not a string or a list of messages")
        return parse_chat_row({"messages": messages})
    return parse_chat_row(row)


def parse_hf_rows(
    path: str | os.PathLike[str],
    parse: Callable[[object], _T],
    *,
    columns: Columns = None,
    skip_bad_rows: bool = False,
    bad_rows: BadRows | None = None,
    streaming: bool = True,
) -> Iterator[tuple[str, _T]]:
    """Like :func:`~tempering.data.parse_rows` for an ``hf:`` path: ``(origin, item)`` for
    every row, ``origin`` being ``"hf:NAME [split]: row N"``.

    Example::

        for where, convo in parse_hf_rows("hf:json", parse_mapped_chat_row,
                                          columns="data_files=chat.jsonl"):
            ...
    """
    if is_named(os.fspath(path)):
        yield from _parse_named_rows(os.fspath(path), parse, columns, skip_bad_rows, bad_rows)
        return
    source = HFSource.parse(path, columns)
    numbered = enumerate(source.rows(streaming=streaming), start=1)
    yield from _parse_numbered(source.label, numbered, parse, skip_bad_rows, bad_rows)


def _parse_named_rows(
    path: str,
    parse: Callable[[object], _T],
    columns: Columns,
    skip_bad_rows: bool,
    bad_rows: BadRows | None,
) -> Iterator[tuple[str, _T]]:
    """A ``named:`` dataset's rows (``source=PATH`` in ``columns``: a local copy), converted to
    tempering rows and parsed; a malformed row is a DataError naming the source and the row."""
    options = parse_columns(columns)
    unknown = sorted(set(options) - {"source"})
    if unknown:
        raise ValueError(f"{path}: a named dataset takes only source=PATH, not {', '.join(unknown)}")
    source = options.get("source")
    kind = "comparison" if parse is parse_comparison_row else "chat"
    label = f"{path} ({source})" if source else path
    numbered = ((number, row) for number, row in named_rows(path, kind, source) if row is not None)
    yield from _parse_numbered(label, numbered, parse, skip_bad_rows, bad_rows)


def _parse_numbered(
    label: str,
    numbered: Iterable[tuple[int, object]],
    parse: Callable[[object], _T],
    skip_bad_rows: bool,
    bad_rows: BadRows | None,
) -> Iterator[tuple[str, _T]]:
    """``("<label>: row N", item)`` for each numbered row that ``parse`` accepts; a row it rejects
    (or a row that comes as its :class:`RowError`) is a DataError naming ``label`` and the row,
    or, with ``skip_bad_rows``, is counted in ``bad_rows`` and skipped."""
    for number, row in numbered:
        try:
            if isinstance(row, RowError):
                raise row
            item = parse(row)
        except RowError as exc:
            err = DataError(label, number, str(exc), unit="row")
            if not skip_bad_rows:
                raise err from None
            if bad_rows is not None:
                bad_rows.add(err)
            continue
        yield f"{label}: row {number}", item
