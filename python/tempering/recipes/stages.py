"""The recipe skeleton: a session that owns the run directory and the service, and the SFT and
RL stages every recipe is made of.

- :func:`recipe_session` (an async context manager) creates the service (refusing the tiny
  model on the hosted service *before* it touches ``--out``), then the run directory, yields a
  :class:`RecipeSession`, and closes the service however the block ends.
  :meth:`RecipeSession.finish` adds ``wall_seconds``, writes ``summary.json`` and returns the
  :class:`~tempering.recipes._common.RecipeResult`.
- :class:`SFTStage` / :class:`RLStage`: a stage's optimisation (steps, batch, learning rate,
  schedule, evaluation period), read from a recipe's flat flags by prefix with :meth:`SFTStage.of`
  (``--sft-steps`` → ``SFTStage.steps``), so the command line keeps one flat flag per setting.
- :func:`sft_stage` / :func:`rl_stage` run a stage into ``<run dir>/<name>`` (overwritten);
  :func:`sft_then_rl` is the warm start: SFT of a fresh model, an evaluation, RL from its
  final state, the same evaluation. :func:`from_flags` builds any attrs config (a task) the same
  way the stages are read.

Example::

    @attrs.frozen(kw_only=True)
    class MyRecipe(RecipeConfig):   # --out, --base-model, --renderer-name, --lora-rank, --seed, --progress
        sft_steps: int = 100
        sft_batch_size: int = 16
        sft_learning_rate: float = 2e-3
        rl_steps: int = 10
        rl_learning_rate: float = 1e-4

        NAME: ClassVar[str] = "my-recipe"                # the run directory's prefix
        POSITIVE: ClassVar[str] = "sft_steps rl_steps"   # refused below 1 on construction

        async def run(self, s: RecipeSession) -> RecipeResult:   # await MyRecipe()(): in a recipe_session
            async def evaluate(stage: str, sampler: SamplingClient) -> float: ...
            run = await sft_then_rl(s, SFTStage.of(self, "sft_"), RLStage.of(self, "rl_"), evaluate,
                                    train_path="sft.jsonl", task=ArithmeticProblems(), max_tokens=8)
            return s.finish({"before": run.before, "after": run.after})
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

import attrs

from tempering.recipes._common import RecipeSession, recipe_session
from tempering.training.schedule import ScheduleKind
from tempering_protocols import SamplingClient, TrainOnWhat

if TYPE_CHECKING:
    from tempering.backend import ModelConfig
    from tempering.losses import RLLossName
    from tempering.training import AdamConfig, TrainResult
    from tempering_protocols import RLDatasetBuilder, SamplingClientEvaluator

__all__ = [
    "Evaluate",
    "RLStage",
    "RecipeSession",
    "SFTStage",
    "WarmStart",
    "from_flags",
    "metric",
    "recipe_session",
    "rl_stage",
    "sft_stage",
    "sft_then_rl",
]

T = TypeVar("T")
Evaluate = Callable[[str, SamplingClient], Awaitable[T]]
"""``evaluate(stage, sampler)``: the figures of a stage's policy (``stage``: ``"sft"`` or ``"rl"``)."""


def from_flags(cls: Callable[..., T], config: object, *prefixes: str, **overrides: Any) -> T:
    """``cls`` (an attrs class) built from ``config``'s flat fields: each of its fields from the
    first ``<prefix><field>`` that ``config`` has (the others keep their defaults), then
    ``overrides``. With no prefix, the field of the same name.

    Example::

        from_flags(SFTStage, DemoConfig(model="tiny").resolved(), "sft_")  # sft_steps, sft_batch_size, ...
        from_flags(MathTask, recipe, "rl_", "", n_batches=recipe.rl_steps)   # rl_batch_size, then seed, ...
    """
    values: dict[str, Any] = {}
    for field in attrs.fields(cls):  # pyright: ignore[reportArgumentType]
        name: str = field.name
        found = next((p + name for p in prefixes or ("",) if hasattr(config, p + name)), None)
        if found is not None and name not in overrides:
            values[name] = getattr(config, found)
    return cls(**values, **overrides)


class _FromFlags:
    @classmethod
    def of(cls, config: object, prefix: str, **overrides: Any) -> Self:
        """The stage read from ``config``'s flat fields ``<prefix><field>`` (:func:`from_flags`).

        Example::

            SFTStage.of(DemoConfig(model="tiny").resolved(), "sft_")  # sft_steps, sft_batch_size, ...
            RLStage.of(config, "rl_", learning_rate=2e-4, eval_every=0)
        """
        return from_flags(cls, config, prefix, **overrides)


@attrs.frozen
class SFTStage(_FromFlags):
    """A supervised stage's optimisation (also used for DPO and reward-model stages): ``steps``
    steps of ``batch_size`` examples, Adam at ``learning_rate`` (``beta2``, ``weight_decay``)
    after a linear warmup of ``min(max_warmup_steps, steps // 10)`` steps, then ``schedule``;
    evaluated every ``eval_every`` steps (0: before and after only).

    Example::

        SFTStage(600, 64, 2e-3, weight_decay=0.1).adam()
    """

    steps: int
    batch_size: int
    learning_rate: float
    weight_decay: float = 0.0
    eval_every: int = 0
    max_warmup_steps: int = 50
    schedule: ScheduleKind = "constant"
    beta2: float = 0.98
    train_on_what: TrainOnWhat = TrainOnWhat.LAST_ASSISTANT_MESSAGE

    def adam(self) -> AdamConfig:
        """The stage's :class:`~tempering.training.AdamConfig`."""
        from tempering.training import AdamConfig, LRSchedule

        warmup = min(self.max_warmup_steps, self.steps // 10)
        return AdamConfig(
            learning_rate=self.learning_rate,
            beta2=self.beta2,
            weight_decay=self.weight_decay,
            schedule=LRSchedule(self.schedule, warmup_steps=warmup),
        )


@attrs.frozen
class RLStage(_FromFlags):
    """An RL stage's optimisation: ``steps`` steps, Adam at ``learning_rate`` (``beta2``) with
    ``lr_schedule`` (no warmup), ``loss_fn`` with ``num_substeps`` optimizer steps per batch;
    the loop's held-out evaluation every ``eval_every`` steps and periodic checkpoints (with
    sampler weights) every ``save_every`` (0: at the end only).

    Example::

        RLStage(80, 2e-4, lr_schedule="linear", save_every=10)
    """

    steps: int
    learning_rate: float
    lr_schedule: ScheduleKind = "constant"
    eval_every: int = 0
    save_every: int = 0
    loss_fn: RLLossName = "importance_sampling"
    num_substeps: int = 1
    beta2: float = 0.98


async def sft_stage(
    session: RecipeSession,
    name: str,
    stage: SFTStage,
    *,
    model: ModelConfig,
    train_path: str | Path,
    test_path: str | Path | None = None,
    seed: int,
    sampling_evaluators: Sequence[SamplingClientEvaluator] = (),
) -> TrainResult:
    """The recipes' SFT stage: ``stage.steps`` steps of :func:`tempering.sft.train_supervised`
    on the chat file ``train_path`` (repeated as needed), logged to ``<run dir>/<name>``. With
    ``test_path`` the held-out NLL is evaluated (``test/nll``), with ``sampling_evaluators``,
    before the first step, every ``stage.eval_every`` steps and after the last. The run's
    ``config.json`` records the equivalent :class:`~tempering.sft.SFTConfig`.

    Example::

        sft = await sft_stage(session, "sft", SFTStage(600, 64, 2e-3), model=model,
                              train_path=train_path, seed=0)
        sft.final.state_path    # init_state of the next stage
    """
    from tempering.sft import ChatData, NLLEvaluator, SFTConfig, train_supervised

    run = session.run_config(name, stage.eval_every)
    test = None if test_path is None else str(test_path)
    data = ChatData(
        path=str(train_path),
        test_path=test,
        batch_size=stage.batch_size,
        train_on_what=stage.train_on_what,
        seed=seed,
    )
    train_ds, test_ds = data(model)()
    if len(train_ds) < 1:
        raise ValueError(f"{train_path}: fewer conversations than one batch of {stage.batch_size}")
    epochs = -(-stage.steps // len(train_ds))
    adam = stage.adam()
    config = SFTConfig(run=run, model=model, data=data, adam=adam, num_epochs=epochs, max_steps=stage.steps)
    return await train_supervised(
        config,
        run=run,
        model=model,
        adam=adam,
        train=train_ds,
        num_epochs=epochs,
        max_steps=stage.steps,
        training_evaluators=[NLLEvaluator(test_ds)] if test_ds is not None else [],
        sampling_evaluators=sampling_evaluators,
        service=session.service,
    )


async def rl_stage(
    session: RecipeSession,
    name: str,
    stage: RLStage,
    *,
    dataset: RLDatasetBuilder,
    model: ModelConfig,
    **options: Any,
) -> TrainResult:
    """The recipes' RL stage: :func:`tempering.rl.train` for ``stage.steps`` steps on
    ``dataset`` from ``model``, logged to ``<run dir>/<name>``; ``options`` are further
    :class:`~tempering.rl.RLConfig` fields (``max_tokens``, ``seed``, ``kl_penalty_coef``, …).

    Example::

        rl = await rl_stage(session, "rl", RLStage(80, 2e-4, lr_schedule="linear"), dataset=task,
                            model=ModelConfig(init_state=sft.final.state_path), max_tokens=8)
    """
    from tempering.rl import RLConfig, train
    from tempering.training import AdamConfig, LRSchedule

    adam = AdamConfig(
        learning_rate=stage.learning_rate, beta2=stage.beta2, schedule=LRSchedule(stage.lr_schedule)
    )
    run = session.run_config(name, stage.eval_every, stage.save_every)
    config = RLConfig(
        run=run, dataset=dataset, model=model, adam=adam, num_steps=stage.steps, loss_fn=stage.loss_fn,
        num_substeps=stage.num_substeps, **options,
    )  # fmt: skip
    return await train(config, service=session.service)


@attrs.frozen
class WarmStart(Generic[T]):
    """What :func:`sft_then_rl` leaves: the SFT result (``None`` when skipped), the RL result,
    the evaluation of the RL start (``None`` when none was made) and of its end, and that of the
    untrained base model before an SFT stage (``None`` unless asked, ``evaluate_untrained``)."""

    sft: TrainResult | None
    rl: TrainResult
    before: T | None
    after: T
    base: T | None = None

    def checkpoints(self) -> dict[str, str | None]:
        """``sft_checkpoint`` (when SFT ran) and ``rl_checkpoint``: the final sampler weights."""
        sft = {} if self.sft is None else {"sft_checkpoint": self.sft.final.sampler_path}
        return sft | {"rl_checkpoint": self.rl.final.sampler_path}

    def evaluations(self) -> dict[str, T]:
        """``{"base": base, "sft": before, "rl": after}`` (no ``"base"`` without an evaluation of
        the untrained model, no ``"sft"`` when there was no evaluation before RL)."""
        base = {} if self.base is None else {"base": self.base}
        return base | ({} if self.before is None else {"sft": self.before}) | {"rl": self.after}


async def sft_then_rl(
    session: RecipeSession,
    sft: SFTStage | None,
    rl: RLStage,
    evaluate: Evaluate[T],
    *,
    train_path: str | Path | Callable[[], str | Path] | None = None,
    task: RLDatasetBuilder | None = None,
    make_task: Callable[[TrainResult | None], Awaitable[RLDatasetBuilder]] | None = None,
    test_path: str | Path | None = None,
    init_state: str | None = None,
    evaluate_base: bool = False,
    evaluate_untrained: bool = False,
    rl_what: str = "",
    **rl_options: Any,
) -> WarmStart[T]:
    """A warm start: :func:`sft_stage` ``"sft"`` of the recipe's fresh model
    (:func:`~tempering.recipes._common.fresh_model` of ``session.config``: ``base_model``,
    ``lora_rank``, ``seed``, ``renderer_name``) on ``train_path`` (a path, or a callable that
    writes the data and returns it), unless ``sft`` is ``None``, has no steps, or ``init_state``
    is given (RL starts from it); then ``evaluate("sft", sampler)`` of the SFT weights (of the
    base model with ``evaluate_base`` when there was no SFT stage and no ``init_state``; with
    ``evaluate_untrained``, ``evaluate("base", sampler)`` of the base model first, before an SFT
    stage, so that a pretrained model's gain is measured from where it started),
    :func:`rl_stage` ``"rl"`` on ``task`` (or ``await make_task(sft_result)``) seeded with the
    config's ``seed``, and ``evaluate("rl", sampler)`` of its final weights.

    Example::

        run = await sft_then_rl(s, SFTStage.of(self, "sft_"), RLStage.of(self, "rl_"), evaluate,
                                train_path=path, task=task, max_tokens=8)
        run.before, run.after, run.checkpoints()
    """
    from tempering.backend import ModelConfig
    from tempering.recipes._common import fresh_model

    config = session.config
    first = before = base = None
    if sft is not None and sft.steps > 0 and init_state is None:
        if evaluate_untrained:
            base = await evaluate(
                "base", await session.service.create_sampling_client(base_model=config.base_model)
            )
        path = train_path() if callable(train_path) else train_path
        assert path is not None, "an SFT stage needs train_path"
        session.say(f"SFT, {sft.steps} steps of {sft.batch_size} -> {session.run_dir / 'sft'}")
        model = fresh_model(config)
        first = await sft_stage(
            session, "sft", sft, model=model, train_path=path, test_path=test_path, seed=config.seed
        )
        init_state = first.final.state_path
    dataset = task if make_task is None else await make_task(first)
    assert dataset is not None, "sft_then_rl needs task or make_task"
    if first is not None:
        before = await evaluate("sft", await session.sampler(first.final.sampler_path))
    elif evaluate_base and init_state is None:
        before = await evaluate(
            "sft", await session.service.create_sampling_client(base_model=config.base_model)
        )
    model = fresh_model(config) if init_state is None else ModelConfig(
        base_model=config.base_model, init_state=init_state, renderer_name=config.renderer_name
    )  # fmt: skip
    session.say(f"RL, {rl.steps} steps{rl_what} -> {session.run_dir / 'rl'}")
    second = await rl_stage(session, "rl", rl, dataset=dataset, model=model, seed=config.seed, **rl_options)
    after = await evaluate("rl", await session.sampler(second.final.sampler_path))
    return WarmStart(first, second, before, after, base)


def metric(lines: Sequence[Mapping[str, object]], key: str) -> float:
    """The last value of ``key`` in a run's metrics lines; ``KeyError`` if no line has it."""
    for line in reversed(lines):
        value = line.get(key)
        if isinstance(value, int | float):
            return float(value)
    raise KeyError(f"no metrics line has {key!r}")
