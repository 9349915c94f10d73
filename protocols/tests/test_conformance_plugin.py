"""The pytest plugin, exercised the way a downstream package uses it (with ``pytester``).

The plugin reaches these inner pytest runs through its ``pytest11`` entry point, exactly as it
reaches a downstream test suite: nothing here registers it by hand.
"""

from __future__ import annotations

import importlib.metadata

import pytest

DOWNSTREAM = """
import attrs
import tinker
from tempering_protocols import EnvGroupBuilder, StepResult, TokensWithLogprobs


class Echo:
    def __init__(self):
        self.done = False

    async def initial_observation(self):
        return tinker.ModelInput.from_ints([1]), [0]

    async def step(self, action, /):
        if self.done:
            raise RuntimeError("over")
        self.done = True
        return StepResult(1.0, True, tinker.ModelInput.empty(), [0])


class Immortal(Echo):
    async def step(self, action, /):
        return StepResult(1.0, True, tinker.ModelInput.empty(), [0])


@attrs.frozen
class EchoGroup(EnvGroupBuilder):
    size: int = 2

    async def make_envs(self):
        return [Echo() for _ in range(self.size)]


class NeedsArguments(EchoGroup):
    def __init__(self, size):
        super().__init__(size)


async def policy(model_input, stop, /):
    return TokensWithLogprobs(tokens=[5], maybe_logprobs=[-1.0])


async def policy_without_logprobs(model_input, stop, /):
    return TokensWithLogprobs(tokens=[5])


def not_a_protocol(x, y, z):
    return x
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """An in-process pytest run, with the unraisable-exception plugin off: its forced garbage
    collections at exit are slow inside this (large) test process, and nothing here needs it."""
    return pytester.runpytest("-p", "no:unraisableexception", *args)


@pytest.fixture
def downstream(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(downstream_envs=DOWNSTREAM)
    pytester.syspathinsert()
    return pytester


def test_plugin_is_registered_as_an_entry_point() -> None:
    entry_points = importlib.metadata.entry_points(group="pytest11")
    ours = [ep for ep in entry_points if ep.name == "tempering_protocols"]
    assert [ep.value for ep in ours] == ["tempering_protocols.testing.plugin"]


def test_fixture_runs_the_kit(downstream: pytest.Pytester) -> None:
    downstream.makepyfile(
        test_downstream="""
        import pytest
        from downstream_envs import Echo, EchoGroup, Immortal, policy

        def test_env(conformance):
            conformance.check_env(Echo())

        def test_group_and_detection(conformance):
            group = conformance.check_env_group_builder(EchoGroup(size=3))
            assert len(group.trajectories_G) == 3
            conformance.check(EchoGroup())
            conformance.check(policy, "token_completer")

        def test_broken_env(conformance):
            conformance.check_env(Immortal())
        """
    )
    result = run(downstream, "-v")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.no_fnmatch_line("*tempering-conformance*")  # no option: no generated items
    result.stdout.fnmatch_lines(["*[[]env/step-after-done[]] Immortal accepted step() after episode_done*"])


def test_fixture_comes_from_the_entry_point(downstream: pytest.Pytester) -> None:
    downstream.makepyfile(test_downstream="def test_env(conformance):\n    pass\n")
    result = run(downstream, "-p", "no:tempering_protocols")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'conformance' not found*"])


def test_option_adds_one_item_per_object(downstream: pytest.Pytester) -> None:
    result = run(
        downstream,
        "-v",
        "--tempering-conformance=downstream_envs:EchoGroup,downstream_envs:Immortal",
        "--tempering-conformance=downstream_envs:policy",
        "--tempering-conformance=downstream_envs:policy_without_logprobs@token_completer",
    )
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*tempering-conformance[[]downstream_envs:EchoGroup[]] PASSED*",
            "*tempering-conformance[[]downstream_envs:Immortal[]] FAILED*",
            "*tempering-conformance[[]downstream_envs:policy[]] PASSED*",
            "*tempering-conformance[[]downstream_envs:policy_without_logprobs@token_completer[]] FAILED*",
        ]
    )
    # a failure is the rule's message, not a traceback through the kit
    result.stdout.fnmatch_lines(["[[]env/step-after-done[]] Immortal accepted step() after episode_done*"])
    result.stdout.fnmatch_lines(["[[]completer/missing-logprobs[]] policy_without_logprobs*"])
    result.stdout.no_fnmatch_line("*_rl.py*")


BAD_SPECS = {
    "no_such_module:Thing": "cannot import 'no_such_module'",
    "downstream_envs:Missing": "downstream_envs:Missing does not exist",
    "downstream_envs": "expected MODULE:OBJECT[[]@KIND[]]",
    "downstream_envs:EchoGroup@gym_env": "unknown kind 'gym_env'",
    "downstream_envs:NeedsArguments": "cannot instantiate NeedsArguments with no arguments",
    "downstream_envs:not_a_protocol": "cannot tell which tempering protocol not_a_protocol implements",
}


def test_bad_specs_fail_their_item_with_a_message(downstream: pytest.Pytester) -> None:
    result = run(downstream, *(f"--tempering-conformance={spec}" for spec in BAD_SPECS))
    result.assert_outcomes(failed=len(BAD_SPECS))
    for message in BAD_SPECS.values():
        result.stdout.fnmatch_lines([f"*{message}*"])


def test_ini_key_and_keyword_selection(downstream: pytest.Pytester) -> None:
    downstream.makeini(
        """
        [pytest]
        tempering_conformance =
            downstream_envs:EchoGroup
            downstream_envs:Immortal
        """
    )
    result = run(downstream, "-v")
    result.assert_outcomes(passed=1, failed=1)
    selected = run(downstream, "-v", "-k", "EchoGroup")
    selected.assert_outcomes(passed=1, deselected=1)
