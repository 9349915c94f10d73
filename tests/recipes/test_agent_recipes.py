"""The agent recipes (``tool-use``, ``rubric``, ``twenty-questions``): their scripted data is
right, bad configs are refused, and each runs end to end at a tiny budget in a subprocess. The
full-budget figures are in docs/recipes/, not a test."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tempering.envs.rubric_task import judge_examples, load_questions
from tempering.envs.tool_use_task import KINDS, ToolUseTask, scripted_episode
from tempering.envs.twenty_questions import load_words
from tempering.envs.twenty_questions_task import category_question, guess_question, scripted_game
from tempering.recipes import load_recipe
from tempering.recipes._agents import repeated_figures
from tempering.recipes.rubric import RubricRecipe
from tempering.recipes.tool_use import ToolUseRecipe
from tempering.recipes.twenty_questions import TwentyQuestionsRecipe


def test_registry_names_the_recipes() -> None:
    assert load_recipe("tool-use") is ToolUseRecipe
    assert load_recipe("rubric") is RubricRecipe
    assert load_recipe("twenty-questions") is TwentyQuestionsRecipe


def test_bad_configs_are_refused() -> None:
    with pytest.raises(ValueError, match=r"ToolUseRecipe\.group_size \(--group-size\) must be > 0"):
        ToolUseRecipe(group_size=0)
    with pytest.raises(ValueError, match=r"test_towns must be in 1\.\.50"):
        ToolUseRecipe(test_towns=0)
    with pytest.raises(ValueError, match=r"RubricRecipe\.judge_sft_steps \(--judge-sft-steps\) must be >= 0"):
        RubricRecipe(judge_sft_steps=-1)
    with pytest.raises(ValueError, match=r"TwentyQuestionsRecipe\.max_turns \(--max-turns\) must be > 0"):
        TwentyQuestionsRecipe(max_turns=0)
    with pytest.raises(ValueError, match=r"ToolUseRecipe\.eval_seeds \(--eval-seeds\) must be > 0"):
        ToolUseRecipe(eval_seeds=0)


def test_repeated_evaluations_give_the_mean_and_the_spread() -> None:
    figures = repeated_figures([{"rl_won": 0.25, "rl_turns": 3.0}, {"rl_won": 0.5, "rl_turns": 3.0}])
    assert figures["rl_won"] == pytest.approx(0.375)
    assert figures["rl_won_sd"] == pytest.approx(0.1767767)
    assert figures["rl_turns_sd"] == 0.0
    assert repeated_figures([{"rl_won": 0.25}]) == {"rl_won": 0.25}
    with pytest.raises(ValueError, match="no evaluation runs"):
        repeated_figures([])


def test_tool_use_questions_and_scripted_episodes_are_right() -> None:
    task = ToolUseTask(n_per_kind=20, eval_questions=5, test_towns=10)
    train, test = task.split()
    assert [sum(q.kind == k for q in train) for k in KINDS] == [20, 20, 20]
    assert [sum(q.kind == k for q in test) for k in KINDS] == [5, 5, 5]
    town = re.compile(r"live in (\w+)\?|was (\w+) founded")
    train_towns = {m.group(1) or m.group(2) for q in train if (m := town.search(q.text))}
    test_towns = {m.group(1) or m.group(2) for q in test if (m := town.search(q.text))}
    assert test_towns
    assert not train_towns & test_towns  # held-out towns
    index, _ = task.tools()
    for question in train[::7]:
        messages = scripted_episode(question, index)
        assert messages[-1] == {"role": "assistant", "content": question.answer}
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if question.kind == "calc":
            a, op, b = re.fullmatch(r"What is (\d+) (.) (\d+)\?", question.text).groups()  # type: ignore[union-attr]
            assert question.answer == str(eval(f"{a}{op}{b}"))
            assert results == [question.answer]
        elif question.kind == "search":
            assert f"has {question.answer} inhabitants" in results[0]
        else:
            founded = re.search(r"founded in (\d+)", results[0])
            assert founded is not None
            assert int(question.answer) == int(founded.group(1)) - 1000
            assert results[1] == question.answer


def test_twenty_questions_scripted_games_win_and_answer_truly() -> None:
    words = load_words()
    rng = random.Random(0)
    for secret in words[::5]:
        asker, answers = scripted_game(secret, words, 20, rng)
        assert secret.word in asker[-1]["content"]
        assert asker[-1]["role"] == "assistant"
        for convo in answers:
            question, reply = convo[1]["content"], convo[2]["content"]
            truth = question in (category_question(secret.category), guess_question(secret.word))
            assert reply == ("Yes." if truth else "No.")


def test_rubric_judge_examples_are_labelled_right() -> None:
    questions = load_questions("arithmetic_chat.jsonl")
    assert len(questions) > 100
    rows = judge_examples(questions, 50, random.Random(0))
    verdicts = []
    for row in rows:
        text = row[0]["content"]
        reference = re.search(r"Reference answer: (.*)\n", text)
        reply = re.search(r"Reply: (.*)\n", text)
        assert reference is not None
        assert reply is not None
        expected = "Score: 10" if reply.group(1) == reference.group(1) else "Score: 0"
        assert row[1]["content"] == expected
        verdicts.append(expected)
    assert 10 < verdicts.count("Score: 10") < 40


_TINY = {
    "tool-use": (
        "--sft-examples 16 --sft-steps 2 --sft-batch-size 4 --rl-steps 1 --rl-batch-size 1 --group-size 2 "
        "--eval-questions 1 --eval-samples 1 --max-turns 2 --max-tokens 16 --eval-seeds 2 --eval-base"
    ),
    "twenty-questions": (
        "--sft-games 20 --sft-steps 2 --sft-batch-size 4 --rl-steps 1 --rl-batch-size 1 --group-size 2 "
        "--eval-samples 1 --max-turns 2 --max-tokens 8"
    ),
    "rubric": (
        "--judge-examples 16 --judge-sft-steps 1 --sft-steps 1 --sft-batch-size 4 --rl-steps 1 "
        "--rl-batch-size 1 --group-size 2 --eval-questions 2 --eval-samples 1 --max-tokens 4"
    ),
}
_FIGURES = {
    "tool-use": ["correct", "correct_calc", "correct_search", "correct_both", "tool_calls", "budget_stop"],
    "twenty-questions": ["won", "turns", "answer_invalid"],
    "rubric": ["judge_reward", "accuracy", "judge_agreement", "judge_unparsed"],
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(_TINY))
def test_recipe_tiny_budget(name: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "TEMPERING_HOME": str(tmp_path / "home"), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tempering.cli",
            "recipe",
            name,
            *_TINY[name].split(),
            "--no-progress",
            "--out",
            out,
        ],
        capture_output=True,
        text=True,
        timeout=560,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"run directory: {out}" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == name
    for stage in ("sft", "rl"):
        for figure in _FIGURES[name]:
            value = summary[f"{stage}_{figure}"]
            assert value == value, f"{stage}_{figure} is NaN"
            assert value >= 0
    assert summary["wall_seconds"] > 0
    if "--eval-base" in _TINY[name]:  # the untrained model evaluated too, and each figure over 2 seeds
        for stage in ("base", "sft", "rl"):
            for figure in _FIGURES[name]:
                assert summary[f"{stage}_{figure}_sd"] >= 0
        assert 0 <= summary["base_correct"] <= 1
    for stage in ("sft", "rl"):
        lines = (out / stage / "metrics.jsonl").read_text().splitlines()
        assert lines, stage
    rl = [json.loads(x) for x in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert "tokens/sampled" in rl[-1]
    assert any((out / "rl" / "trajectories").iterdir()), "the RL rollouts are logged"
    assert (out / "data" / ("judge_train.jsonl" if name == "rubric" else "train.jsonl")).stat().st_size > 0
    if name == "rubric":  # the judge's held-out verdicts: as many as its training ones, up to 200
        assert len((out / "data" / "judge_test.jsonl").read_text().splitlines()) == 16
