"""``tempering recipe code-rl``: RL on small programming problems, graded by unit tests run in
a sandbox.

1. Problems: the shipped 40 one-function problems (``tempering-assets:code/problems.jsonl``),
   ``n_test`` held out by a seeded split.
2. SFT warm start (``sft_steps > 0``; set 0 for a hosted instruct model): the training problems'
   reference solutions as replies in a ```` ```python ```` block; run directory ``<out>/sft``.
3. RL (:func:`tempering.rl.train`) on :class:`~tempering.envs.code.CodeTask`: ``rl_batch_size``
   problems × ``group_size`` replies per step, each reply's program run against the problem's
   tests in a :class:`~tempering.tools.sandbox.LocalSandbox`, reward the pass fraction (or
   all-pass, ``--reward all``) minus 0.1 without a code block; run directory ``<out>/rl``.
4. Evaluation before and after RL, on the training and the held-out problems alike:
   ``eval_samples`` replies per problem at temperature 1 with a seed of its own: mean pass
   fraction, all-pass rate, code-block rate.

Example::

    tempering recipe code-rl                                  # defaults: docs/recipes/code-rl.md
    tempering recipe code-rl --sft-steps 20 --rl-steps 2 --out /tmp/code
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from tempering.envs.code import (
    CODE_SYSTEM_PROMPT,
    CodeGrading,
    CodeGroupBuilder,
    CodeProblem,
    CodeTask,
    RewardMode,
    code_messages,
)
from tempering.model_info import resolve_renderer_name
from tempering.recipes._common import (
    TINY_MODEL,
    RecipeResult,
    close_service,
    finish,
    fresh_model,
    prepare_run_dir,
    recipe_service,
    require_positive,
)
from tempering.recipes.stages import SFTStage, sft_stage_at
from tempering.renderers import get_renderer
from tempering.tools.sandbox import LocalSandbox
from tempering_protocols import Renderer, SamplingClient

__all__ = ["CodeRLRecipe", "evaluate_code", "write_solutions"]


def write_solutions(path: Path, problems: Sequence[CodeProblem], system_prompt: str | None) -> Path:
    """The problems' reference solutions as chat rows (``{"messages": [...]}``); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for p in problems:
            if p.solution is None:
                raise ValueError(f"code-rl SFT: problem {p.id!r} has no reference solution")
            reply = {"role": "assistant", "content": f"```python\n{p.solution}```"}
            f.write(json.dumps({"messages": [*code_messages(p, system_prompt), reply]}) + "\n")
    return path


async def evaluate_code(
    sampler: SamplingClient,
    problems: Sequence[CodeProblem],
    renderer: Renderer,
    grading: CodeGrading,
    *,
    samples: int,
    max_tokens: int,
    seed: int,
) -> dict[str, float]:
    """``samples`` replies per problem at temperature 1: mean ``pass_fraction``, ``all_pass``
    and ``format`` (a code block was found) over every reply.

    Example::

        await evaluate_code(sampler, test_problems, renderer, grading, samples=4, max_tokens=96, seed=0)
    """
    from tempering.rl.policy import TinkerTokenCompleter
    from tempering.rl.rollouts import RolloutConfig, rollout_batch

    builders = [CodeGroupBuilder(p, renderer, grading, group_size=samples) for p in problems]
    rollouts = await rollout_batch(
        builders, TinkerTokenCompleter(sampler, max_tokens, 1.0), RolloutConfig(), seed=seed
    )
    metrics = [
        t.transitions[-1].metrics for r in rollouts if r.group is not None for t in r.group.trajectories_G
    ]
    failed = sum(r.n_failed for r in rollouts)
    if failed or not metrics:
        raise RuntimeError(f"code-rl evaluation: {failed} episodes failed: {[r.failures for r in rollouts]}")
    keys = ("pass_fraction", "all_pass", "format", "sandbox_limit")
    return {k: sum(float(m[k]) for m in metrics) / len(metrics) for k in keys} | {
        "replies": float(len(metrics))
    }


@attrs.frozen(kw_only=True)
class CodeRLRecipe:
    """Code RL: SFT on reference solutions, then RL graded by tests in a sandbox; calling it runs it."""

    out: str | None = None
    """Run directory (replaced if it exists); default ``runs/code-rl-<timestamp>``."""
    base_model: str = TINY_MODEL
    renderer_name: str | None = None
    lora_rank: int | None = None
    """LoRA rank; default: full fine-tuning (0) for the tiny model, 32 otherwise."""
    seed: int = 0
    n_test: int = 8
    """Problems held out of SFT and RL (of 40)."""
    reward: RewardMode = "fraction"
    """``fraction``: the share of tests passed; ``all``: 1 only when every test passes."""
    sft_steps: int = 200
    """SFT steps on the reference solutions; 0 skips SFT (RL starts from the base model)."""
    init_state: str | None = None
    """A ``save_state`` checkpoint to start RL from instead of the SFT stage (which is skipped,
    with its evaluation: the figures before RL are the checkpoint's own run's)."""
    sft_batch_size: int = 32
    sft_learning_rate: float = 1e-3
    rl_steps: int = 10
    rl_batch_size: int = 8
    group_size: int = 8
    rl_learning_rate: float = 1e-5
    """1e-4 (the other recipes' RL rate) undoes the SFT stage here: docs/recipes/code-rl.md."""
    rl_eval_every: int = 5
    max_tokens: int = 128
    eval_samples: int = 4
    sandbox_seconds: float = 5.0
    """Wall- and CPU-time limit of one grading run."""
    progress: bool = True

    def __attrs_post_init__(self) -> None:
        require_positive(
            "CodeRLRecipe",
            sft_batch_size=self.sft_batch_size,
            rl_steps=self.rl_steps,
            rl_batch_size=self.rl_batch_size,
            group_size=self.group_size,
            max_tokens=self.max_tokens,
            eval_samples=self.eval_samples,
            sandbox_seconds=self.sandbox_seconds,
        )
        if self.sft_steps < 0:
            raise ValueError(f"CodeRLRecipe.sft_steps (--sft-steps) must be >= 0, got {self.sft_steps}")
        self.task().problems()  # validates n_test against the problem file

    def task(self) -> CodeTask:
        """The RL task of this config."""
        sandbox = LocalSandbox(
            wall_seconds=self.sandbox_seconds, cpu_seconds=max(1, round(self.sandbox_seconds))
        )
        return CodeTask(
            base_model=self.base_model,
            renderer_name=self.renderer_name,
            n_test=self.n_test,
            seed=self.seed,
            batch_size=self.rl_batch_size,
            group_size=self.group_size,
            test_group_size=self.eval_samples,
            n_batches=self.rl_steps,
            grading=CodeGrading(sandbox=sandbox, reward=self.reward),
            system_prompt=CODE_SYSTEM_PROMPT,
        )

    async def __call__(self) -> RecipeResult:
        return await _run(self)


async def _run(config: CodeRLRecipe) -> RecipeResult:
    from tempering.backend import ModelConfig, load_tokenizer
    from tempering.rl import RLConfig, train
    from tempering.training import AdamConfig, LRSchedule, RunConfig

    t_start = time.monotonic()
    out = prepare_run_dir("code-rl", config.out)
    service = recipe_service(config.base_model)
    task = config.task()
    train_problems, test_problems = task.problems()
    renderer = get_renderer(
        resolve_renderer_name(config.base_model, config.renderer_name), load_tokenizer(config.base_model)
    )

    async def evaluate(sampler: SamplingClient, stage: str) -> dict[str, float]:
        figures: dict[str, float] = {}
        for split, problems in (("train", train_problems), ("test", test_problems)):
            found = await evaluate_code(
                sampler,
                problems,
                renderer,
                task.grading,
                samples=config.eval_samples,
                max_tokens=config.max_tokens,
                seed=config.seed + 7919,
            )
            figures |= {f"{stage}_{split}_{k}": v for k, v in found.items()}
        print(f"tempering recipe code-rl: {stage}: {_describe(figures, stage)}", flush=True)
        return figures

    model = fresh_model(
        config.base_model, config.lora_rank, seed=config.seed, renderer_name=config.renderer_name
    )
    start_state = config.init_state
    details: dict[str, float] = {}
    if start_state is None and config.sft_steps > 0:
        train_path = write_solutions(out / "data" / "train.jsonl", train_problems, CODE_SYSTEM_PROMPT)
        print(f"tempering recipe code-rl: SFT, {config.sft_steps} steps -> {out / 'sft'}", flush=True)
        sft = await sft_stage_at(
            out / "sft",
            service=service,
            model=model,
            train_path=train_path,
            stage=SFTStage(
                config.sft_steps, config.sft_batch_size, config.sft_learning_rate, max_warmup_steps=20
            ),
            seed=config.seed,
            progress=config.progress,
        )
        start_state = sft.final.state_path
        details |= await evaluate(
            await service.create_sampling_client(model_path=sft.final.sampler_path), "sft"
        )
    rl_model = model if start_state is None else ModelConfig(
        base_model=config.base_model, init_state=start_state, renderer_name=config.renderer_name
    )  # fmt: skip
    rl_config = RLConfig(
        run=RunConfig(
            log_dir=str(out / "rl"),
            if_exists="overwrite",
            save_every=0,
            eval_every=config.rl_eval_every,
            progress=config.progress,
        ),
        dataset=task,
        model=rl_model,
        adam=AdamConfig(learning_rate=config.rl_learning_rate, beta2=0.98, schedule=LRSchedule("constant")),
        num_steps=config.rl_steps,
        max_tokens=config.max_tokens,
        temperature=1.0,
        seed=config.seed,
    )
    print(
        f"tempering recipe code-rl: RL, {config.rl_steps} steps of {config.rl_batch_size} problems x "
        f"{config.group_size} replies -> {out / 'rl'}",
        flush=True,
    )
    rl = await train(rl_config, service=service)
    details |= await evaluate(await service.create_sampling_client(model_path=rl.final.sampler_path), "rl")
    close_service(service)
    headline = ("train_pass_fraction", "test_pass_fraction", "train_all_pass", "test_all_pass")
    figures = {
        f"{stage}_{k}": details[f"{stage}_{k}"]
        for stage in ("sft", "rl")
        for k in headline
        if f"{stage}_{k}" in details
    }
    figures["wall_seconds"] = time.monotonic() - t_start
    extra = {
        "evaluation": details,
        "train_problems": [p.id for p in train_problems],
        "test_problems": [p.id for p in test_problems],
        "rl_checkpoint": rl.final.sampler_path,
    }
    return finish(RecipeResult("code-rl", out, figures, extra), config=config)


def _describe(figures: dict[str, float], stage: str) -> str:
    parts: list[str] = []
    for split in ("train", "test"):
        pass_fraction, all_pass, block = (
            figures[f"{stage}_{split}_{k}"] for k in ("pass_fraction", "all_pass", "format")
        )
        parts.append(f"{split} pass {pass_fraction:.1%} (all-pass {all_pass:.1%}, code block {block:.1%})")
    return ", ".join(parts)
