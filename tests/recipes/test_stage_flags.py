"""Recipes hold their stages as nested configs (``sft: SFTStage``, ``rl: RLStage``), checked by
the stages' validators; the old flat flags (``--sft-steps``) still work through the table that
``tempering.cli._aliases`` generates from the config classes, and every recipe keeps the
defaults its flat flags had (the table below: the flat defaults of main at de14eb7)."""

from __future__ import annotations

import re
from typing import Any

import attrs
import pytest

from tempering.cli import _tyro_cli
from tempering.cli._aliases import expand_aliases, flat_aliases
from tempering.recipes import RECIPES, load_recipe
from tempering.recipes.chat_sft import ChatSFTRecipe, chat_stage
from tempering.recipes.dpo import DPORecipe
from tempering.recipes.guess_number import GuessNumberRecipe
from tempering.recipes.stages import FLAT, RENAMED, RLStage, SFTStage

# Every stage flag each recipe had before its stages were nested, with its default then.
_FLAT_DEFAULTS: dict[str, dict[str, Any]] = {
    "chat-sft": {"steps": 300, "batch-size": 16, "learning-rate": None, "eval-every": 100},
    "dpo": {
        "sft-steps": 300, "sft-batch-size": 16, "sft-learning-rate": None, "sft-eval-every": 100,
        "dpo-steps": 60, "dpo-batch-size": 8, "dpo-learning-rate": None, "eval-every": 20,
    },
    "rlhf": {
        "sft-steps": 300, "sft-batch-size": 16, "sft-learning-rate": None, "sft-eval-every": 100,
        "rl-steps": 20, "rl-prompts": 8, "rl-learning-rate": None, "eval-every": 10, "rm-steps": 60,
        "rm-batch-size": 8, "rm-learning-rate": None, "rm-eval-every": 20, "rm-from-sft": True,
    },
    "guess-number": {
        "rl-steps": 30, "rl-batch-size": 8, "rl-learning-rate": 1e-4, "sft-steps": 300, "sft-batch-size": 32,
        "sft-learning-rate": 1e-3, "sft-games": 4000, "rl-eval-every": 10, "low": 0, "high": 9,
        "max-turns": 4, "turn-cost": 0.1, "invalid-reward": -1.0,
    },
    "tic-tac-toe": {
        "rl-steps": 30, "rl-batch-size": 8, "rl-learning-rate": 1e-4, "sft-steps": 600, "sft-batch-size": 32,
        "sft-learning-rate": 1e-3, "sft-games": 2000,
    },
    "math-rl": {
        "rl-steps": 40, "rl-batch-size": 16, "sft-batch-size": 32, "sft-learning-rate": 2e-3,
        "sft-steps": None, "sft-weight-decay": 0.1, "rl-learning-rate": None,
    },
    "code-rl": {
        "rl-steps": 10, "rl-batch-size": 8, "rl-learning-rate": 1e-5, "sft-steps": 200, "sft-batch-size": 32,
        "sft-learning-rate": 1e-3, "rl-eval-every": 5,
    },
    "trajectory-sft": {
        "steps": 600, "batch-size": 64, "learning-rate": 2e-3, "weight-decay": 0.1, "teacher-sft-steps": 600,
        "teacher-rl-steps": 80, "teacher-rl-batch-size": 16, "teacher-group-size": 16,
        "teacher-learning-rate": 2e-4,
    },
    "algorithm-distillation": {"sft-steps": 100, "sft-batch-size": 8, "sft-learning-rate": 2e-3},
    "tool-use": {
        "rl-steps": 8, "rl-batch-size": 4, "rl-learning-rate": 1e-4, "sft-steps": 150, "sft-batch-size": 16,
        "sft-learning-rate": 2e-3, "sft-examples": 600,
    },
    "rubric": {
        "rl-steps": 20, "rl-batch-size": 8, "rl-learning-rate": 1e-4, "sft-steps": 300, "sft-batch-size": 32,
        "sft-learning-rate": 2e-3,
    },
    "distill": {
        "teacher-steps": 700, "teacher-batch-size": 64, "teacher-learning-rate": 2e-3,
        "teacher-weight-decay": 0.1, "warmup-steps": 600, "warmup-batch-size": 32,
        "warmup-learning-rate": 1e-3, "warmup-weight-decay": 0.0, "warmup-problems": 1000,
        "distill-steps": 40, "batch-size": 16, "learning-rate": 1e-4, "group-size": 8,
    },
    "topk-distill": {
        "teacher-steps": 300, "teacher-batch-size": 16, "teacher-learning-rate": None, "steps": 100,
        "batch-size": 16, "learning-rate": None,
    },
    "prompt-distillation": {"steps": 100, "batch-size": 16, "learning-rate": None},
    "sdft": {"steps": 100, "batch-size": 16, "learning-rate": None},
    "twenty-questions": {
        "rl-steps": 8, "rl-batch-size": 2, "rl-learning-rate": 1e-4, "sft-steps": 120, "sft-batch-size": 16,
        "sft-learning-rate": 2e-3, "sft-games": 1000,
    },
}  # fmt: skip


def _value(config: object, flag: str, aliases: dict[str, str]) -> object:
    """The value of ``--flag`` in ``config``: a top-level field, else a nested one by the table."""
    path = aliases.get(flag, flag).replace("-", "_").split(".")
    for part in path:
        config = getattr(config, part)
    return config


@pytest.mark.parametrize("name", sorted(_FLAT_DEFAULTS))
def test_old_flat_flags_keep_their_defaults(name: str) -> None:
    cls = load_recipe(name)
    aliases, config = flat_aliases(cls), cls()
    for flag, default in _FLAT_DEFAULTS[name].items():
        assert _value(config, flag, aliases) == default, f"{name} --{flag}"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_alias_table_targets_real_nested_flags(name: str) -> None:
    cls = load_recipe(name)
    own = {f.name.replace("_", "-") for f in attrs.fields(cls)}
    for old, new in flat_aliases(cls).items():
        assert old not in own, f"{name}: --{old} is a real flag and an alias"
        group, _, leaf = new.partition(".")
        stage = attrs.fields_dict(cls)[group.replace("-", "_")].default
        assert leaf.replace("-", "_") in attrs.fields_dict(type(stage)), f"{name}: --{old} -> --{new}"


def test_both_spellings_parse_to_one_config() -> None:
    flat = ["--sft-steps", "16", "--rl-batch-size=2", "--rl-eval-every", "1", "--rl-learning-rate", "3e-4"]
    nested = ["--sft.steps", "16", "--rl.batch-size=2", "--rl.eval-every", "1", "--rl.learning-rate", "3e-4"]
    a = _tyro_cli(GuessNumberRecipe, [*flat, "--high", "7"], "t", "t")
    b = _tyro_cli(GuessNumberRecipe, [*nested, "--rules.high", "7"], "t", "t")
    assert a == b
    assert (a.sft.steps, a.rl.batch_size, a.rl.eval_every, a.rl.learning_rate) == (16, 2, 1, 3e-4)
    assert a.sft.batch_size == 32  # the recipe's own default, kept beside the flag given
    assert (a.rules.low, a.rules.high, a.rules.max_turns) == (0, 7, 4)  # a task's settings nest too
    chat = _tyro_cli(ChatSFTRecipe, ["--steps", "30", "--learning-rate", "1e-3"], "t", "t")
    assert (chat.sft.steps, chat.sft.learning_rate, chat.sft.eval_every) == (30, 1e-3, 100)
    assert expand_aliases(ChatSFTRecipe, ["--steps", "3", "--", "--steps"]) == [
        "--sft.steps",
        "3",
        "--",
        "--steps",
    ]


def test_a_flag_given_both_ways_is_refused() -> None:
    from tempering.cli._checks import FlagError

    with pytest.raises(
        FlagError, match=r"--sft-steps and --sft\.steps are both given; they set the same --sft\.steps"
    ):
        _tyro_cli(GuessNumberRecipe, ["--sft-steps", "3", "--sft.steps", "4"], "t", "t")
    with pytest.raises(FlagError, match=r"--sft-steps is given twice"):
        _tyro_cli(GuessNumberRecipe, ["--sft-steps", "3", "--sft-steps=4"], "t", "t")


def test_stages_validate_their_fields() -> None:
    with pytest.raises(ValueError, match=r"SFTStage\.batch_size must be >= 1, got 0"):
        SFTStage(10, 0)
    with pytest.raises(ValueError, match=r"SFTStage\.steps must be >= 0, got -1"):
        SFTStage(-1)
    with pytest.raises(ValueError, match=r"RLStage\.steps must be >= 1, got 0"):
        RLStage(0)
    with pytest.raises(ValueError, match=r"RLStage\.batch_size must be >= 1, got 0"):
        RLStage(5, batch_size=0)
    with pytest.raises(ValueError, match=r"RLStage\.learning_rate must be a positive number, got 0"):
        RLStage(5, 0.0)  # an explicit 0 is refused, never replaced by the default
    with pytest.raises(
        ValueError, match=r"GuessNumberRecipe\.sft\.steps \(--sft\.steps\) must be > 0, got 0"
    ):
        GuessNumberRecipe(sft=SFTStage(0, 32, 1e-3))
    with pytest.raises(ValueError, match=r"DPORecipe\.sft\.steps \(--sft\.steps\) must be > 0 without"):
        DPORecipe(sft=chat_stage(0))
    DPORecipe(sft=chat_stage(0), init_state="tempering://some/weights/final")  # no SFT stage: allowed
    with pytest.raises(ValueError, match="resolve it first"):
        SFTStage(3).adam()


def test_converted_stages_are_the_stages_built_before() -> None:
    """Each stage a recipe built from flat fields (``SFTStage(self.steps, self.batch_size, lr,
    schedule="linear")``) is now its nested default, with every setting that was not a flag."""
    from tempering.recipes.algorithm_distillation import AlgorithmDistillationRecipe
    from tempering.recipes.distill import OnPolicyDistillRecipe
    from tempering.recipes.math_rl import MathRLRecipe
    from tempering.recipes.prompt_distillation import PromptDistillationRecipe
    from tempering.recipes.sdft import SDFTRecipe
    from tempering.recipes.topk_distill import TopKDistillRecipe
    from tempering_protocols import TrainOnWhat

    linear = SFTStage(100, 16, None, schedule="linear")
    assert SDFTRecipe().sft == PromptDistillationRecipe().student == TopKDistillRecipe().student == linear
    assert TopKDistillRecipe().teacher_sft == SFTStage(300, 16, None, schedule="linear")
    distill = OnPolicyDistillRecipe()
    assert distill.teacher_sft == SFTStage(700, 64, 2e-3, weight_decay=0.1)
    assert distill.warmup == SFTStage(600, 32, 1e-3, weight_decay=0.0)
    assert distill.distill == RLStage(40, 1e-4, batch_size=16)
    ad = AlgorithmDistillationRecipe().sft
    assert ad == SFTStage(100, 8, 2e-3, train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES)
    math = MathRLRecipe()
    assert math.sft.stage(tiny=True) == SFTStage(300, 32, 2e-3, weight_decay=0.1)
    assert math.sft.stage(tiny=False).steps == 0


# The demo's flat flags and what each meant in each model's preset before the stages were nested.
_DEMO_PRESETS: dict[str, dict[str, object]] = {
    "smollm2": {
        "sft-steps": 40, "sft-batch-size": 32, "sft-learning-rate": 1e-3, "sft-eval-every": 0,
        "sft-weight-decay": 0.0, "rl-steps": 8, "rl-batch-size": 8, "rl-learning-rate": 1e-4,
        "rl-eval-every": 8, "rl-lr-schedule": "linear", "rl-loss-fn": "importance_sampling",
        "rl-num-substeps": 1,
    },
    "tiny": {
        "sft-steps": 600, "sft-batch-size": 64, "sft-learning-rate": 2e-3, "sft-eval-every": 100,
        "sft-weight-decay": 0.1, "rl-steps": 80, "rl-batch-size": 16, "rl-learning-rate": 2e-4,
        "rl-eval-every": 10, "rl-lr-schedule": "linear", "rl-loss-fn": "importance_sampling",
        "rl-num-substeps": 1,
    },
}  # fmt: skip


@pytest.mark.parametrize("model", sorted(_DEMO_PRESETS))
def test_demo_flags_keep_their_presets_and_both_spellings_work(model: str) -> None:
    from tempering.cli._checks import FlagError
    from tempering.recipes.demo import DemoConfig

    aliases = flat_aliases(DemoConfig)
    sizes = _tyro_cli(DemoConfig, ["--model", model], "t", "t").sizes()
    for flag, before in _DEMO_PRESETS[model].items():
        group, leaf = aliases[flag].replace("-", "_").split(".")
        leaf = "save_every" if (group, leaf) == ("rl", "eval_every") else leaf  # checkpoints evaluated
        assert getattr(getattr(sizes, group), leaf) == before, f"{model} --{flag}"
    flat = [
        "--model",
        model,
        "--sft-steps",
        "5",
        "--rl-batch-size=3",
        "--rl-eval-every",
        "2",
        "--rl-loss-fn",
        "ppo",
    ]
    nested = [
        "--model",
        model,
        "--sft.steps",
        "5",
        "--rl.batch-size=3",
        "--rl.eval-every",
        "2",
        "--rl.loss-fn",
        "ppo",
    ]
    a, b = _tyro_cli(DemoConfig, flat, "t", "t"), _tyro_cli(DemoConfig, nested, "t", "t")
    assert a == b
    z = a.sizes()
    assert (z.sft.steps, z.rl.batch_size, z.rl.save_every, z.rl.loss_fn) == (5, 3, 2, "ppo")
    assert z.sft.batch_size == _DEMO_PRESETS[model]["sft-batch-size"]  # the preset, beside the flag given
    with pytest.raises(FlagError, match=r"--rl-steps and --rl\.steps are both given"):
        _tyro_cli(DemoConfig, ["--rl-steps", "2", "--rl.steps", "3"], "t", "t")


_TEACHER_RATE = "teacher_rl.learning_rate"


@pytest.mark.parametrize(
    ("name", "flat", "nested", "path", "value"),
    [
        ("distill", "--batch-size", "--distill.batch-size", "distill.batch_size", 3),
        ("distill", "--teacher-steps", "--teacher-sft.steps", "teacher_sft.steps", 3),
        ("distill", "--warmup-learning-rate", "--warmup.learning-rate", "warmup.learning_rate", 0.5),
        ("topk-distill", "--steps", "--student.steps", "student.steps", 3),
        ("topk-distill", "--teacher-batch-size", "--teacher-sft.batch-size", "teacher_sft.batch_size", 3),
        ("prompt-distillation", "--batch-size", "--student.batch-size", "student.batch_size", 3),
        ("sdft", "--learning-rate", "--sft.learning-rate", "sft.learning_rate", 0.5),
        ("algorithm-distillation", "--sft-batch-size", "--sft.batch-size", "sft.batch_size", 3),
        ("math-rl", "--sft-steps", "--sft.steps", "sft.steps", 3),
        ("math-rl", "--sft-weight-decay", "--sft.weight-decay", "sft.weight_decay", 0.5),
        ("trajectory-sft", "--teacher-sft-steps", "--teacher-sft.steps", "teacher_sft.steps", 3),
        ("trajectory-sft", "--teacher-rl-steps", "--teacher-rl.steps", "teacher_rl.steps", 3),
        ("trajectory-sft", "--teacher-rl-batch-size", "--teacher-rl.batch-size", "teacher_rl.batch_size", 3),
        ("trajectory-sft", "--teacher-learning-rate", "--teacher-rl.learning-rate", _TEACHER_RATE, 0.5),
        ("trajectory-sft", "--teacher-rl-learning-rate", "--teacher-rl.learning-rate", _TEACHER_RATE, 0.5),
    ],
)  # fmt: skip
def test_converted_recipes_take_both_spellings_and_refuse_both_at_once(
    name: str, flat: str, nested: str, path: str, value: float
) -> None:
    from tempering.cli._checks import FlagError

    cls = load_recipe(name)
    a = _tyro_cli(cls, [flat, str(value)], "t", "t")
    b = _tyro_cli(cls, [f"{nested}={value}"], "t", "t")
    assert a == b
    assert _value(a, path.replace("_", "-"), {}) == value
    with pytest.raises(FlagError, match=f"{flat} and {re.escape(nested)} are both given"):
        _tyro_cli(cls, [flat, str(value), nested, str(value)], "t", "t")


def test_stage_field_metadata_keys_match_the_cli() -> None:
    from tempering.cli import _aliases

    assert (_aliases._FLAT, _aliases._RENAMED) == (FLAT, RENAMED)


@pytest.mark.parametrize("base_model", ["tempering/tiny", "smollm2-135m-instruct"])
def test_trajectory_sft_teacher_stages_are_the_stages_built_before(base_model: str) -> None:
    """The self-run teacher's stages, from the nested ``teacher_sft`` / ``teacher_rl``: at the
    defaults exactly what the flat fields built (the base model's demo preset with the flags'
    tiny-demo steps, batch and rate; SFT evaluated every 10 steps, RL at the preset's checkpoint
    period without periodic checkpoints); a setting given either way replaces its preset value."""
    from tempering.recipes.trajectory_sft import TrajectorySFTRecipe, teacher_demo, teacher_stages

    sizes = teacher_demo(base_model).sizes()
    before_sft = attrs.evolve(sizes.sft, steps=600, eval_every=10)
    before_rl = attrs.evolve(
        sizes.rl, steps=80, learning_rate=2e-4, batch_size=16, eval_every=sizes.rl.save_every, save_every=0
    )
    assert teacher_stages(TrajectorySFTRecipe(base_model=base_model)) == (before_sft, before_rl)
    flat = ["--base-model", base_model, "--teacher-sft-steps", "7", "--teacher-rl-batch-size", "3"]
    nested = [
        "--base-model", base_model, "--teacher-sft.steps", "7", "--teacher-rl.batch-size", "3",
        "--teacher-sft.batch-size", "5", "--teacher-rl.eval-every", "2",
    ]  # fmt: skip
    sft, rl = teacher_stages(_tyro_cli(TrajectorySFTRecipe, flat, "t", "t"))
    assert (sft, rl) == (attrs.evolve(before_sft, steps=7), attrs.evolve(before_rl, batch_size=3))
    sft, rl = teacher_stages(_tyro_cli(TrajectorySFTRecipe, nested, "t", "t"))
    assert (sft.steps, sft.batch_size, sft.learning_rate) == (7, 5, sizes.sft.learning_rate)
    assert (rl.batch_size, rl.eval_every, rl.save_every, rl.steps) == (3, 2, 0, 80)
