"""The verifiers adapter: small classic verifiers environments written in tests/envs/verifiers_envs.py
(single-turn with an XML parser and a rubric, multi-turn, a ToolEnv with a Python tool, group
rewards, faulty ones), played through tempering's own rollout loop with a scripted policy, and
end to end with `tempering rl` / `tempering eval` on the tiny model."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import pickle
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tempering.envs.verifiers_env import VerifiersMissingError, import_verifiers, load_verifiers_env
from tempering.renderers import BaseRenderer
from tempering.rl.rollouts import GroupRollout, RolloutConfig, rollout_batch
from tempering_protocols import Observation, StopCondition, TokensWithLogprobs
from tempering_protocols.rendering import decode_text
from tests.envs import verifiers_envs

HAS_VERIFIERS = importlib.util.find_spec("verifiers") is not None
needs_verifiers = pytest.mark.skipif(
    not HAS_VERIFIERS, reason="verifiers (0.3.x) is not installed: pip install 'tempering[verifiers]'"
)


@pytest.fixture(scope="module", autouse=True)
def env_modules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = verifiers_envs.install(tmp_path_factory.mktemp("vf_envs"))
    sys.path.insert(0, str(directory))
    yield directory
    sys.path.remove(str(directory))


class Scripted:
    """A policy that answers ``reply(observation text, member)``; ``member`` counts the calls with
    the same observation (the members of a group, turn by turn)."""

    def __init__(self, renderer: BaseRenderer, reply: Callable[[str, int], str]) -> None:
        self.renderer = renderer
        self.reply = reply
        self.calls: dict[str, int] = {}
        self.observations: list[str] = []

    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        text = decode_text(self.renderer.tokenizer, model_input.to_ints())
        self.observations.append(text)
        member = self.calls.get(text, 0)
        self.calls[text] = member + 1
        stop_token = stop[0]
        assert isinstance(stop_token, int)
        tokens = [
            *self.renderer.tokenizer.encode(self.reply(text, member), add_special_tokens=False),
            stop_token,
        ]
        return TokensWithLogprobs(tokens=tokens, maybe_logprobs=[0.0] * len(tokens))


async def _play(builders: list[object], policy: Scripted, **config: object) -> list[GroupRollout]:
    return await rollout_batch(builders, policy, RolloutConfig(**config), seed=0)  # type: ignore[arg-type]


def _task(env: str, **fields: object) -> object:
    from tempering.envs.verifiers_data import VerifiersTask

    return VerifiersTask(env=env, **fields)  # type: ignore[arg-type]


def _first_turn(text: str) -> str:
    return text.split("<|im_start|>assistant")[-1]


@needs_verifiers
def test_single_turn_env_rubric_and_parser_score_the_sampled_reply(renderer: BaseRenderer) -> None:
    from tempering.envs.verifiers_data import VerifiersTask

    task = VerifiersTask(env="vf-test-single", batch_size=4, group_size=2)
    train, test = asyncio.run(task())
    assert len(train) == 1
    assert test is not None
    assert len(test) == 1

    def reply(text: str, member: int) -> str:
        a = int(re.findall(r"What is (\d+)\+", text)[-1])
        return f"<answer>{2 * a}</answer>" if member == 0 else f"<answer>{2 * a + 1}</answer>"

    policy = Scripted(renderer, reply)
    rollouts = asyncio.run(_play(list(train.get_batch(0)), policy))
    assert all(r.group is not None and r.n_failed == 0 for r in rollouts)
    assert "Answer inside <answer></answer>." in policy.observations[0]  # the env's system prompt
    for r in rollouts:
        assert r.group is not None
        # the right answer scores 1 (correct) + 0.25 * format + 0.1 * lowercase; the wrong one
        # only the format and the lowercase letters
        assert sorted(r.group.get_total_rewards()) == pytest.approx([0.35, 1.35])
        metrics = [t.transitions[-1].metrics for t in r.group.trajectories_G]
        assert sorted(m["verifiers/correct"] for m in metrics) == [0.0, 1.0]
        assert all(m["verifiers/passed"] == (m["verifiers/correct"] == 1.0) for m in metrics)
    # the test set is the env's eval dataset (2 rows)
    assert len(test.get_batch(0)) == 2


@needs_verifiers
def test_multi_turn_env_plays_turn_by_turn_with_env_responses(renderer: BaseRenderer) -> None:
    train, _ = asyncio.run(_task("vf-test-multi", batch_size=1, group_size=2)())  # type: ignore[operator]
    guesses = {0: "5", 1: "7"}
    policy = Scripted(
        renderer, lambda text, member: guesses.get(text.count("<|im_start|>assistant") - 1, "1")
    )
    (rollout,) = asyncio.run(_play(list(train.get_batch(0)), policy))
    assert rollout.group is not None, rollout.failures
    for traj in rollout.group.trajectories_G:
        assert len(traj.transitions) == 2  # 5 (higher), then 7 (correct, the env's stop condition)
        first, second = traj.transitions
        assert not first.episode_done
        assert second.episode_done
        ob2 = decode_text(renderer.tokenizer, second.ob.to_ints())
        assert "higher" in ob2
        # the second observation extends the first plus the sampled reply: one datum per episode
        assert second.ob.to_ints()[: first.ob.length + len(first.ac.tokens)] == [
            *first.ob.to_ints(),
            *first.ac.tokens,
        ]
        assert second.metrics["verifiers/won"] == 1.0
        assert second.metrics["verifiers/turns_used"] == 2.0
    assert rollout.group.get_total_rewards() == [1.0, 1.0]


@needs_verifiers
def test_tool_env_runs_the_python_tool_the_model_called(renderer: BaseRenderer) -> None:
    train, _ = asyncio.run(_task("vf-test-tools", batch_size=1, group_size=1)())  # type: ignore[operator]
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'

    def reply(text: str, member: int) -> str:
        return call if "<|im_start|>tool" not in text else "The sum is 42."

    policy = Scripted(renderer, reply)
    (rollout,) = asyncio.run(_play(list(train.get_batch(0)), policy, min_group_fraction=1.0))
    assert rollout.group is not None, rollout.failures
    (traj,) = rollout.group.trajectories_G
    assert len(traj.transitions) == 2
    assert "add(a: integer, b: integer)" in policy.observations[0]  # the tool declared to the model
    tool_turn = decode_text(renderer.tokenizer, traj.transitions[1].ob.to_ints())
    assert "<|im_start|>tool" in tool_turn
    assert "42" in tool_turn.split("<|im_start|>tool")[-1]
    last = traj.transitions[-1].metrics
    assert last["verifiers/correct"] == 1.0
    assert last["verifiers/used_tool"] == 1.0
    assert last["verifiers/add_calls"] == 1.0
    assert last["verifiers/total_tool_calls"] == 1.0
    assert rollout.group.get_total_rewards() == [1.5]


@needs_verifiers
def test_group_reward_functions_score_the_group(renderer: BaseRenderer) -> None:
    train, _ = asyncio.run(_task("vf-test-grouped", batch_size=1, group_size=2)())  # type: ignore[operator]
    policy = Scripted(renderer, lambda text, member: "a" if member == 0 else "a longer word")
    (rollout,) = asyncio.run(_play(list(train.get_batch(0)), policy))
    assert rollout.group is not None, rollout.failures
    assert sorted(rollout.group.get_total_rewards()) == [0.5, 1.5]
    assert sorted(m["verifiers/longest"] for m in rollout.group.metrics_G) == [0.0, 1.0]


@needs_verifiers
@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("raise", "raised ValueError: the env broke"),
        ("raise_setup", "raised KeyError"),
        ("nan", "returned the reward nan"),
        ("hang", "took longer than 0.5 s"),
        ("vf_error", "ended its rollout with an error: ToolCallError"),
    ],
)
def test_a_faulty_env_fails_its_rollouts_not_the_run(renderer: BaseRenderer, mode: str, says: str) -> None:
    train, _ = asyncio.run(
        _task(
            "vf-test-faulty", env_args=json.dumps({"mode": mode}), batch_size=1, group_size=2, timeout_s=0.5
        )()  # type: ignore[operator]
    )
    ok_train, _ = asyncio.run(_task("vf-test-faulty", batch_size=1, group_size=2)())  # type: ignore[operator]
    policy = Scripted(renderer, lambda text, member: "hello")
    bad, good = asyncio.run(_play([*train.get_batch(0), *ok_train.get_batch(0)], policy))
    assert bad.group is None
    assert bad.failures == {"rollout/failed/VerifiersEnvError": 2}
    assert bad.first_error is not None
    message = str(bad.first_error)
    assert "verifiers env 'vf-test-faulty'" in message, message
    assert says in message, message
    assert good.group is not None
    assert good.group.get_total_rewards() == [1.0, 1.0]


@needs_verifiers
def test_builders_pickle_and_conform(renderer: BaseRenderer) -> None:
    from tempering_protocols.testing import check_env_group_builder

    train, _ = asyncio.run(_task("vf-test-single", batch_size=2, group_size=2)())  # type: ignore[operator]
    builder = train.get_batch(0)[0]
    copy = pickle.loads(pickle.dumps(builder))
    assert copy == builder
    check_env_group_builder(builder)


@needs_verifiers
def test_bad_names_and_arguments_are_named() -> None:
    with pytest.raises(
        ValueError, match=r"verifiers env 'no-such-env': no module 'no_such_env' is installed"
    ):
        load_verifiers_env("no-such-env")
    with pytest.raises(ValueError, match=r"not JSON .* give a JSON object"):
        asyncio.run(_task("vf-test-single", env_args="{n: 2")())  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"'\[2\]' is not a JSON object but a list; give a JSON object"):
        asyncio.run(_task("vf-test-single", env_args="[2]")())  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"'vf-test-single' failed to load .*unexpected keyword"):
        load_verifiers_env("vf-test-single", {"bogus": 1})


def test_missing_verifiers_names_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(VerifiersMissingError, match=re.escape("pip install 'tempering[verifiers]'")):
        import_verifiers()


@needs_verifiers
@pytest.mark.timeout(300)
def test_tempering_rl_and_eval_run_a_verifiers_env_end_to_end(
    tmp_path: Path, tempering_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tempering.cli import main

    monkeypatch.setenv("TEMPERING_HOME", str(tempering_home))
    run = tmp_path / "run"
    rc = main(
        [
            "rl",
            "--verifiers-env",
            "vf-test-single",
            "--verifiers-env-args",
            '{"n": 4}',
            "--dataset.batch-size",
            "2",
            "--dataset.group-size",
            "2",
            "--dataset.n-batches",
            "2",
            "--max-tokens",
            "8",
            "--num-steps",
            "2",
            "--run.log-dir",
            str(run),
        ]
    )
    assert rc == 0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2
    assert all("env/verifiers/vf-test-single/reward/mean" in m for m in metrics)
    assert all(m["env/frac_groups_failed"] == 0.0 for m in metrics)
    assert sum(m["tokens/trained"] for m in metrics) > 0  # the rubric's rewards vary: it trained
    out = tmp_path / "eval.json"
    rc = main(
        [
            "eval",
            "--verifiers-env",
            "vf-test-single",
            "--max-tokens",
            "8",
            "--num-samples",
            "2",
            "--output",
            str(out),
        ]
    )
    assert rc == 0
    body = json.loads(out.read_text())
    (result,) = body["results"]
    assert result["kind"] == "verifiers"
    assert len(result["rewards"]) == 4
    assert all(math.isfinite(r) for r in result["rewards"])
    assert result["metrics"]["verifiers/vf-test-single/finished"] == 4.0


@needs_verifiers
@pytest.mark.parametrize("command", ["rl", "eval"])
@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (
            ["--verifiers-env", "no-such-env"],
            "verifiers env 'no-such-env': no module 'no_such_env' is installed",
        ),
        (["--verifiers-env", "vf-test-single", "--verifiers-env-args", "{n: 1}"], "are not JSON"),
        (["--verifiers-env-args", "{}"], "--verifiers-env-args is given without --verifiers-env NAME"),
        (["--verifiers-env"], "--verifiers-env needs a value"),
    ],
)
def test_cli_refuses_a_bad_env_before_running(
    command: str, flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tempering.cli import main

    assert main([command, *flags]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("command", ["rl", "eval"])
def test_cli_without_verifiers_names_the_extra(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tempering.cli import main

    monkeypatch.setitem(sys.modules, "verifiers", None)
    assert main([command, "--verifiers-env", "vf-test-single"]) == 2
    assert "pip install 'tempering[verifiers]'" in capsys.readouterr().err


@needs_verifiers
def test_cleanup_cancels_a_rollout_the_loop_abandoned(renderer: BaseRenderer) -> None:
    from tempering.envs.verifiers_env import VerifiersEnv

    train, _ = asyncio.run(_task("vf-test-multi", batch_size=1, group_size=1)())  # type: ignore[operator]
    builder = train.get_batch(0)[0]

    async def abandon() -> VerifiersEnv:
        (env,) = await builder.make_envs()
        assert isinstance(env, VerifiersEnv)
        await env.initial_observation()  # the env's rollout now waits for a reply that never comes
        assert env._task is not None
        assert not env._task.done()
        await builder.cleanup()
        await asyncio.sleep(0)
        return env

    env = asyncio.run(abandon())
    assert env._task is not None
    assert env._task.cancelled()


@needs_verifiers
@pytest.mark.parametrize("name", ["vf-test-single", "vf-test-multi", "vf-test-tools"])
def test_each_env_passes_the_env_conformance_kit(name: str) -> None:
    from tempering_protocols.testing import check_env

    train, _ = asyncio.run(_task(name, batch_size=1, group_size=1)())  # type: ignore[operator]
    (env,) = asyncio.run(train.get_batch(0)[0].make_envs())
    trajectory = check_env(env)  # default actions; also: a finished env refuses another step
    assert trajectory.transitions[-1].episode_done


def test_verifiers_0_4_without_the_classic_api_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    v1_only = types.ModuleType("verifiers")  # 0.4.0's package root: only `verifiers.v1` below it
    v1_only.__version__ = "0.4.0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "verifiers", v1_only)
    with pytest.raises(VerifiersMissingError, match=r"verifiers 0\.4\.0 has no classic environment API"):
        import_verifiers()
