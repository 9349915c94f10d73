"""Tic-tac-toe: rules (wins, draws, illegal moves), self-play turn-taking and group rewards, the
game against a random player, single use, the conformance kit, pickling, and the random-player
evaluator with scripted policies whose results are known."""

from __future__ import annotations

import asyncio
import functools
import math
import pickle
from collections.abc import Callable, Sequence

import pytest

from tempering.envs import (
    TicTacToeGroupBuilder,
    TicTacToeStats,
    TicTacToeVsRandom,
    TicTacToeVsRandomGroupBuilder,
    tic_tac_toe_stats,
)
from tempering.envs.message import MessageEnvAdapter
from tempering.envs.tic_tac_toe import LINES, legal_moves, parse_move, tic_tac_toe_prompt, winner
from tempering.renderers import BaseRenderer
from tempering.rl.evaluate import evaluate_against_random, evaluate_against_random_seeds
from tempering_protocols import Env, Metrics, Observation, StopCondition, TokensWithLogprobs
from tempering_protocols.rendering import decode_text
from tempering_protocols.testing import check_env, check_env_group_builder

ActionPolicy = Callable[[Observation, StopCondition], list[int]]


def _say(renderer: BaseRenderer, text: str) -> list[int]:
    stop = renderer.get_stop_sequences()[0]
    assert isinstance(stop, int)
    return [*renderer.tokenizer.encode(text, add_special_tokens=False), stop]


def _board_of(renderer: BaseRenderer, ob: Observation) -> tuple[str, str]:
    """``(board, mark)`` read back from an observation's prompt."""
    text = decode_text(renderer.tokenizer, ob.to_ints())
    if "you are " not in text:  # the kit's step after the end: an empty observation
        return "X" * 9, "X"
    mark = text.split("you are ")[1][0]
    rows = text.split("free cell.\n")[1].split("<|im_end|>")[0].split("\n")
    return "".join("." if c.isdigit() else c for c in "".join(rows)), mark


@functools.cache
def _value(board: str, mark: str) -> int:
    """Minimax value of ``board`` for ``mark`` to move: +1 win, 0 draw, -1 loss."""
    if winner(board) is not None:
        return -1  # the previous mover won
    moves = legal_moves(board)
    if not moves:
        return 0
    other = "O" if mark == "X" else "X"
    return max(-_value(board[:c] + mark + board[c + 1 :], other) for c in moves)


def _best_move(board: str, mark: str) -> int:
    other = "O" if mark == "X" else "X"
    return max(legal_moves(board), key=lambda c: -_value(board[:c] + mark + board[c + 1 :], other))


def _perfect(renderer: BaseRenderer) -> ActionPolicy:
    def act(ob: Observation, stop: StopCondition) -> list[int]:
        board, mark = _board_of(renderer, ob)
        return _say(renderer, str(_best_move(board, mark) + 1) if legal_moves(board) else "1")

    return act


def _first_free(renderer: BaseRenderer) -> ActionPolicy:
    def act(ob: Observation, stop: StopCondition) -> list[int]:
        board, _ = _board_of(renderer, ob)
        return _say(renderer, str((legal_moves(board) or [0])[0] + 1))

    return act


class _Completer:
    """A ``TokenCompleter`` from an action policy (logprobs 0), for the evaluator."""

    def __init__(self, act: ActionPolicy) -> None:
        self.act = act

    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        tokens = self.act(model_input, stop)
        return TokensWithLogprobs(tokens=tokens, maybe_logprobs=[0.0] * len(tokens))


# ------------------------------------------------------------------------------ rules


def test_rules() -> None:
    assert len(LINES) == 8
    assert winner("XXX.OO...") == "X"
    assert winner("O..XO.X.O") == "O"  # diagonal
    assert winner("X.OXO.O.X") == "O"  # anti-diagonal
    assert winner("XOXXOOOXX") is None  # a full board, drawn
    assert legal_moves("XOXXOOOXX") == []
    assert legal_moves("X...O....") == [1, 2, 3, 5, 6, 7, 8]
    assert [parse_move(t) for t in ("1", " 9 ", "0", "10", "a", "", "5.")] == [
        0,
        8,
        None,
        None,
        None,
        None,
        None,
    ]
    assert tic_tac_toe_prompt("X...O....", "X") == "Tic-tac-toe, you are X. Pick a free cell.\nX23\n4O6\n789"


def _play_vs_random(
    side: str, seed: int, moves: Sequence[str]
) -> list[tuple[float, bool, dict[str, float | int]]]:
    game = TicTacToeVsRandom("X" if side == "X" else "O", seed)
    asyncio.run(game.initial_messages())
    out: list[tuple[float, bool, dict[str, float | int]]] = []
    for m in moves:
        r = asyncio.run(game.step({"role": "assistant", "content": m}))
        out.append((r.reward, r.episode_done, dict(r.metrics)))
        if r.episode_done:
            break
    return out


def test_vs_random_illegal_moves_lose() -> None:
    # a taken cell: X takes 5, then tries 5 again
    results = _play_vs_random("X", 0, ["5", "5"])
    reward, done, metrics = results[-1]
    assert done
    assert reward == -1.0
    assert metrics["ttt/illegal"] == 1
    assert metrics["ttt/lost"] == 1
    assert metrics["ttt/won"] == 0
    for bad in ("0", "x", "12"):
        ((reward, done, metrics),) = _play_vs_random("O", 1, [bad])
        assert done
        assert reward == -1.0
        assert metrics["ttt/illegal"] == 1


def test_vs_random_opponent_moves_first_as_o_and_game_ends() -> None:
    game = TicTacToeVsRandom("O", seed=4)
    (prompt,) = asyncio.run(game.initial_messages())
    assert game.board.count("X") == 1
    assert "you are O" in prompt["content"]
    r = asyncio.run(game.step({"role": "assistant", "content": str(legal_moves(game.board)[0] + 1)}))
    while not r.episode_done:
        assert game.board.count("X") == game.board.count("O") + 1
        r = asyncio.run(game.step({"role": "assistant", "content": str(legal_moves(game.board)[0] + 1)}))
    assert game.done
    assert r.metrics["ttt/won"] + r.metrics["ttt/draw"] + r.metrics["ttt/lost"] == 1
    assert r.reward == r.metrics["ttt/won"] - r.metrics["ttt/lost"]
    with pytest.raises(RuntimeError, match="single-use"):
        asyncio.run(game.step({"role": "assistant", "content": "1"}))
    with pytest.raises(ValueError, match="side must be 'X' or 'O'"):
        TicTacToeVsRandom("Z", seed=0)  # pyright: ignore[reportArgumentType]


def test_perfect_player_never_loses_to_random(renderer: BaseRenderer) -> None:
    for side in ("X", "O"):
        for seed in range(6):
            env = MessageEnvAdapter(TicTacToeVsRandom(side, seed), renderer)
            traj = check_env(env, actions=_perfect(renderer))  # also: step after the end raises
            last = traj.transitions[-1].metrics
            assert last["ttt/lost"] == 0, (side, seed)
            assert last["ttt/illegal"] == 0


# ------------------------------------------------------------------------------ self-play


async def _self_play(builder: TicTacToeGroupBuilder, act: ActionPolicy) -> list[tuple[float, Metrics]]:
    """Play a self-play group with every member concurrently (as the rollout runner does);
    every env refuses a step after its end. Returns the group rewards."""
    envs = list(await builder.make_envs())

    async def member(env: Env) -> None:
        ob, stop = await env.initial_observation()
        while True:
            r = await env.step(act(ob, stop))
            if r.episode_done:
                with pytest.raises(RuntimeError, match="single-use"):
                    await env.step(act(ob, stop))
                return
            ob, stop = r.next_observation, r.next_stop_condition

    await asyncio.gather(*(member(e) for e in envs))
    return await builder.compute_group_rewards([], envs)


def test_self_play_first_free_cell_x_wins(renderer: BaseRenderer) -> None:
    # Both take the first free cell: X 1, O 2, X 3, O 4, X 5, O 6, X 7 -> X wins on the anti-diagonal.
    group = asyncio.run(
        asyncio.wait_for(_self_play(TicTacToeGroupBuilder(renderer, n_games=2), _first_free(renderer)), 10)
    )
    assert [r for r, _ in group] == [1.0, -1.0, 1.0, -1.0]
    assert [m["ttt/won"] for _, m in group] == [1, 0, 1, 0]
    assert [m["ttt/moves"] for _, m in group] == [4, 3, 4, 3]


def test_self_play_perfect_players_draw(renderer: BaseRenderer) -> None:
    group = asyncio.run(
        asyncio.wait_for(_self_play(TicTacToeGroupBuilder(renderer, n_games=1), _perfect(renderer)), 10)
    )
    assert [r for r, _ in group] == [0.0, 0.0]
    assert [m["ttt/draw"] for _, m in group] == [1, 1]


def test_self_play_illegal_move_loses_and_opponent_gets_forfeit_reward(renderer: BaseRenderer) -> None:
    def o_repeats_cell_1(ob: Observation, stop: StopCondition) -> list[int]:
        board, mark = _board_of(renderer, ob)
        return _say(renderer, "1" if mark == "O" else str(legal_moves(board)[0] + 1))

    builder = TicTacToeGroupBuilder(renderer, n_games=1, illegal_reward=-2.0, forfeit_reward=0.25)
    group = asyncio.run(asyncio.wait_for(_self_play(builder, o_repeats_cell_1), 10))
    assert [r for r, _ in group] == [0.25, -2.0]
    assert [m["ttt/illegal"] for _, m in group] == [0, 1]

    def o_garbles(ob: Observation, stop: StopCondition) -> list[int]:
        _, mark = _board_of(renderer, ob)
        return (
            renderer.tokenizer.encode("7", add_special_tokens=False) if mark == "O" else _say(renderer, "5")
        )

    # An unparseable reply (no stop token) is an illegal move too, and the game ends at once
    # for the opponent (a long turn_timeout_s would otherwise stall the test).
    builder = TicTacToeGroupBuilder(renderer, n_games=1, turn_timeout_s=60)
    group = asyncio.run(asyncio.wait_for(_self_play(builder, o_garbles), 10))
    assert [r for r, _ in group] == [0.0, -1.0]
    assert [m["ttt/illegal"] for _, m in group] == [0, 1]


def test_self_play_conformance_and_pickle(renderer: BaseRenderer) -> None:
    builder = TicTacToeGroupBuilder(renderer, n_games=2, turn_timeout_s=0.02)
    # The kit plays members one after another: X moves, then waits for O and wins by forfeit.
    group = check_env_group_builder(builder, actions=_first_free(renderer))
    assert group.final_rewards_G == [0.0, -1.0, 0.0, -1.0]  # a forfeit win earns forfeit_reward
    copy = pickle.loads(pickle.dumps(builder))
    assert copy == builder
    assert TicTacToeGroupBuilder.coordinated_envs
    envs = asyncio.run(copy.make_envs())
    assert len(envs) == 4
    with pytest.raises(ValueError, match="n_games"):
        TicTacToeGroupBuilder(renderer, n_games=0)


def test_vs_random_builder_conformance_and_pickle(renderer: BaseRenderer) -> None:
    builder = TicTacToeVsRandomGroupBuilder(renderer, side="O", seed=3, group_size=3)
    check_env_group_builder(builder)  # the kit's garbage actions: illegal, -1
    group = check_env_group_builder(builder, actions=_perfect(renderer))
    assert all(r >= 0 for r in group.get_total_rewards())
    assert pickle.loads(pickle.dumps(builder)) == builder


# ------------------------------------------------------------------------------ evaluator


def test_stats_of_trajectories() -> None:
    empty = tic_tac_toe_stats([])
    assert empty.games == 0
    assert math.isnan(empty.win)


def test_evaluator_with_known_players(renderer: BaseRenderer) -> None:
    perfect = asyncio.run(
        evaluate_against_random(_Completer(_perfect(renderer)), renderer, games_per_side=30, seed=0)
    )
    assert set(perfect) == {"X", "O"}
    for side, s in perfect.items():
        assert isinstance(s, TicTacToeStats)
        assert s.games == 30
        assert s.loss == 0.0, side
        assert s.illegal == 0.0
        assert s.win + s.draw == pytest.approx(1.0)
    assert perfect["X"].win > 0.8  # a perfect X beats a random O almost always

    def always_5(ob: Observation, stop: StopCondition) -> list[int]:
        return _say(renderer, "5")

    stubborn = asyncio.run(evaluate_against_random(_Completer(always_5), renderer, games_per_side=20, seed=1))
    assert stubborn["X"].illegal == 1.0  # its second move is always illegal
    assert stubborn["X"].loss == 1.0
    assert 0.0 < stubborn["O"].illegal <= 1.0  # illegal whenever the random X took the centre, or later
    assert stubborn["O"].win + stubborn["O"].draw + stubborn["O"].loss == pytest.approx(1.0)

    again = asyncio.run(
        evaluate_against_random(_Completer(_first_free(renderer)), renderer, games_per_side=20, seed=5)
    )
    same = asyncio.run(
        evaluate_against_random(_Completer(_first_free(renderer)), renderer, games_per_side=20, seed=5)
    )
    assert again == same  # the random players are seeded
    with pytest.raises(ValueError, match="games_per_side"):
        asyncio.run(evaluate_against_random(_Completer(always_5), renderer, games_per_side=0))


def test_evaluator_over_seeds_pools_each_seeds_games(renderer: BaseRenderer) -> None:
    policy = _Completer(_first_free(renderer))
    pooled, per_seed = asyncio.run(
        evaluate_against_random_seeds(policy, renderer, games_per_side=20, seeds=[5, 6, 7])
    )
    assert len(per_seed) == 3
    # each seed is the single-seed evaluation with that seed
    assert per_seed[0] == asyncio.run(evaluate_against_random(policy, renderer, games_per_side=20, seed=5))
    assert per_seed[1] != per_seed[0]  # the seeds draw different random opponents
    for side in ("X", "O"):
        assert pooled[side].games == 60
        for k in ("win", "draw", "loss", "illegal", "moves"):
            assert getattr(pooled[side], k) == pytest.approx(sum(getattr(x[side], k) for x in per_seed) / 3)
    with pytest.raises(ValueError, match="seeds is empty"):
        asyncio.run(evaluate_against_random_seeds(policy, renderer, games_per_side=20, seeds=[]))
