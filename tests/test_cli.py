"""The command line: flag order around subcommands, and plain-prose ``--help``."""

from __future__ import annotations

import itertools
import re

import pytest

from tempering.cli import _tyro_cli
from tempering.cli._help import plain
from tempering.cli.rl import RLCommandConfig
from tempering.envs.tasks import ArithmeticTask, LowercaseTask


@pytest.mark.parametrize(
    "argv",
    [
        ["--run.log-dir", "r", "--num-steps", "10", "dataset:lowercase-task"],
        ["dataset:lowercase-task", "--num-steps", "10", "--run.log-dir", "r"],
    ],
)
def test_flags_may_come_before_or_after_the_subcommand(argv: list[str]) -> None:
    config = _tyro_cli(RLCommandConfig, argv, "tempering rl", "rl")
    assert config.num_steps == 10
    assert isinstance(config.dataset, LowercaseTask)


def test_the_subcommand_keeps_its_default_and_its_own_flags() -> None:
    config = _tyro_cli(RLCommandConfig, ["--num-steps", "3", "--run.log-dir", "r"], "tempering rl", "rl")
    assert isinstance(config.dataset, ArithmeticTask)
    config = _tyro_cli(
        RLCommandConfig,
        ["dataset:arithmetic-task", "--dataset.batch-size", "4", "--seed", "2", "--run.log-dir", "r"],
        "tempering rl",
        "rl",
    )
    assert isinstance(config.dataset, ArithmeticTask)
    assert (config.dataset.batch_size, config.seed) == (4, 2)


@pytest.mark.parametrize("argv", [["--help"], ["dataset:arithmetic-task", "--help"]])
def test_help_is_plain_prose(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _tyro_cli(RLCommandConfig, argv, "tempering rl", "rl")
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "--num-steps" in text
    for markup in ("``", ":class:`", ":func:`", "::"):
        assert markup not in text, markup
    assert not any(line.strip() in ("│", "") and "│" in line for line in text.splitlines())


def test_plain_converts_rest() -> None:
    text = "Uses ``--x`` with :func:`~tempering.rl.train`\nand :class:`RLConfig`.\n\nExample::\n\n"
    text += "    f()\n    g()\n"
    assert plain(text) == "Uses --x with train and RLConfig.\nExample:\n    f()\n    g()"


def _commands() -> list[tuple[str, type[object]]]:
    from tempering.cli.eval import EvalCommandConfig
    from tempering.preference import DPOConfig, RewardModelConfig
    from tempering.recipes import RECIPES, load_recipe
    from tempering.recipes.demo import DemoConfig
    from tempering.sft.train import SFTConfig

    fixed: list[tuple[str, type[object]]] = [
        ("rl", RLCommandConfig),
        ("sft", SFTConfig),
        ("dpo", DPOConfig),
        ("rm", RewardModelConfig),
        ("demo", DemoConfig),
        ("eval", EvalCommandConfig),
    ]
    return fixed + [(f"recipe {name}", load_recipe(name)) for name in sorted(RECIPES)]


@pytest.mark.parametrize(("name", "cls"), _commands(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_flag_has_help_text(
    name: str, cls: type[object], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flag whose ``--help`` entry is only its default is undocumented: every config field that
    users set from the command line carries a docstring (tyro's help text)."""
    monkeypatch.setenv("COLUMNS", "100")  # one column: a flag's text follows its own line
    with pytest.raises(SystemExit):
        _tyro_cli(cls, ["--help"], f"tempering {name}", name)
    lines = [line.strip("│ ") for line in capsys.readouterr().out.splitlines()]
    bare: list[str] = []
    for line, after in itertools.pairwise(lines):
        if not re.match(r"--[a-z]", line):
            continue
        # "--flag TYPE  text", or "--flag TYPE" with its text on the next line
        text = (re.split(r"\s{2,}", line, maxsplit=1)[1:] or [after])[0]
        if text.startswith("(default") and line.split()[0] != "--help":
            bare.append(line.split()[0])
    assert bare == [], f"tempering {name}: flags without help text: {bare}"


def test_a_role_at_a_line_start_does_not_cut_the_description(capsys: pytest.CaptureFixture[str]) -> None:
    # ArithmeticProblems' docstring has ":func:`split_problems`" at the start of a line, which
    # the docstring parser would read as a field list and end the description there.
    with pytest.raises(SystemExit):
        _tyro_cli(RLCommandConfig, ["dataset:arithmetic-demo", "--help"], "tempering rl", "rl")
    text = " ".join(capsys.readouterr().out.split())
    assert "held-out split of split_problems (seed, n_test)" in text
