"""One owner of the policy's model (issue 26): builders that render get the run's model.

``tempering rl --model.base-model X`` alone renders the task's prompts with X's tokenizer; a
builder that names another model or chat format is refused by name before anything runs.
"""

from __future__ import annotations

import dataclasses
import os

import attrs
import pytest
import tyro

from tempering.backend import ModelConfig, load_tokenizer
from tempering.cli.rl import RLCommandConfig
from tempering.envs.tasks import ArithmeticTask, LowercaseTask
from tempering.local.checkpoints import default_root
from tempering.local.errors import ModelCacheError
from tempering.local.model import resolve_model_dir
from tempering.model_info import TINY_MODEL, default_learning_rate, get_lr
from tempering.policy import PolicyMismatchError, bind_policy
from tempering.rl.interleaved import InterleavedRLDatasetBuilder
from tempering.training.schedule import AdamConfig

HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_an_unset_task_takes_the_runs_model_and_renderer() -> None:
    task = bind_policy(ArithmeticTask(), ModelConfig(base_model=HUB))
    assert (task.base_model, task.renderer_name) == (HUB, "smollm2")
    chatml = bind_policy(LowercaseTask(), ModelConfig(renderer_name="role_colon"))
    assert (chatml.base_model, chatml.renderer_name) == (TINY_MODEL, "role_colon")


def test_a_task_naming_another_model_or_renderer_is_refused_by_field() -> None:
    with pytest.raises(
        PolicyMismatchError,
        match=r"dataset\.base_model is 'Qwen/Qwen3-8B' but the run's base model is 'tempering/tiny'",
    ):
        bind_policy(ArithmeticTask(base_model="Qwen/Qwen3-8B"), ModelConfig())
    with pytest.raises(
        PolicyMismatchError,
        match=r"dataset\.renderer_name is 'llama3' but the run's renderer is 'chatml'.*renderer-name llama3",
    ):
        bind_policy(ArithmeticTask(renderer_name="llama3"), ModelConfig())
    same = ArithmeticTask(base_model=TINY_MODEL, renderer_name="chatml")
    assert bind_policy(same, ModelConfig()) is same  # agreeing fields: nothing to change


def test_interleaved_sources_are_bound_one_by_one() -> None:
    builder = InterleavedRLDatasetBuilder(
        sources={"a": ArithmeticTask(), "b": LowercaseTask()}, weights={"a": 1, "b": 1}, groups_per_batch=2
    )
    bound = bind_policy(builder, ModelConfig(base_model=HUB))
    assert {name: b.base_model for name, b in bound.sources.items()} == {"a": HUB, "b": HUB}  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.raises(PolicyMismatchError, match=r"dataset\.sources\['b'\]\.base_model"):
        bind_policy(
            attrs.evolve(builder, sources={"a": ArithmeticTask(), "b": LowercaseTask(base_model="x/y")}),
            ModelConfig(),
        )


@dataclasses.dataclass(frozen=True)
class CookbookShaped:
    """The Tinker Cookbook's builders carry these two fields."""

    model_name_for_tokenizer: str | None = None
    renderer_name: str | None = None
    batch_size: int = 4


def test_a_cookbook_shaped_builder_is_filled_and_checked() -> None:
    filled = bind_policy(CookbookShaped(), ModelConfig(base_model=HUB))
    assert filled == CookbookShaped(HUB, "smollm2")
    with pytest.raises(
        PolicyMismatchError, match=r"dataset\.model_name_for_tokenizer is 'meta-llama/Llama-3.1-8B'"
    ):
        bind_policy(CookbookShaped("meta-llama/Llama-3.1-8B"), ModelConfig(base_model=HUB))


def test_the_rl_command_has_no_dataset_model_flags() -> None:
    with pytest.raises(SystemExit):
        tyro.cli(
            RLCommandConfig,
            args=["--run.log-dir", "x", "dataset:arithmetic-task", "--dataset.base-model", HUB],
        )


def test_rl_model_flag_alone_renders_prompts_with_that_models_tokenizer() -> None:
    """Before: the task kept ``tempering/tiny`` unless ``--dataset.base-model`` repeated the model,
    so a run of SmolLM2 sampled from prompts in the tiny model's token ids."""
    try:
        resolve_model_dir(HUB, default_root())
    except ModelCacheError as exc:
        if os.environ.get("TEMPERING_REQUIRE_REAL_MODEL") == "1":
            pytest.fail(f"the real model must be present here (make test pulls it): {exc}")
        pytest.skip(f"{HUB} is not in the model cache: {exc}")
    import asyncio

    config = tyro.cli(
        RLCommandConfig,
        args=[
            "--run.log-dir",
            "x",
            "--model.base-model",
            HUB,
            "dataset:arithmetic-task",
            "--dataset.batch-size",
            "1",
        ],
    )
    task = bind_policy(config.dataset, config.model)

    async def first_prompt(t: object) -> list[int]:
        train, _ = await t()  # pyright: ignore[reportCallIssue, reportUnknownVariableType]
        envs = await train.get_batch(0)[0].make_envs()  # pyright: ignore[reportUnknownMemberType]
        observation, _stop = await envs[0].initial_observation()  # pyright: ignore[reportUnknownMemberType]
        return observation.to_ints()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]

    tokens = asyncio.run(first_prompt(task))
    text = load_tokenizer(HUB).decode(tokens)
    assert "<|im_start|>user" in text
    assert "What is" in text
    assert tokens != asyncio.run(first_prompt(config.dataset))  # unbound: the tiny model's ids


def test_one_learning_rate_policy_model_aware_and_an_explicit_zero_refused() -> None:
    assert default_learning_rate(TINY_MODEL, "sft") == 2e-3
    assert default_learning_rate(HUB, "sft") == pytest.approx(get_lr(HUB))
    assert default_learning_rate(HUB, "sft", lora=False) == pytest.approx(get_lr(HUB, lora=False))
    assert default_learning_rate("acme/unknown-7b", "rm") == 2e-4
    assert default_learning_rate(HUB, "rl") == 4e-5
    assert default_learning_rate(HUB, "dpo") == 1e-5
    unset = AdamConfig()
    assert unset.learning_rate is None
    assert unset.for_model(HUB, "sft").learning_rate == pytest.approx(get_lr(HUB))
    assert AdamConfig(learning_rate=3e-4).for_model(HUB, "sft").learning_rate == 3e-4  # given: kept
    with pytest.raises(ValueError, match="unset"):
        unset.lr(0, 10)
    with pytest.raises(ValueError, match=r"learning_rate must be a positive number, got 0\.0"):
        AdamConfig(learning_rate=0.0)
