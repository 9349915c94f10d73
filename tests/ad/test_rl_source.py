"""A tempering RL run as a source of learning histories (``tempering.ad.rl_source``): the game
under the token env's rules (``GuessNumberEnvFamily``), the RL source's dataset, and the RL
run's trajectory log turned into checked learning histories, with its bad input named by file
and row. The log here is written by hand with the tiny model's real tokens (the recipe's test
runs a real RL source end to end: tests/recipes/test_algorithm_distillation.py)."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tempering.ad import HistoryDataset, HistoryError, read_histories, source_curve
from tempering.ad.guess_env import GuessNumberEnvFamily
from tempering.ad.rl_source import SECRET_TAG, GuessNumberSourceTask, rl_histories, rules_of
from tempering.backend import load_renderer
from tempering.envs.guess_number import GuessNumberGroupBuilder
from tempering.rl.trajectory_files import TRAJECTORY_SCHEMA
from tempering_protocols import InContextTaskFamily

FAMILY = GuessNumberEnvFamily(high=16, horizon=6)
RENDERER = load_renderer("tempering/tiny")
INVALID, NONE = FAMILY.invalid_action, FAMILY.none_action
START, HIGHER, LOWER, OVER = 0, 1, 2, 3


def test_the_family_plays_the_token_envs_game_padded_to_its_horizon() -> None:
    assert isinstance(FAMILY, InContextTaskFamily)
    pickle.loads(pickle.dumps(FAMILY))
    assert (FAMILY.n_states, FAMILY.n_actions, FAMILY.horizon) == (4, 18, 6)
    task = FAMILY.task(1, False)
    assert task.secret == 4
    assert FAMILY.task(1, True).secret == 3
    assert FAMILY.numbers(True) == [1, 3, 5, 7, 9, 11, 13, 15]
    assert task.reset() == START
    assert task.step(7) == (LOWER, 0.0)  # 8
    assert task.step(3) == (OVER, 1.0)  # 4: found, the game ends
    assert task.step(3) == (OVER, 0.0)  # the turns left earn nothing
    assert task.reset() == START
    assert task.step(INVALID) == (OVER, 0.0)  # an invalid reply ends it, as the env does
    assert task.step(3) == (OVER, 0.0)
    assert [FAMILY.describe_action(a) for a in (0, 15, INVALID, NONE)] == ["1", "16", "invalid", "none"]
    # the scripted learner: binary search (at most 5 guesses for 16 numbers), then remembers
    curve = source_curve(FAMILY, list(range(8)), 3)
    assert (curve == 1).all()
    with pytest.raises(ValueError, match="high must be >= 2"):
        GuessNumberEnvFamily(high=1)


def test_the_source_task_plays_every_training_number_each_step_under_the_familys_rules() -> None:
    train, test = asyncio.run(GuessNumberSourceTask(high=16, max_turns=6, group_size=3, n_batches=5)())
    assert test is None
    assert len(train) == 5
    groups = train.get_batch(4)
    assert [g.secret for g in groups if isinstance(g, GuessNumberGroupBuilder)] == FAMILY.numbers(False)
    first = groups[0]
    assert isinstance(first, GuessNumberGroupBuilder)
    assert first.logging_tags() == [f"{SECRET_TAG}2"]
    assert first.group_size == 3
    assert first.rules == rules_of(FAMILY)
    assert (first.rules.low, first.rules.high, first.rules.max_turns) == (1, 16, 6)


def _reply(text: str, stop: bool = True) -> list[int]:
    tokens = RENDERER.tokenizer.encode(text, add_special_tokens=False)
    return tokens + ([int(t) for t in RENDERER.get_stop_sequences()] if stop else [])


Game = tuple[int, int, int, list[str]]  # (step, secret, member, replies)


def _write_log(root: Path, games: list[Game], *, tag: str = SECRET_TAG, done_early: bool = True) -> Path:
    """An RL run's trajectory log, one part per step, written as the RL loop writes it."""
    rl_dir = root / "trajectories" / "rl"
    rl_dir.mkdir(parents=True)
    for step in sorted({g[0] for g in games}):
        rows: list[dict[str, object]] = []
        for _, secret, member, replies in [g for g in games if g[0] == step]:
            for turn, text in enumerate(replies):
                tokens = _reply(text, stop=text != "<no stop>")
                rows.append({
                    "step": step, "sampler_version": step, "group": 0, "batch_group": 0, "member": member,
                    "episode_id": f"s{step}-p0-g{member}", "prompt_id": "p", "turn": turn,
                    "ob_tokens": [1, 2], "ob_opaque": 0, "ob_extends": turn > 0, "ac_tokens": tokens,
                    "ac_logprobs": [-0.5] * len(tokens), "stop_reason": "stop", "reward": 0.0,
                    "episode_done": turn == len(replies) - 1 if done_early else False, "masked": False,
                    "metrics": "{}", "total_reward": 0.0, "final_reward": 0.0, "advantage": 0.0,
                    "trained": True, "end_reason": "done", "episode_metrics": "{}",
                    "tags": [f"{tag}{secret}"], "seed": 0,
                })  # fmt: skip
        pq.write_table(
            pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA), rl_dir / f"step-{step:06d}.parquet"
        )
    return root


GAMES: list[Game] = [
    (0, 4, 0, ["8", "2", "4"]),  # lower, higher, found at the 3rd guess
    (0, 4, 1, ["hello"]),  # not a number: invalid, the game ends
    (0, 2, 0, ["9", "5", "3", "1", "7", "6"]),  # six guesses, none right
    (0, 2, 1, ["<no stop>"]),  # no stop token: invalid
    (1, 4, 0, ["4"]),
    (1, 4, 1, ["17"]),  # out of range: invalid
    (1, 2, 0, ["2"]),
    (1, 2, 1, ["1", "2"]),
]


def test_an_rl_runs_log_becomes_checked_learning_histories(tmp_path: Path) -> None:
    log = _write_log(tmp_path / "source-rl", GAMES)
    rl_dir = rl_histories(log, FAMILY, RENDERER, tmp_path / "histories")
    h = read_histories(rl_dir)
    # tasks (number, member) in order: (2, 0), (2, 1), (4, 0), (4, 1); an episode per RL step
    assert h.n_tasks == 4
    assert h.horizon == 6
    assert h.returns_NE().tolist() == [[0, 1], [0, 1], [1, 1], [0, 0]]
    task_4_0 = slice(int(h.starts_N1[2]), int(h.starts_N1[3]))
    assert h.state_R[task_4_0].tolist() == [START, LOWER, HIGHER, OVER, OVER, OVER] + [START] + [OVER] * 5
    assert h.action_R[task_4_0].tolist() == [7, 1, 3, NONE, NONE, NONE, 3] + [NONE] * 5
    assert h.reward_R[task_4_0].tolist() == [0, 0, 1, 0, 0, 0, 1] + [0] * 5
    n_tokens = len(_reply("8"))
    assert h.logprob_R[task_4_0][0] == pytest.approx(-0.5 * n_tokens)  # the reply's log-probability
    assert h.logprob_R[task_4_0][3] == 0.0  # a padded turn
    task_2_0 = slice(int(h.starts_N1[0]), int(h.starts_N1[1]))
    assert h.state_R[task_2_0][:6].tolist() == [START, LOWER, LOWER, LOWER, HIGHER, LOWER]
    first_actions = [int(h.action_R[h.starts_N1[k]]) for k in range(4)]
    assert first_actions == [8, INVALID, 7, INVALID]  # "9"; no stop token; "8"; "hello"
    assert int(h.action_R[int(h.starts_N1[3]) + 6]) == INVALID  # "17" is out of 1..16
    # both formats from the same files
    rl = HistoryDataset(h, window=12, stride=6)
    assert len(rl) == 4
    assert rl.tensors(2)["actions"].tolist() == h.action_R[task_4_0].tolist()
    text = HistoryDataset(h, window=12, stride=6, fmt="language", family=FAMILY)
    messages = text.messages(2)
    assert messages[1:4] == [
        {"role": "user", "content": "Episode starts. start"},
        {"role": "assistant", "content": "8"},
        {"role": "user", "content": "Reward 0. lower"},
    ]
    assert {"role": "assistant", "content": "none"} in messages
    assert {"role": "assistant", "content": "invalid"} in text.messages(3)


@pytest.mark.parametrize(
    ("games", "options", "message"),
    [
        (GAMES, {"tag": "number="}, r"step-000000.parquet: row 0: no 'secret=<number>' tag"),
        (
            [(0, 3, 0, ["3"])],
            {},
            r"step-000000.parquet: row 0: a game on 3, which is not one of .* training numbers",
        ),
        (
            [(0, 4, 0, ["1", "2", "3", "5", "6", "7", "8"])],
            {},
            r"row 6: turn 7 of a game, more than the family's 6",
        ),
        ([(0, 4, 0, ["4", "4"])], {"done_early": False}, r"row 0: the game went on after the correct guess"),
        (GAMES[:7], {}, r"no game of member 1 on 2 in step 1"),
    ],
    ids=["no tag", "held-out number", "too many turns", "past the correct guess", "missing game"],
)
def test_a_log_that_is_not_the_familys_game_is_named_by_file_and_row(
    tmp_path: Path, games: list[Game], options: dict[str, object], message: str
) -> None:
    tag = str(options.get("tag", SECRET_TAG))
    log = _write_log(tmp_path / "source-rl", games, tag=tag, done_early=bool(options.get("done_early", True)))
    with pytest.raises(HistoryError, match=message):
        rl_histories(log, FAMILY, RENDERER, tmp_path / "histories")


def test_no_games_is_an_error(tmp_path: Path) -> None:
    log = _write_log(tmp_path / "source-rl", [(0, 2, 0, ["4", "5"])], done_early=False)
    with pytest.raises(HistoryError, match="no finished games"):
        rl_histories(log, FAMILY, RENDERER, tmp_path / "histories")
