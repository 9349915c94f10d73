"""Ready-made pipelines built from the library's pieces, each runnable as
``tempering recipe NAME [flags]`` (``tempering recipe --list``; docs/recipes/).

- :mod:`tempering.recipes.demo`: ``tempering demo`` (``make demo``): SFT on arithmetic, then RL
  with verifiable rewards from that checkpoint, on the local engine with the tiny model.
- :mod:`tempering.recipes.stages`: the skeleton every recipe is built on (a session that owns
  the run directory and the service; the SFT and RL stages).
- :data:`RECIPES`: the named recipes; each is an attrs config whose ``await config()`` runs it
  and returns a :class:`~tempering.recipes._common.RecipeResult`.

Example::

    from tempering.recipes.demo import DemoConfig, DemoRL, DemoSFT
    demo = DemoConfig(model="tiny", out="/tmp/demo", sft=DemoSFT(steps=40), rl=DemoRL(steps=4))
    summary = asyncio.run(demo())
    config = load_recipe("chat-sft")(out="/tmp/chat")      # same as `tempering recipe chat-sft`
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["RECIPES", "load_recipe"]

RECIPES: dict[str, tuple[str, str]] = {
    "chat-sft": ("tempering.recipes.chat_sft:ChatSFTRecipe", "supervised fine-tuning on the shipped chats"),
    "dpo": ("tempering.recipes.dpo:DPORecipe", "DPO on the shipped preference pairs, from an SFT start"),
    "rlhf": ("tempering.recipes.rlhf:RLHFRecipe", "SFT, then a pairwise reward model, then RL against it"),
    "guess-number": (
        "tempering.recipes.guess_number:GuessNumberRecipe",
        "multi-turn RL: guess a number, the env answers higher/lower",
    ),
    "tic-tac-toe": (
        "tempering.recipes.tic_tac_toe:TicTacToeRecipe",
        "multi-agent RL: tic-tac-toe self-play, evaluated against a random player",
    ),
    "distill": (
        "tempering.recipes.distill:OnPolicyDistillRecipe",
        "on-policy distillation from a teacher checkpoint into a student",
    ),
    "topk-distill": (
        "tempering.recipes.topk_distill:TopKDistillRecipe",
        "off-policy distillation on a teacher's top-K, against SFT on the reference answers",
    ),
    "prompt-distillation": (
        "tempering.recipes.prompt_distillation:PromptDistillationRecipe",
        "a student learns to behave without a long system prompt as the teacher does with it",
    ),
    "sdft": (
        "tempering.recipes.sdft:SDFTRecipe",
        "self-distillation fine-tuning: SFT on the model's own rewrites of the answers, against SFT",
    ),
    "math-rl": (
        "tempering.recipes.math_rl:MathRLRecipe",
        "reasoning RL on math word problems, graded answers",
    ),
    "code-rl": (
        "tempering.recipes.code_rl:CodeRLRecipe",
        "RL on small programming problems, rewarded by unit tests run in a local sandbox",
    ),
    "trajectory-sft": (
        "tempering.recipes.trajectory_sft:TrajectorySFTRecipe",
        "logged RL trajectories back into SFT data (rejection sampling / learning histories)",
    ),
    "algorithm-distillation": (
        "tempering.recipes.algorithm_distillation:AlgorithmDistillationRecipe",
        "learning histories (bandits, Dark Room) -> a transformer that learns in context, held-out tasks",
    ),
    "tool-use": (
        "tempering.recipes.tool_use:ToolUseRecipe",
        "multi-turn RL with tools: a calculator and BM25 search over a shipped corpus",
    ),
    "rubric": ("tempering.recipes.rubric:RubricRecipe", "RL against an LLM judge's rubric score"),
    "twenty-questions": (
        "tempering.recipes.twenty_questions:TwentyQuestionsRecipe",
        "multi-agent RL: twenty questions, an LLM answers the policy's yes/no questions",
    ),
}
"""Recipe name → (``module:Class`` of its config, one-line description)."""


def load_recipe(name: str) -> type[Any]:
    """The config class of recipe ``name`` (imported on demand)."""
    try:
        target, _ = RECIPES[name]
    except KeyError:
        raise KeyError(f"no recipe named {name!r}; recipes: {', '.join(sorted(RECIPES))}") from None
    module, _, cls = target.partition(":")
    loaded: type[Any] = getattr(importlib.import_module(module), cls)
    return loaded
