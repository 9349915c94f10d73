"""tempering.model_info against the Tinker Cookbook 0.6.1's model table and learning-rate formula."""

from __future__ import annotations

import logging

import pytest

from tempering.model_info import (
    MODELS,
    UnknownModelError,
    get_lr,
    model_info,
    recommended_renderer,
    resolve_renderer_name,
    warn_if_renderer_not_recommended,
)
from tempering.renderers import LEFT_OUT, RENDERERS

model_info_ref = pytest.importorskip("tinker_cookbook.model_info")
hyperparams_ref = pytest.importorskip("tinker_cookbook.hyperparam_utils")


def _reference_names() -> list[str]:
    tables = [
        model_info_ref.get_llama_info(),
        model_info_ref.get_qwen_info(),
        model_info_ref.get_deepseek_info(),
        model_info_ref.get_gpt_oss_info(),
        model_info_ref.get_moonshot_info(),
        model_info_ref.get_zai_info(),
        model_info_ref.get_nvidia_info(),
        model_info_ref.get_thinkingmachines_info(),
    ]
    return sorted(f"{t[k].organization}/{k}" for t in tables for k in t)


def test_every_reference_model_is_listed() -> None:
    assert sorted(MODELS) == _reference_names()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_recommended_renderers_match_the_reference(name: str) -> None:
    assert list(model_info(name).renderers) == model_info_ref.get_recommended_renderer_names(name)
    assert recommended_renderer(name) == model_info_ref.get_recommended_renderer_name(name)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_recommended_renderer_is_registered_or_refused_with_a_reason(name: str) -> None:
    for renderer in model_info(name).renderers:
        assert renderer in RENDERERS or renderer in LEFT_OUT, (name, renderer)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("lora", [True, False])
def test_learning_rate_matches_the_reference(name: str, lora: bool) -> None:
    try:
        expected = hyperparams_ref.get_lr(name, is_lora=lora)
    except Exception:  # NotImplementedError, or ConfigurationError for a model it has no formula for
        with pytest.raises(NotImplementedError, match="give a learning rate"):
            get_lr(name, lora)
        return
    assert get_lr(name, lora) == expected


def test_learning_rate_known_values() -> None:
    assert get_lr("Qwen/Qwen3-8B") == pytest.approx(5e-4 * (2000 / 4096) ** 0.0775)
    assert get_lr("meta-llama/Llama-3.1-8B", lora=False) == pytest.approx(5e-5 * (2000 / 4096) ** 0.781)
    assert get_lr("Qwen/Qwen3-8B:peft:131072") == get_lr("Qwen/Qwen3-8B")


def test_unknown_model_is_named() -> None:
    with pytest.raises(UnknownModelError, match="acme/Model-7B"):
        model_info("acme/Model-7B")
    with pytest.raises(UnknownModelError):
        get_lr("acme/Model-7B")


def test_resolve_renderer_name_defaults_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    assert resolve_renderer_name("Qwen/Qwen3.5-9B", None) == "qwen3_5"
    assert resolve_renderer_name("deepseek-ai/DeepSeek-V4.1-Flash", None) == "deepseekv4_1"
    assert resolve_renderer_name("tempering/tiny", None) == "chatml"
    with caplog.at_level(logging.WARNING, logger="tempering.model_info"):
        assert resolve_renderer_name("Qwen/Qwen3.5-9B", "llama3") == "llama3"
    assert "not one recommended for Qwen/Qwen3.5-9B" in caplog.text
    assert warn_if_renderer_not_recommended("Qwen/Qwen3-8B", "qwen3_disable_thinking")
    assert warn_if_renderer_not_recommended("my/own-model", "chatml")


def test_model_config_renderer_defaults_to_the_recommended_one(caplog: pytest.LogCaptureFixture) -> None:
    from tempering.backend import ModelConfig

    assert ModelConfig(base_model="Qwen/Qwen3.5-9B").renderer() == "qwen3_5"
    assert ModelConfig(base_model="openai/gpt-oss-20b:peft:131072").renderer() == "gpt_oss_no_sysprompt"
    assert ModelConfig().renderer() == "chatml"  # the local tiny model
    chosen = ModelConfig(base_model="Qwen/Qwen3.5-9B", renderer_name="qwen3_5_disable_thinking")
    with caplog.at_level(logging.WARNING, logger="tempering.model_info"):
        assert chosen.renderer() == "qwen3_5_disable_thinking"
    assert not caplog.text  # a recommended alternative is not warned about
    with caplog.at_level(logging.WARNING, logger="tempering.model_info"):
        assert ModelConfig(base_model="Qwen/Qwen3.5-9B", renderer_name="chatml").renderer() == "chatml"
    assert "not one recommended" in caplog.text


def test_recipes_learning_rate_uses_the_one_policy() -> None:
    from tempering.recipes._common import recipe_learning_rate

    assert recipe_learning_rate("Qwen/Qwen3-8B", None) == get_lr("Qwen/Qwen3-8B")
    assert recipe_learning_rate("openai/gpt-oss-20b", None) == 2e-4  # no calibrated formula
    assert recipe_learning_rate("Qwen/Qwen3-8B", None, "dpo") == 1e-5  # a stage's own default
    assert recipe_learning_rate("Qwen/Qwen3-8B", None, "rl", tiny=2e-4) == 4e-5  # tiny= is the tiny model's
    assert recipe_learning_rate("Qwen/Qwen3-8B", 3e-4) == 3e-4
