"""Named datasets: the standard SFT and preference sources by name, each with its own schema.

A data path ``named:NAME[:split]`` reads one of :data:`NAMED_DATASETS` from the Hugging Face hub
(through ``datasets.load_dataset``, :func:`tempering.data.hub.hub_rows`) and turns each row into
a conversation (SFT) or a labeled comparison (DPO, reward models), wherever a data path is
accepted (``tempering sft --data.path named:no_robots``, ``tempering dpo --data.path named:hhh``,
``load_chat``, ``load_comparisons``). The column mapping's ``source=PATH`` entry reads a local
copy in the hub schema instead (a file or a dataset directory), e.g. for offline tests.

- ``tulu3`` (SFT): ``allenai/tulu-3-sft-mixture`` (train); ``messages``.
- ``no_robots`` (SFT): ``HuggingFaceH4/no_robots`` (train, test); ``messages``.
- ``hhh`` (preference): ``Anthropic/hh-rlhf`` (train, test); ``chosen`` / ``rejected`` transcripts
  (``\n\nHuman: …\n\nAssistant: …``): the shared turns are the prompt, the last Assistant turns
  the completions (chosen is A).
- ``helpsteer2`` (preference): ``nvidia/HelpSteer2`` (train, validation); ``prompt``, ``response``,
  ``helpfulness``: the most helpful response of a prompt (A) against the least (equal: left out).
- ``helpsteer3`` (preference): ``nvidia/HelpSteer3`` (config ``preference``; train, validation);
  ``context`` (messages), ``response1``, ``response2``, ``overall_preference`` (< 0: response1
  is preferred, > 0: response2, 0: left out).
- ``ultrafeedback`` (preference): ``argilla/ultrafeedback-binarized-preferences`` (train);
  ``instruction``, ``chosen_response`` (A), ``rejected_response``.
- ``arena`` (preference): ``lmarena-ai/arena-human-preference-140k`` (train); ``conversation_a``
  / ``conversation_b`` (content parts of type ``text``), ``winner`` (``model_a`` / ``model_b``;
  ties and conversations with non-text parts are left out); the first user message is the prompt.
- ``tulu3_preferences`` (preference): ``allenai/llama-3.1-tulu-3-8b-preference-mixture`` (train);
  ``prompt``, ``chosen`` / ``rejected`` (messages; the last, an assistant message, is the
  completion; chosen is A).

A malformed row raises :class:`~tempering.data.DataError` naming the source, the row and the
field (``named:hhh [train]: row 7: field 'chosen': ...``).

Example::

    load_chat("named:no_robots:test")
    load_comparisons("named:helpsteer3", columns="source=fixtures/helpsteer3.jsonl")
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Literal, TypeAlias

import attrs

from tempering.data._rows import RowError
from tempering.data.hub import hub_rows

__all__ = ["NAMED_DATASETS", "NAMED_PREFIX", "NamedDataset", "is_named", "named_rows"]

NAMED_PREFIX = "named:"
"""A data path starting with this names one of :data:`NAMED_DATASETS`."""

Row: TypeAlias = Mapping[str, object]
Converted: TypeAlias = "dict[str, object] | RowError | None"
Convert: TypeAlias = Callable[[Row], "dict[str, object] | None"]
"""A hub row → a tempering row (``{"messages"}`` or ``{"prompt_conversation", "completion_A",
"completion_B", "label"}``), or None for a row the dataset's definition leaves out."""


@attrs.frozen
class NamedDataset:
    """A named source: hub name, config, splits, kind, and how a row becomes a tempering row.
    ``pairs``: the rows are grouped (HelpSteer2: by prompt) instead of converted one by one."""

    name: str
    hub: str
    kind: Literal["chat", "comparison"]
    splits: tuple[str, ...]
    convert: Convert | None = None
    config: str | None = None
    pairs: Callable[[Iterator[tuple[int, Row]]], Iterator[tuple[int, Converted]]] | None = None


def _field(row: Row, key: str) -> object:
    if key not in row:
        raise RowError(f"missing field {key!r} (the row has {sorted(row)})")
    return row[key]


def _text(row: Row, key: str) -> str:
    value = _field(row, key)
    if not isinstance(value, str) or not value.strip():
        raise RowError(f"field {key!r} must be non-empty text, got {value!r}")
    return value


def _messages(row: Row, key: str) -> list[dict[str, object]]:
    value = _field(row, key)
    if not isinstance(value, list) or not value:
        raise RowError(f"field {key!r} must be a non-empty list of messages, got {value!r}")
    out: list[dict[str, object]] = []
    for i, message in enumerate(value):  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise RowError(f"field {key!r}: message {i} must have a role and a content, got {message!r}")
        out.append({"role": message["role"], "content": message["content"]})
    return out


def _reply(text: str) -> list[dict[str, object]]:
    return [{"role": "assistant", "content": text}]


def _comparison(
    prompt: Sequence[Mapping[str, object]], a: object, b: object, label: str
) -> dict[str, object]:
    return {"prompt_conversation": prompt, "completion_A": a, "completion_B": b, "label": label}


def _chat(row: Row) -> dict[str, object]:
    return {"messages": _messages(row, "messages")}


_TURN = re.compile(r"\n\n(Human|Assistant): ")


def _transcript(row: Row, key: str) -> list[dict[str, object]]:
    text = _text(row, key)
    parts = _TURN.split("\n\n" + text.lstrip("\n") if not text.startswith("\n\n") else text)
    if parts[0].strip() or len(parts) < 3:
        raise RowError(f"field {key!r}: not a '\\n\\nHuman: ... \\n\\nAssistant: ...' transcript")
    roles = {"Human": "user", "Assistant": "assistant"}
    turns: list[dict[str, object]] = [
        {"role": roles[parts[i]], "content": parts[i + 1].strip()} for i in range(1, len(parts), 2)
    ]
    if turns[-1]["role"] != "assistant":
        raise RowError(f"field {key!r}: the transcript does not end with an Assistant turn")
    return turns


def _hhh(row: Row) -> dict[str, object]:
    chosen, rejected = _transcript(row, "chosen"), _transcript(row, "rejected")
    if chosen[:-1] != rejected[:-1]:
        raise RowError("fields 'chosen' and 'rejected' differ before their last Assistant turn")
    return _comparison(chosen[:-1], chosen[-1:], rejected[-1:], "A")


def _helpsteer3(row: Row) -> dict[str, object] | None:
    preference = _field(row, "overall_preference")
    if isinstance(preference, bool) or not isinstance(preference, int | float):
        raise RowError(f"field 'overall_preference' must be a number, got {preference!r}")
    context = _messages(row, "context")
    a, b = _reply(_text(row, "response1")), _reply(_text(row, "response2"))
    return None if preference == 0 else _comparison(context, a, b, "A" if preference < 0 else "B")


def _ultrafeedback(row: Row) -> dict[str, object]:
    prompt = [{"role": "user", "content": _text(row, "instruction")}]
    return _comparison(
        prompt, _reply(_text(row, "chosen_response")), _reply(_text(row, "rejected_response")), "A"
    )


def _tulu3_preference(row: Row) -> dict[str, object]:
    chosen, rejected = _messages(row, "chosen"), _messages(row, "rejected")
    if chosen[-1]["role"] != "assistant" or rejected[-1]["role"] != "assistant":
        raise RowError("fields 'chosen' and 'rejected' must end with an assistant message")
    prompt = [{"role": "user", "content": _text(row, "prompt")}]
    return _comparison(prompt, chosen[-1:], rejected[-1:], "A")


def _arena_turns(row: Row, key: str) -> list[dict[str, object]] | None:
    out: list[dict[str, object]] = []
    for i, message in enumerate(_messages(row, key)):
        content = message["content"]
        parts: list[object]
        if isinstance(content, str):
            parts = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            parts = list(content)  # pyright: ignore[reportUnknownArgumentType]
        else:
            raise RowError(f"field {key!r}: message {i}: content must be text or a list of parts")
        texts: list[str] = []
        for part in parts:
            if not isinstance(part, Mapping) or part.get("type") != "text":  # pyright: ignore[reportUnknownMemberType]
                return None  # an image or other non-text part: left out
            texts.append(str(part.get("text") or ""))  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
        out.append({"role": message["role"], "content": " ".join(texts)})
    return out


def _arena(row: Row) -> dict[str, object] | None:
    winner = _field(row, "winner")
    if winner not in ("model_a", "model_b"):
        return None  # a tie
    a, b = _arena_turns(row, "conversation_a"), _arena_turns(row, "conversation_b")
    if a is None or b is None:
        return None
    for key, turns in (("conversation_a", a), ("conversation_b", b)):
        if len(turns) < 2 or turns[0]["role"] != "user" or turns[-1]["role"] != "assistant":
            raise RowError(f"field {key!r}: a user message first and an assistant message last")
    return _comparison(a[:1], a[1:], b[1:], "A" if winner == "model_a" else "B")


def _helpsteer2_pairs(rows: Iterator[tuple[int, Row]]) -> Iterator[tuple[int, Converted]]:
    by_prompt: dict[str, list[tuple[float, int, str]]] = {}
    for number, row in rows:
        try:
            prompt, response = _text(row, "prompt"), _text(row, "response")
            score = _field(row, "helpfulness")
            if isinstance(score, bool) or not isinstance(score, int | float):
                raise RowError(f"field 'helpfulness' must be a number, got {score!r}")
        except RowError as exc:
            yield number, exc
            continue
        by_prompt.setdefault(prompt, []).append((float(score), number, response))
    for prompt, responses in by_prompt.items():
        best = max(responses, key=lambda r: (r[0], -r[1]))
        worst = min(responses, key=lambda r: (r[0], r[1]))
        if best[0] > worst[0]:
            user = [{"role": "user", "content": prompt}]
            yield best[1], _comparison(user, _reply(best[2]), _reply(worst[2]), "A")


NAMED_DATASETS: dict[str, NamedDataset] = {
    d.name: d
    for d in (
        NamedDataset("tulu3", "allenai/tulu-3-sft-mixture", "chat", ("train",), _chat),
        NamedDataset("no_robots", "HuggingFaceH4/no_robots", "chat", ("train", "test"), _chat),
        NamedDataset("hhh", "Anthropic/hh-rlhf", "comparison", ("train", "test"), _hhh),
        NamedDataset(
            "helpsteer2", "nvidia/HelpSteer2", "comparison", ("train", "validation"), pairs=_helpsteer2_pairs
        ),
        NamedDataset(
            "helpsteer3",
            "nvidia/HelpSteer3",
            "comparison",
            ("train", "validation"),
            _helpsteer3,
            config="preference",
        ),
        NamedDataset(
            "ultrafeedback",
            "argilla/ultrafeedback-binarized-preferences",
            "comparison",
            ("train",),
            _ultrafeedback,
        ),
        NamedDataset("arena", "lmarena-ai/arena-human-preference-140k", "comparison", ("train",), _arena),
        NamedDataset(
            "tulu3_preferences",
            "allenai/llama-3.1-tulu-3-8b-preference-mixture",
            "comparison",
            ("train",),
            _tulu3_preference,
        ),
    )
}
"""The named datasets (see the module docstring for their schemas)."""


def is_named(path: str) -> bool:
    """Whether a data path is a ``named:`` dataset."""
    return path.startswith(NAMED_PREFIX)


def parse_named(path: str) -> tuple[NamedDataset, str]:
    """``named:NAME[:split]`` → (the dataset, the split; default its first)."""
    body = path[len(NAMED_PREFIX) :]
    name, _, split = body.partition(":")
    if name not in NAMED_DATASETS:
        raise ValueError(f"{path!r}: unknown named dataset {name!r}; known: {', '.join(NAMED_DATASETS)}")
    dataset = NAMED_DATASETS[name]
    split = split or dataset.splits[0]
    if split not in dataset.splits:
        raise ValueError(f"{path!r}: {name} has splits {', '.join(dataset.splits)}, not {split!r}")
    return dataset, split


def named_rows(
    path: str, kind: Literal["chat", "comparison"], source: str | None = None
) -> Iterator[tuple[int, Converted]]:
    """``(row number, tempering row)`` for each row of ``named:NAME[:split]`` (``source``: a local
    copy in the hub schema); a malformed row comes as its :class:`RowError`, a row the dataset
    leaves out as None. ``kind`` is what the caller reads; a dataset of the other kind is refused."""
    dataset, split = parse_named(path)
    if dataset.kind != kind:
        use = (
            "a chat (SFT) data path"
            if dataset.kind == "chat"
            else "a preference (DPO, reward model) data path"
        )
        raise ValueError(f"{path!r} is a {dataset.kind} dataset: use it as {use}")
    if source is not None:
        rows = hub_rows(source, split=split, streaming=False)
    else:
        rows = hub_rows(dataset.hub, split=split, config=dataset.config, streaming=False)
    numbered = enumerate(rows, start=1)
    if dataset.pairs is not None:
        yield from dataset.pairs(numbered)
        return
    assert dataset.convert is not None
    for number, row in numbered:
        try:
            yield number, dataset.convert(row)
        except RowError as exc:
            yield number, exc
