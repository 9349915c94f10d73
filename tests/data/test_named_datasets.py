"""Named datasets (``named:NAME``): each schema read from a local copy in the hub layout, the rows
each dataset leaves out, and malformed rows named by source, row and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tempering.data import DataError, load_chat
from tempering.data.named import NAMED_DATASETS
from tempering.data.preference import ComparisonDatasetBuilder, load_comparisons

NAMED = Path(__file__).parent / "hub_fixtures" / "named"


def _pairs(name: str) -> list[tuple[list[Any], str, str, str]]:
    data = load_comparisons(f"named:{name}", columns=f"source={NAMED / (name + '.jsonl')}")
    out: list[tuple[list[Any], str, str, str]] = []
    for item in data.items:
        c = item.comparison
        (a,), (b,) = c.completion_A, c.completion_B
        assert a["role"] == b["role"] == "assistant"
        out.append(
            (
                [(m["role"], m["content"]) for m in c.prompt_conversation],
                a["content"],
                b["content"],
                item.label,
            )
        )
    return out


def test_sft_datasets_read_their_messages() -> None:
    tulu = load_chat("named:tulu3", columns=f"source={NAMED / 'tulu3.jsonl'}")
    assert [[m["role"] for m in c] for c in tulu.items] == [
        ["user", "assistant"],
        ["system", "user", "assistant"],
    ]
    robots = load_chat("named:no_robots:test", columns=f"source={NAMED / 'no_robots.jsonl'}")
    assert robots.items[0][1]["content"].startswith("Steam curls")
    assert robots.origins[0].startswith("named:no_robots:test (")


def test_each_preference_schema_becomes_labeled_comparisons() -> None:
    assert _pairs("hhh") == [
        ([("user", "What is the capital of France?")], "Paris.", "I don't know.", "A"),
        (
            [("user", "Hi"), ("assistant", "Hello!"), ("user", "Tell me a joke.")],
            "Why did the chicken cross the road? To get to the other side.",
            "No.",
            "A",
        ),
    ]
    # the most helpful response of a prompt against the least; equal scores are left out
    assert _pairs("helpsteer2") == [
        (
            [("user", "Explain gravity.")],
            "Gravity is the attraction between masses; on Earth it pulls objects toward the centre.",
            "Mass attracts mass.",
            "A",
        )
    ]
    # overall_preference < 0 prefers response1 (A), > 0 response2 (B); 0 (a tie) is left out
    assert _pairs("helpsteer3") == [
        ([("user", "Suggest a name for a cat.")], "Whiskers.", "Dog.", "A"),
        ([("user", "Reverse a list in Python.")], "Use a loop.", "xs[::-1]", "B"),
    ]
    assert _pairs("ultrafeedback") == [([("user", "Give a synonym of happy.")], "Joyful.", "Sad.", "A")]
    # a tie and a conversation with an image are left out
    assert _pairs("arena") == [([("user", "What is 3*3?")], "6", "9", "B")]
    assert _pairs("tulu3_preferences") == [([("user", "Capital of Italy?")], "Rome.", "Milan.", "A")]


def test_the_dpo_builder_takes_a_named_path() -> None:
    train, test = ComparisonDatasetBuilder(
        path="named:helpsteer3", columns=f"source={NAMED / 'helpsteer3.jsonl'}", batch_size=1, test_size=1
    )()
    assert len(train.get_batch(0)) == 1
    assert test is not None


@pytest.mark.parametrize(
    ("name", "row", "message"),
    [
        (
            "tulu3",
            {"id": "x", "messages": [{"role": "user"}]},
            r"field 'messages': message 0 must have a role and a content",
        ),
        (
            "hhh",
            {"chosen": "just text", "rejected": "\n\nHuman: hi\n\nAssistant: no"},
            r"field 'chosen': not a",
        ),
        (
            "hhh",
            {"chosen": "\n\nHuman: a\n\nAssistant: x", "rejected": "\n\nHuman: b\n\nAssistant: y"},
            r"differ before their last Assistant turn",
        ),
        (
            "helpsteer2",
            {"prompt": "p", "response": "r", "helpfulness": "high"},
            r"field 'helpfulness' must be a number",
        ),
        (
            "helpsteer3",
            {"context": [{"role": "user", "content": "q"}], "response1": "a", "response2": "b"},
            r"field 'overall_preference' must be a number, got None",
        ),
        (
            "ultrafeedback",
            {"instruction": "q", "chosen_response": "", "rejected_response": "b"},
            r"field 'chosen_response' must be non-empty",
        ),
        (
            "arena",
            {"winner": "model_a", "conversation_a": [], "conversation_b": []},
            r"field 'conversation_a' must be a non-empty list",
        ),
        (
            "tulu3_preferences",
            {
                "prompt": "q",
                "chosen": [{"role": "user", "content": "q"}],
                "rejected": [{"role": "assistant", "content": "b"}],
            },
            r"must end with an assistant message",
        ),
    ],
)
def test_a_malformed_row_names_the_source_the_row_and_the_field(
    tmp_path: Path, name: str, row: dict[str, Any], message: str
) -> None:
    good = (NAMED / f"{name}.jsonl").read_text().splitlines()[0]
    path = tmp_path / f"{name}.jsonl"
    path.write_text(good + "\n" + json.dumps(row) + "\n")
    load = load_chat if NAMED_DATASETS[name].kind == "chat" else load_comparisons
    with pytest.raises(DataError, match=rf"named:{name} \(.*{name}\.jsonl\): row 2: .*{message}") as err:
        load(f"named:{name}", columns=f"source={path}")
    assert err.value.line == 2
    kept = load(f"named:{name}", columns=f"source={path}", skip_bad_rows=True)
    assert len(kept.items) == (0 if name == "helpsteer2" else 1)  # one helpsteer2 row makes no pair
    assert kept.bad_rows.count == 1


def test_bad_names_splits_and_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown named dataset 'tulu4'; known: tulu3, no_robots, hhh"):
        load_chat("named:tulu4")
    with pytest.raises(ValueError, match=r"no_robots has splits train, test, not 'dev'"):
        load_chat("named:no_robots:dev")
    with pytest.raises(ValueError, match=r"'named:hhh' is a comparison dataset: use it as a preference"):
        load_chat("named:hhh", columns=f"source={NAMED / 'hhh.jsonl'}")
    with pytest.raises(ValueError, match=r"'named:tulu3' is a chat dataset: use it as a chat \(SFT\)"):
        load_comparisons("named:tulu3", columns=f"source={NAMED / 'tulu3.jsonl'}")
    with pytest.raises(ValueError, match=r"takes only source=PATH, not config"):
        load_chat("named:tulu3", columns="config=x")
