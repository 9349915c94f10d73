"""Each rule of the conformance kit fires on a deliberately broken implementation.

The broken classes live in ``kit_cases_*.py``, one per rule; this module also pins that every
rule in ``RULES`` has such a case and that the kit raises no rule id missing from ``RULES``.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tempering_protocols.testing import RULES, ConformanceError
from tempering_protocols.testing._base import name_of

from . import kit_cases_rl, kit_cases_sandbox, kit_cases_supervised, kit_cases_text

ALL_CASES = [
    *kit_cases_rl.CASES,
    *kit_cases_supervised.CASES,
    *kit_cases_text.CASES,
    *kit_cases_sandbox.CASES,
]
KIT_SOURCE = Path(__file__).parents[2] / "tempering_protocols" / "testing"


def _case_id(case: tuple[str, Callable[[], object], Callable[[object], object]]) -> str:
    rule, make, _ = case
    return f"{rule}-{name_of(make())}"


@pytest.mark.parametrize(("rule", "make", "check"), ALL_CASES, ids=[_case_id(case) for case in ALL_CASES])
def test_rule_fires_on_broken_implementation(
    rule: str, make: Callable[[], object], check: Callable[[object], object]
) -> None:
    subject = make()
    with pytest.raises(ConformanceError) as excinfo:
        check(subject)
    assert excinfo.value.rule == rule
    message = str(excinfo.value)
    assert message.startswith(f"[{rule}] "), message
    assert name_of(subject) in message, f"the message does not name {name_of(subject)}: {message}"


def test_every_rule_has_a_broken_case() -> None:
    tested = {rule for rule, _, _ in ALL_CASES}
    assert sorted(set(RULES) - tested) == []


def test_every_rule_the_kit_raises_is_listed() -> None:
    pattern = re.compile(
        r'"((?:protocol|env|builder|rl-dataset|rl-dataset-builder|supervised|supervised-builder'
        r'|renderer|completer|message-completer|sandbox)/[a-z-]+)"'
    )
    raised = {
        rule
        for path in KIT_SOURCE.glob("*.py")
        if path.name != "_rules.py"
        for rule in pattern.findall(path.read_text())
    }
    assert len(raised) > 40  # the scan found the kit's rule ids
    assert sorted(raised - set(RULES)) == []
    assert sorted(set(RULES) - raised) == []


def test_conformance_error_is_an_assertion_error_that_pickles() -> None:
    err = ConformanceError("env/step-after-done", "MyEnv accepted step() after episode_done")
    assert isinstance(err, AssertionError)
    assert str(err) == "[env/step-after-done] MyEnv accepted step() after episode_done"
    clone = pickle.loads(pickle.dumps(err))
    assert (clone.rule, str(clone)) == (err.rule, str(err))


def test_a_correct_sandbox_passes() -> None:
    kit_cases_sandbox.check_sandbox(kit_cases_sandbox.FakeSandbox())
