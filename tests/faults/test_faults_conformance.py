"""Bug 9: the conformance kit on an env that awaits forever hung; each awaited call now has a
time limit, and a call that does not return fails with a named ``*/timeout`` rule."""

from __future__ import annotations

import math

import pytest
from faults_envs import MisbehavingEnv, MisbehavingGroup

from tempering_protocols.testing import (
    DEFAULT_CALL_TIMEOUT_S,
    RULES,
    ConformanceError,
    call_timeout,
    check_env,
    check_env_group_builder,
)


def test_the_kit_has_a_finite_default_time_limit() -> None:
    assert math.isfinite(DEFAULT_CALL_TIMEOUT_S)
    assert DEFAULT_CALL_TIMEOUT_S > 0
    for rule in ("env/timeout", "builder/timeout", "completer/timeout"):
        assert rule in RULES
    with pytest.raises(ValueError, match="seconds must be a finite number > 0, got 0"), call_timeout(0):
        pass


@pytest.mark.timeout(30)
def test_check_env_on_an_env_that_awaits_forever_names_the_rule() -> None:
    with pytest.raises(ConformanceError) as exc, call_timeout(0.5):
        check_env(MisbehavingEnv("hang"))
    assert exc.value.rule == "env/timeout"
    assert str(exc.value).startswith(
        "[env/timeout] MisbehavingEnv.initial_observation() did not return within 0.5 s"
    )
    assert "call_timeout" in str(exc.value)


@pytest.mark.timeout(30)
def test_check_env_group_builder_on_a_step_that_awaits_forever() -> None:
    with pytest.raises(ConformanceError) as exc, call_timeout(0.5):
        check_env_group_builder(MisbehavingGroup("hang-step"))
    assert exc.value.rule == "env/timeout"
    assert "MisbehavingEnv (member 0 of MisbehavingGroup).step(" in str(exc.value)
    # The limit is scoped: a well-behaved env passes afterwards under the default.
    check_env(MisbehavingEnv("ok"))
