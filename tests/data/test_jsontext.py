"""``loads_object``: text that must be one JSON object, and why it is not."""

from __future__ import annotations

import pytest

from tempering.data.jsontext import NotJSONObjectError, loads_object


def test_an_object_is_read() -> None:
    assert loads_object('{"a": [1, 2], "b": {"c": null}}') == {"a": [1, 2], "b": {"c": None}}


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("[1]", "a list"),
        ('"x"', "a string"),
        ("3", "a number"),
        ("2.5", "a number"),
        ("true", "a boolean"),
        ("null", "null"),
    ],
)
def test_another_json_value_is_named(text: str, kind: str) -> None:
    with pytest.raises(NotJSONObjectError) as exc:
        loads_object(text)
    assert str(exc.value) == f"not a JSON object but {kind}"
    assert exc.value.lineno == 1
    assert isinstance(exc.value, ValueError)


def test_malformed_text_gives_the_line_and_column_of_the_error() -> None:
    with pytest.raises(NotJSONObjectError) as exc:
        loads_object('{\n  "a": 1,\n  "b": ?\n}')
    assert str(exc.value) == "not valid JSON (Expecting value at column 8)"
    assert exc.value.lineno == 3
