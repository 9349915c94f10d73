"""The recipe skeleton: a session that owns the run directory and the service, and the SFT and
RL stages every recipe is made of.

- :func:`recipe_session` (an async context manager) creates the service (refusing the tiny
  model on the hosted service *before* it touches ``--out``), then the run directory, yields a
  :class:`RecipeSession`, and closes the service however the block ends.
  :meth:`RecipeSession.finish` adds ``wall_seconds``, writes ``summary.json`` and returns the
  :class:`~tempering.recipes._common.RecipeResult`.
- :class:`SFTStage` / :class:`RLStage`: a stage's optimisation (steps, batch, learning rate,
  schedule, evaluation period), checked by its own validators. A recipe holds its stages as
  nested configs (:func:`stage_field`: ``sft: SFTStage``), so the command line has
  ``--sft.steps``; the older flat spelling ``--sft-steps`` is mapped to it by one generated
  table (:func:`tempering.cli._aliases.flat_aliases`).
- :func:`sft_stage` / :func:`rl_stage` run a stage into ``<run dir>/<name>`` (overwritten);
  :func:`sft_then_rl` is the warm start: SFT of a fresh model, an evaluation, RL from its
  final state, the same evaluation.

Example::

    @attrs.frozen(kw_only=True)
    class MyRecipe(RecipeConfig):   # --out, --base-model, --renderer-name, --lora-rank, --seed, --progress
        sft: SFTStage = stage_field(SFTStage(100, 16, 2e-3), required=True)   # --sft.steps / --sft-steps
        rl: RLStage = stage_field(RLStage(10, 1e-4, batch_size=8))           # --rl.steps / --rl-steps
        n_test: int = positive(50)                                            # refused below 1

        NAME: ClassVar[str] = "my-recipe"                # the run directory's prefix

        async def run(self, s: RecipeSession) -> RecipeResult:   # await MyRecipe()(): in a recipe_session
            async def evaluate(stage: str, sampler: SamplingClient) -> float: ...
            task = ArithmeticProblems(batch_size=self.rl.batch_size, n_batches=self.rl.steps, seed=self.seed)
            run = await sft_then_rl(s, self.sft, self.rl, evaluate, train_path="sft.jsonl", task=task,
                                    max_tokens=8)
            return s.finish({"before": run.before, "after": run.after})
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

import attrs

from tempering.losses import RLLossName
from tempering.model_info import Stage, check_learning_rate
from tempering.recipes._common import RecipeSession, recipe_learning_rate, recipe_session
from tempering.training.schedule import ScheduleKind
from tempering_protocols import SamplingClient, TrainOnWhat

if TYPE_CHECKING:
    from tempering.backend import ModelConfig
    from tempering.training import AdamConfig, TrainResult
    from tempering_protocols import RLDatasetBuilder, SamplingClientEvaluator

__all__ = [
    "Evaluate",
    "RLStage",
    "RecipeSession",
    "SFTStage",
    "WarmStart",
    "at_least",
    "metric",
    "recipe_session",
    "rl_stage",
    "sft_stage",
    "sft_then_rl",
    "stage_field",
    "valid_learning_rate",
]

T = TypeVar("T")
Evaluate = Callable[[str, SamplingClient], Awaitable[T]]
"""``evaluate(stage, sampler)``: the figures of a stage's policy (``stage``: ``"sft"`` or ``"rl"``)."""


def at_least(minimum: int) -> Callable[[object, attrs.Attribute[Any], int | None], None]:
    """An attrs validator of a stage's count: refused below ``minimum`` (``None``, a value left
    to the recipe or its preset, is not checked); the message names the class and the field.

    Example::

        steps: int = attrs.field(default=100, validator=at_least(0))  # SFTStage(-1): ... must be >= 0, got -1
    """

    def check(instance: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
        if value is not None and value < minimum:
            raise ValueError(f"{type(instance).__name__}.{attribute.name} must be >= {minimum}, got {value}")

    return check


def valid_learning_rate(instance: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    """An attrs validator of a stage's learning rate: positive, or ``None`` (the recipe's default)."""
    if value is not None:
        check_learning_rate(value, f"{type(instance).__name__}.{attribute.name}")


@attrs.frozen
class SFTStage:
    """A supervised stage's optimisation (also used for DPO and reward-model stages): ``steps``
    steps of ``batch_size`` examples, Adam at ``learning_rate`` (``beta2``, ``weight_decay``)
    after a linear warmup of ``min(max_warmup_steps, steps // 10)`` steps, then ``schedule``;
    evaluated every ``eval_every`` steps (0: before and after only). A recipe holds it as a
    nested config (``sft: SFTStage = stage_field(SFTStage(300, 32))``: ``--sft.steps``, or
    the flat ``--sft-steps``); its fields are checked on construction.

    Example::

        SFTStage(600, 64, 2e-3, weight_decay=0.1).adam()
    """

    steps: int = attrs.field(default=100, validator=at_least(0))
    """Optimizer steps (0: no such stage, where the recipe allows it)."""
    batch_size: int = attrs.field(default=16, validator=at_least(1))
    """Examples per step."""
    learning_rate: float | None = attrs.field(default=None, validator=valid_learning_rate)
    """Peak learning rate; unset: the recipe's default for its model
    (:func:`~tempering.recipes._common.recipe_learning_rate`)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    eval_every: int = attrs.field(default=0, validator=at_least(0))
    """Evaluate every this many steps (0: only before and after)."""
    max_warmup_steps: int = attrs.field(default=50, validator=at_least(0))
    """Longest linear warmup (the warmup is ``min(max_warmup_steps, steps // 10)`` steps)."""
    schedule: ScheduleKind = "constant"
    """Learning-rate schedule after the warmup."""
    beta2: float = 0.98
    """Adam's beta2."""
    train_on_what: TrainOnWhat = TrainOnWhat.LAST_ASSISTANT_MESSAGE
    """Which tokens of a conversation are trained on."""

    def at(self, learning_rate: float) -> Self:
        """This stage at ``learning_rate`` (a recipe's resolved default)."""
        return attrs.evolve(self, learning_rate=learning_rate)

    def for_model(self, base_model: str, kind: Stage = "sft", *, tiny: float | None = None) -> Self:
        """This stage with its learning rate resolved for ``base_model``: its own if set, else
        the recipe default (:func:`~tempering.recipes._common.recipe_learning_rate` of ``kind``,
        ``tiny`` for the tiny model trained from scratch)."""
        return self.at(recipe_learning_rate(base_model, self.learning_rate, kind, tiny=tiny))

    def adam(self) -> AdamConfig:
        """The stage's :class:`~tempering.training.AdamConfig` (its learning rate must be set:
        :meth:`at`)."""
        from tempering.training import AdamConfig, LRSchedule

        if self.learning_rate is None:
            raise ValueError("SFTStage.learning_rate is unset; resolve it first (stage.at(learning_rate))")
        warmup = min(self.max_warmup_steps, self.steps // 10)
        return AdamConfig(
            learning_rate=self.learning_rate,
            beta2=self.beta2,
            weight_decay=self.weight_decay,
            schedule=LRSchedule(self.schedule, warmup_steps=warmup),
        )


@attrs.frozen
class RLStage:
    """An RL stage's optimisation: ``steps`` steps of ``batch_size`` prompts (``P``; the task
    reads it), Adam at ``learning_rate`` (``beta2``) with ``lr_schedule`` (no warmup),
    ``loss_fn`` with ``num_substeps`` optimizer steps per batch; the loop's held-out evaluation
    every ``eval_every`` steps and periodic checkpoints (with sampler weights) every
    ``save_every`` (0: at the end only). A recipe holds it as a nested config (``--rl.steps``,
    or the flat ``--rl-steps``); its fields are checked on construction.

    Example::

        RLStage(80, 2e-4, lr_schedule="linear", save_every=10)
    """

    steps: int = attrs.field(default=20, validator=at_least(1))
    """RL steps (batches)."""
    learning_rate: float | None = attrs.field(default=None, validator=valid_learning_rate)
    """Peak learning rate; unset: the recipe's default for its model."""
    lr_schedule: ScheduleKind = "constant"
    """Learning-rate schedule."""
    eval_every: int = attrs.field(default=0, validator=at_least(0))
    """Evaluate the policy every this many steps (0: only before and after)."""
    save_every: int = attrs.field(default=0, validator=at_least(0))
    """Save a checkpoint every this many steps (0: the final one only)."""
    loss_fn: RLLossName = "importance_sampling"
    """The policy-gradient loss."""
    num_substeps: int = attrs.field(default=1, validator=at_least(1))
    """Optimizer steps per batch."""
    beta2: float = 0.98
    """Adam's beta2."""
    batch_size: int = attrs.field(default=8, validator=at_least(1), kw_only=True)
    """Prompts (problems, secrets, questions, groups) per step (``P``)."""

    def at(self, learning_rate: float) -> Self:
        """This stage at ``learning_rate`` (a recipe's resolved default)."""
        return attrs.evolve(self, learning_rate=learning_rate)

    def for_model(self, base_model: str, *, tiny: float | None = None) -> Self:
        """This stage with its learning rate resolved for ``base_model`` (as
        :meth:`SFTStage.for_model`, the RL default)."""
        return self.at(recipe_learning_rate(base_model, self.learning_rate, "rl", tiny=tiny))


S = TypeVar("S", bound=attrs.AttrsInstance)
FLAT = "tempering_flat"
"""Field metadata: the flat prefix of a nested stage's old flags (``None``: the field's name)."""
RENAMED = "tempering_renamed"
"""Field metadata: older flat flag names of a nested stage's fields (``{old: field}``)."""


def stage_field(
    default: S, *, flat: str | None = None, renamed: Mapping[str, str] | None = None, required: bool = False
) -> S:
    """A recipe's nested config ``default``: a stage (:class:`SFTStage`, :class:`RLStage`) or a
    task's settings (``GuessNumberRules``), as an attrs field typed as ``default``. On the
    command line its fields are ``--<name>.<field>``, and the flat ``--<flat>-<field>`` too
    (``flat`` default: the field's name; ``""``: ``--<field>``) and any older flat name in
    ``renamed`` (``{"rl-prompts": "batch-size"}``), mapped by
    :func:`tempering.cli._aliases.flat_aliases`. ``required``: a stage the recipe always runs
    (its ``steps`` 0 is refused; for stages).

    Example::

        sft: SFTStage = stage_field(SFTStage(300, 32, 1e-3, max_warmup_steps=20), required=True)
    """
    metadata = {FLAT: flat, RENAMED: dict(renamed or {})}
    validator = _runs if required else None
    field: S = attrs.field(default=default, validator=validator, metadata=metadata)
    return field


def _runs(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, SFTStage | RLStage) and value.steps < 1:
        flag = "--" + attribute.name.replace("_", "-") + ".steps"
        raise ValueError(
            f"{type(instance).__name__}.{attribute.name}.steps ({flag}) must be > 0, got {value.steps}"
        )


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

    if stage.learning_rate is None:
        raise ValueError(f"RLStage.learning_rate of stage {name!r} is unset; resolve it first (stage.at(lr))")
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

        run = await sft_then_rl(s, self.sft, self.rl, evaluate, train_path=path, task=task, max_tokens=8)
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
