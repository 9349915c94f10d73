"""``tempering recipe math-rl``: reasoning RL on math word problems, rewarded for a correct
answer (:class:`~tempering.grading.MathGrader`, answer equivalence under a time limit) and for
writing it in ``\\boxed{}`` (:mod:`tempering.envs.math`).

1. Data: a math dataset in one of the known schemas (:mod:`tempering.data.hub`), ``gsm8k`` by
   default. On the local tiny model the default sources are the shipped word problems in
   GSM8K's format (``tempering-assets:word_problems.jsonl``, held out
   ``word_problems_test.jsonl``); on any other model the dataset's hub name (``openai/gsm8k``).
2. SFT warm-up (``--sft-steps``; default 300 for the tiny model, which starts from random
   weights, 0 otherwise): the training split's worked solutions, their final ``#### n`` written
   ``\\boxed{n}`` (:func:`~tempering.data.hub.boxed_solution`); run directory ``<out>/sft``.
3. RL (:func:`tempering.rl.train`) on :class:`~tempering.envs.math.MathTask`:
   ``rl_batch_size`` problems × ``group_size`` samples per step, reward
   ``correct_weight * correct + format_weight * (boxed - 1)``; run directory ``<out>/rl``.
4. Held-out accuracy before RL (the SFT checkpoint, or the base model) and after: greedy, and
   sampled at temperature 1 with ``eval_samples`` answers per problem, each problem seeded on
   its own, repeated for ``eval_seeds`` seeds (mean and standard deviation over them).

Example::

    tempering recipe math-rl                                   # docs/recipes/math-rl.md
    tempering recipe math-rl --sft-steps 10 --rl-steps 2 --n-test 8 --out /tmp/math
    tempering recipe math-rl --base-model Qwen/Qwen3.5-9B      # hosted: GSM8K from the hub
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path

import attrs

from tempering.data.hub import MathProblem, boxed_solution
from tempering.envs.math import DEFAULT_INSTRUCTION, MathRewards, MathTask, prompt_messages
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
from tempering_protocols import Renderer, SamplingClient

__all__ = ["MathRLRecipe", "evaluate_math", "write_sft_chat"]

_RL_GRADER_KEYS = ("env/grader/timeouts", "env/grader/errors", "env/grader/no_answer")
_TRAIN_ASSET = "tempering-assets:word_problems.jsonl"
_TEST_ASSET = "tempering-assets:word_problems_test.jsonl"


def write_sft_chat(problems: Sequence[MathProblem], path: Path, instruction: str | None) -> Path:
    """The problems as ``{"messages": [...]}`` rows: the question (with ``instruction``), then
    the worked solution ending in ``\\boxed{answer}`` (or the boxed answer alone)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for p in problems:
            reply = boxed_solution(p.solution) if p.solution else f"\\boxed{{{p.answer}}}"
            messages = [
                *prompt_messages(p.question, instruction, None),
                {"role": "assistant", "content": reply},
            ]
            f.write(json.dumps({"messages": messages}) + "\n")
    return path


async def _accuracy(
    sampler: SamplingClient,
    problems: Sequence[MathProblem],
    renderer: Renderer,
    rewards: MathRewards,
    *,
    samples: int,
    temperature: float,
    max_tokens: int,
    seed: int,
    instruction: str | None,
) -> tuple[float, float]:
    """(accuracy, boxed fraction) of ``samples`` answers per problem; problem ``i`` is sampled
    with its own seed, derived from (``seed``, ``i``)."""
    import tinker

    stop = renderer.get_stop_sequences()
    futures = [
        sampler.sample(
            renderer.build_generation_prompt(prompt_messages(p.question, instruction, None)),
            samples,
            tinker.SamplingParams(
                max_tokens=max_tokens, temperature=temperature, stop=stop, seed=seed * 1_000_003 + i
            ),
        )
        for i, p in enumerate(problems)
    ]
    correct = boxed = n = 0.0
    for p, future in zip(problems, futures, strict=True):
        for seq in (await future).sequences:
            message, parsed = renderer.parse_response(seq.tokens)
            _, metrics = await rewards.score(message["content"], parsed, p.answer)
            correct += metrics["correct"]
            boxed += metrics["format"]
            n += 1
    return correct / max(n, 1), boxed / max(n, 1)


async def evaluate_math(
    sampler: SamplingClient,
    problems: Sequence[MathProblem],
    renderer: Renderer,
    rewards: MathRewards,
    *,
    seeds: Sequence[int],
    samples: int = 4,
    max_tokens: int = 32,
    instruction: str | None = DEFAULT_INSTRUCTION,
) -> dict[str, float]:
    """Held-out accuracy of ``sampler``: greedy (``accuracy_greedy``, ``boxed_greedy``) and at
    temperature 1 (``accuracy``, ``boxed``; ``samples`` answers per problem) for each seed of
    ``seeds``, with the mean over seeds and its standard deviation (``accuracy_std``).

    Example::

        figures = await evaluate_math(sampler, test, renderer, MathRewards(), seeds=(0, 1, 2))
        figures["accuracy"], figures["accuracy_std"], figures["accuracy_greedy"]
    """

    def run(temperature: float, n: int, seed: int) -> Awaitable[tuple[float, float]]:
        return _accuracy(
            sampler,
            problems,
            renderer,
            rewards,
            samples=n,
            temperature=temperature,
            max_tokens=max_tokens,
            seed=seed,
            instruction=instruction,
        )

    greedy, greedy_boxed = await run(0.0, 1, 0)
    runs = [await run(1.0, samples, s) for s in seeds]
    accuracies = [a for a, _ in runs]
    out = {
        "accuracy": statistics.fmean(accuracies),
        "accuracy_std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
        "boxed": statistics.fmean(b for _, b in runs),
        "accuracy_greedy": greedy,
        "boxed_greedy": greedy_boxed,
    }
    out.update({f"accuracy_seed{s}": a for s, a in zip(seeds, accuracies, strict=True)})
    return out


@attrs.frozen(kw_only=True)
class MathRLRecipe:
    """Math RL with format and correctness rewards; calling it runs it.

    The defaults are the measured run of docs/recipes/math-rl.md (the tiny model on the shipped
    word problems); the test runs a tiny budget.
    """

    out: str | None = None
    """Run directory (replaced if it exists); default ``runs/math-rl-<timestamp>``."""
    base_model: str = TINY_MODEL
    renderer_name: str | None = None
    """Default: the model's recommended renderer (``tempering.model_info``)."""
    lora_rank: int | None = None
    """LoRA rank; default: full fine-tuning (0) for the tiny model, 32 otherwise."""
    seed: int = 0
    """Seeds the initialisation, the batch order and the RL sampling."""
    dataset: str = "gsm8k"
    """The schema of the data: gsm8k, math, math500, deepmath, polaris, aime (tempering.data.hub)."""
    train_source: str | None = None
    """Hub name or local path of the training split; default: the shipped word problems on the
    tiny model, the dataset's hub name otherwise."""
    train_split: str = "train"
    test_dataset: str | None = None
    """Schema of the held-out data (default: ``dataset``), e.g. math500 when training on math."""
    test_source: str | None = None
    """Default: the shipped held-out word problems on the tiny model, the hub otherwise."""
    test_split: str | None = None
    """Default: the test dataset's ``test`` split."""
    n_train: int | None = None
    """Read at most this many training problems (default: all)."""
    n_test: int = 100
    """Held-out problems evaluated."""
    instruction: str | None = None
    """Appended to every question; default: none for the tiny model (it learns the format from
    the SFT warm-up), ``DEFAULT_INSTRUCTION`` ("Put the final answer in \\boxed{}.") otherwise."""
    sft_steps: int | None = None
    """SFT warm-up steps on the training split's solutions; default 300 for the tiny model (it
    starts from random weights), 0 (none) otherwise."""
    sft_batch_size: int = 32
    sft_learning_rate: float = 2e-3
    sft_weight_decay: float = 0.1
    rl_steps: int = 40
    rl_batch_size: int = 16
    """Problems per RL step (``P``)."""
    group_size: int = 8
    """Samples per problem (``G``)."""
    rl_learning_rate: float | None = None
    """Default: 2e-4 for the tiny model, 4e-5 otherwise."""
    correct_weight: float = 1.0
    format_weight: float = 0.1
    max_tokens: int | None = None
    """Tokens per answer; default 32 for the tiny model, 1024 otherwise."""
    eval_samples: int = 4
    """Answers per held-out problem at temperature 1, per evaluation seed."""
    eval_seeds: int = 3
    """Evaluation seeds (the sampled accuracy is their mean; its spread their standard deviation)."""
    grader_timeout_s: float = 5.0
    progress: bool = True

    def __attrs_post_init__(self) -> None:
        require_positive(
            "MathRLRecipe",
            rl_steps=self.rl_steps,
            rl_batch_size=self.rl_batch_size,
            group_size=self.group_size,
            n_test=self.n_test,
            eval_samples=self.eval_samples,
            eval_seeds=self.eval_seeds,
            sft_batch_size=self.sft_batch_size,
        )
        if self.sft_steps is not None and self.sft_steps < 0:
            raise ValueError(f"MathRLRecipe.sft_steps (--sft-steps) must be >= 0, got {self.sft_steps}")
        self.task()  # validates the dataset names

    @property
    def tiny(self) -> bool:
        """Whether this runs the built-in tiny model (local defaults)."""
        return self.base_model == TINY_MODEL

    @property
    def prompt_instruction(self) -> str | None:
        """The instruction in effect (see :attr:`instruction`)."""
        if self.instruction is not None:
            return self.instruction or None
        return None if self.tiny else DEFAULT_INSTRUCTION

    def task(self) -> MathTask:
        """The RL task of this config."""
        return MathTask(
            dataset=self.dataset,
            source=self.train_source or (_TRAIN_ASSET if self.tiny else None),
            split=self.train_split,
            limit=self.n_train,
            test_dataset=self.test_dataset,
            test_source=self.test_source or (_TEST_ASSET if self.tiny else None),
            test_split=self.test_split,
            test_limit=self.n_test,
            base_model=self.base_model,
            renderer_name=self.renderer_name,
            batch_size=self.rl_batch_size,
            group_size=self.group_size,
            test_group_size=self.eval_samples,
            n_batches=self.rl_steps,
            seed=self.seed,
            correct_weight=self.correct_weight,
            format_weight=self.format_weight,
            instruction=self.prompt_instruction,
            grader_timeout_s=self.grader_timeout_s,
        )

    async def __call__(self) -> RecipeResult:
        return await _run(self)


def _line(stage: str, figures: dict[str, float]) -> str:
    return (
        f"tempering recipe math-rl: {stage}: held-out accuracy {figures['accuracy']:.1%} "
        f"± {figures['accuracy_std']:.1%} sampled, {figures['accuracy_greedy']:.1%} greedy; "
        f"boxed {figures['boxed']:.1%}"
    )


async def _run(config: MathRLRecipe) -> RecipeResult:
    from tempering.backend import load_tokenizer
    from tempering.data.hub import load_math_problems
    from tempering.model_info import resolve_renderer_name
    from tempering.renderers import get_renderer
    from tempering.rl import RLConfig, train
    from tempering.training import AdamConfig, LRSchedule, RunConfig

    t_start = time.monotonic()
    out = prepare_run_dir("math-rl", config.out)
    service = recipe_service(config.base_model)
    task = config.task()
    rewards = task.rewards()
    rewards.grader.warm_up()  # fails now, clearly, without the `math` extra
    test = task.test_problems()
    if test is None:
        raise ValueError(
            f"MathRLRecipe: dataset {config.dataset!r} has no held-out split: pass --test-dataset "
            "(e.g. math500), --test-source or --test-split"
        )
    renderer = get_renderer(
        resolve_renderer_name(config.base_model, config.renderer_name), load_tokenizer(config.base_model)
    )
    max_tokens = config.max_tokens or (32 if config.tiny else 1024)
    seeds = [config.seed * 1000 + 101 + k for k in range(config.eval_seeds)]

    async def evaluate(sampler: SamplingClient) -> dict[str, float]:
        return await evaluate_math(
            sampler,
            test,
            renderer,
            rewards,
            seeds=seeds,
            samples=config.eval_samples,
            max_tokens=max_tokens,
            instruction=task.instruction,
        )

    # 1-2. SFT warm-up on the training split's worked solutions (or the base model as it is)
    model = fresh_model(
        config.base_model, config.lora_rank, seed=config.seed, renderer_name=config.renderer_name
    )
    sft_steps = config.sft_steps if config.sft_steps is not None else (300 if config.tiny else 0)
    init_state: str | None = None
    if sft_steps:
        train_problems = load_math_problems(
            task.dataset, source=task.source, split=task.split, limit=task.limit
        )
        train_path = write_sft_chat(train_problems, out / "data" / "train.jsonl", task.instruction)
        print(f"tempering recipe math-rl: SFT, {sft_steps} steps -> {out / 'sft'}", flush=True)
        sft = await sft_stage_at(
            out / "sft",
            service=service,
            model=model,
            train_path=train_path,
            stage=SFTStage(
                sft_steps,
                config.sft_batch_size,
                config.sft_learning_rate,
                weight_decay=config.sft_weight_decay,
            ),
            seed=config.seed,
            progress=config.progress,
        )
        init_state = sft.final.state_path
        before_sampler = await service.create_sampling_client(model_path=sft.final.sampler_path)
    else:
        before_sampler = await service.create_sampling_client(base_model=config.base_model)
    before = await evaluate(before_sampler)
    print(_line("before RL", before), flush=True)

    # 3. RL
    rl_config = RLConfig(
        run=RunConfig(log_dir=str(out / "rl"), if_exists="overwrite", save_every=0, progress=config.progress),
        dataset=task,
        model=model if init_state is None else attrs.evolve(model, init_state=init_state),
        adam=AdamConfig(
            learning_rate=config.rl_learning_rate or (2e-4 if config.tiny else 4e-5),
            beta2=0.98,
            schedule=LRSchedule("constant"),
        ),
        num_steps=config.rl_steps,
        max_tokens=max_tokens,
        temperature=1.0,
        normalize_advantages=True,
        seed=config.seed,
    )
    print(
        f"tempering recipe math-rl: RL, {config.rl_steps} steps of {config.rl_batch_size} problems x "
        f"{config.group_size} samples -> {out / 'rl'}",
        flush=True,
    )
    rl = await train(rl_config, service=service)
    after = await evaluate(await service.create_sampling_client(model_path=rl.final.sampler_path))
    print(_line("after RL", after), flush=True)
    close_service(service)

    figures = {
        **{f"before_{k}": v for k, v in before.items() if "seed" not in k},
        **{f"after_{k}": v for k, v in after.items() if "seed" not in k},
        "wall_seconds": time.monotonic() - t_start,
    }
    extra = {
        "before": before,
        "after": after,
        "eval_seeds": seeds,
        "n_test": len(test),
        "sft_steps": sft_steps,
        "grader": {
            "evaluation": rewards.grader.metrics(),
            "rl": {k: sum(float(m.get(k, 0.0)) for m in rl.metrics) for k in _RL_GRADER_KEYS},
        },
        "rl_final_sampler": rl.final.sampler_path,
    }
    return finish(RecipeResult("math-rl", out, figures, extra), config=config)
