"""What every recipe shares: its config base, its session (run directory, service, summary), its result.

A recipe is an attrs config (frozen, keyword-only) whose ``async __call__`` runs the pipeline and
returns a :class:`RecipeResult`; ``tempering recipe NAME [flags]`` builds it with tyro from the
flags, runs it, prints :meth:`RecipeResult.line` and the run directory, and exits 0. Recipes run
on the local engine by default with the built-in tiny model; with ``TINKER_API_KEY`` set,
:func:`recipe_service` returns the hosted service, and ``--base-model`` must then name a model
the service serves (see docs/recipes/hosted.md).

The skeleton that uses these (a session, the SFT and RL stages) is :mod:`tempering.recipes.stages`.

Example::

    model = fresh_model(recipe_config)      # base_model, lora_rank, seed and renderer_name of the recipe
    lr = recipe_learning_rate("tempering/tiny", None)                         # 2e-3
"""

from __future__ import annotations

import inspect
import json
import math
import shutil
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, dataclass_transform

import attrs

from tempering.backend import ServiceClient, ending_session, load_renderer, service_client
from tempering.backends import selected_backend, serving
from tempering.fs import LOCK_NAME, DirLock, require_directory
from tempering.model_info import TINY_MODEL, Stage, check_learning_rate, default_learning_rate

if TYPE_CHECKING:
    from tempering.backend import ModelConfig
    from tempering.training import RunConfig
    from tempering_protocols import Renderer, SamplingClient

__all__ = [
    "TINY_MODEL",
    "GroupFlags",
    "RecipeConfig",
    "RecipeResult",
    "RecipeSession",
    "default_lora_rank",
    "finish",
    "fresh_model",
    "non_negative",
    "positive",
    "prepare_run_dir",
    "recipe_flags",
    "recipe_learning_rate",
    "recipe_service",
    "recipe_session",
]


N = TypeVar("N", int, float, int | None, float | None)


def _bound(zero: bool) -> Callable[[object, attrs.Attribute[Any], float | None], None]:
    def check(instance: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
        if value is not None and not (value >= 0 if zero else value > 0):
            flag = "--" + attribute.name.replace("_", "-")
            bound = ">= 0" if zero else "> 0"
            raise ValueError(
                f"{type(instance).__name__}.{attribute.name} ({flag}) must be {bound}, got {value}"
            )

    return check


def positive(default: N) -> N:
    """A recipe field (an attrs field of default ``default``) refused on construction unless it is
    > 0 (``None``, a default left to the model, is not checked); the message names the class, the
    field and its flag.

    Example::

        n_test: int = positive(100)   # MyRecipe(n_test=0): ValueError: ... (--n-test) must be > 0, got 0
    """
    field: N = attrs.field(default=default, validator=_bound(zero=False))
    return field


def non_negative(default: N) -> N:
    """A recipe field refused on construction when it is < 0 (see :func:`positive`)."""
    field: N = attrs.field(default=default, validator=_bound(zero=True))
    return field


@attrs.frozen(kw_only=True)
class RecipeConfig:
    """The flags every recipe has; a recipe's config subclasses it (``@attrs.frozen(kw_only=True)``)
    and adds its own.

    Example::

        @attrs.frozen(kw_only=True)
        class MyRecipe(RecipeConfig):
            steps: int = 100
    """

    out: str | None = None
    """Run directory (replaced if it exists); default ``runs/<recipe>-<timestamp>``."""
    base_model: str = TINY_MODEL
    """The model to start from (default: the local engine's tiny model)."""
    renderer_name: str | None = None
    """The chat format of ``base_model`` (``tempering.renderers.RENDERERS``); default: the model's."""
    lora_rank: int | None = non_negative(None)
    """LoRA rank; default 0 (full fine-tuning) for the tiny model on the local engine, else 32."""
    seed: int = 0
    """Seeds the data split and order, the initialisation and the sampling."""
    progress: bool = True
    """Show the progress bars."""

    NAME: ClassVar[str] = ""
    """The recipe's name (``tempering recipe NAME``; its run directory's prefix)."""

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """A recipe's further checks of its flags (on construction)."""

    async def __call__(self) -> RecipeResult:
        """Run the recipe: :meth:`run` in a :func:`recipe_session`."""
        async with recipe_session(self.NAME, self) as s:
            return await self.run(s)

    async def run(self, s: RecipeSession) -> RecipeResult:
        """The recipe's pipeline in session ``s``."""
        raise NotImplementedError(f"{type(self).__name__}.run")

    def renderer(self) -> Renderer:
        """The renderer of ``base_model`` (``renderer_name``, else the model's recommended one)."""
        return load_renderer(self.base_model, self.renderer_name)


@attrs.frozen(kw_only=True, slots=False)
class GroupFlags:
    """The sampling flags of a recipe's RL and evaluation."""

    group_size: int = positive(8)
    """Samples per prompt (``G``), sharing it."""
    max_tokens: int = positive(32)
    """Tokens per sampled reply."""
    eval_samples: int = positive(4)
    """Samples per evaluation item, before and after RL."""


C = TypeVar("C")


def _nearest_default(cls: type, field: attrs.Attribute[Any]) -> object:
    """An inherited field's default as the nearest base class that has it sets it (attrs itself
    would take the class that declares it)."""
    if field.name in inspect.get_annotations(cls):
        return field.default
    for base in cls.__mro__[1:]:
        found = [a for a in getattr(base, "__attrs_attrs__", ()) if a.name == field.name]
        if found:
            return found[0].default
    return field.default


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(attrs.field,))
def recipe_flags(**defaults: object) -> Callable[[type[C]], type[C]]:
    """``attrs.frozen(kw_only=True)``, with the defaults of inherited flags replaced by
    ``defaults`` (a recipe's own defaults of :class:`GroupFlags`, or of a base recipe's stages).

    Example::

        @recipe_flags(group_size=16, rl=RLStage(30, 1e-4, batch_size=4))
        class MyRecipe(RecipeConfig, GroupFlags):
            turns: int = 4
    """

    def transform(cls: type, fields: list[attrs.Attribute[Any]]) -> list[attrs.Attribute[Any]]:
        unknown = set(defaults) - {f.name for f in fields}
        if unknown:
            raise TypeError(f"{cls.__name__}: recipe_flags names no field {sorted(unknown)}")
        return [f.evolve(default=defaults.get(f.name, _nearest_default(cls, f))) for f in fields]

    def decorate(cls: type[C]) -> type[C]:
        return attrs.frozen(kw_only=True, field_transformer=transform)(cls)

    return decorate


@attrs.frozen
class RecipeResult:
    """What a recipe reports: its name, its run directory and its headline figures.

    ``figures`` are plain numbers (accuracies as fractions, rewards, seconds) and go into
    ``<run_dir>/summary.json`` with the recipe's config (:func:`finish`).
    """

    name: str
    run_dir: Path
    figures: Mapping[str, float]
    extra: Mapping[str, Any] = attrs.field(factory=dict[str, Any])
    """Further JSON-able facts (checkpoint paths, counts) written to ``summary.json``."""

    def line(self) -> str:
        """The final summary line: the recipe's name and its figures."""
        parts = ", ".join(f"{k} {_fmt(v)}" for k, v in self.figures.items())
        return f"tempering recipe {self.name}: {parts}"


def _fmt(value: float) -> str:
    if math.isfinite(value) and value == int(value) and abs(value) >= 1:
        return str(int(value))
    return f"{value:.4g}"


def prepare_run_dir(name: str, out: str | None) -> tuple[Path, DirLock]:
    """``out`` (emptied if it exists), else ``runs/<name>-<timestamp>``; created and locked
    (:class:`tempering.fs.DirLock`: a recipe running there in another process is refused with
    ``DirLockedError`` before anything is removed). Returns the path and the held lock."""
    path = Path(out) if out is not None else Path("runs") / f"{name}-{datetime.now():%Y%m%d-%H%M%S}"
    require_directory(path, "recipe's output", "--out")
    lock = DirLock.acquire(path, what="recipe output directory")
    try:
        for entry in path.iterdir():
            if entry.name == LOCK_NAME:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    except BaseException:
        lock.release()
        raise
    return path, lock


def recipe_service(base_model: str) -> ServiceClient:
    """:func:`tempering.service_client` (hosted when ``TINKER_API_KEY`` is set, else the local
    engine), refusing a model only another backend serves (the built-in tiny model on the
    hosted service) with a message that says what to pass instead (:func:`refuse_unserved_model`)."""
    refuse_unserved_model(base_model, "--base-model")
    return service_client()


def refuse_unserved_model(base_model: str, flag: str, *, alternative: str = "") -> None:
    """Refuse ``base_model`` (given as ``flag``) when another backend than the selected one
    alone serves it (``Capabilities.builtin_models``), naming why the selected backend is in
    use, a model it serves, and how to select the one that has it. ``alternative``: another
    way out, said last (``or --teacher``)."""
    backend = selected_backend()
    owner = serving(base_model)
    if owner is None or owner is backend:
        return
    raise ValueError(
        f"{backend.selected_because} but {flag} is {base_model!r}, which only {owner.title} has: "
        f"pass {flag} with a model {backend.title} serves, {backend.model_hint}, or {owner.how_to_select}"
        + (f", or {alternative}" if alternative else "")
    )


def trains_tiny_from_scratch(base_model: str) -> bool:
    """Whether ``base_model`` is the built-in tiny model on a backend that has it and trains
    every parameter (the local engine): it starts from random weights, so its recipes default
    to full fine-tuning at a higher learning rate."""
    capabilities = selected_backend().capabilities
    return (
        base_model == TINY_MODEL and base_model in capabilities.builtin_models and capabilities.full_training
    )


def default_lora_rank(base_model: str, lora_rank: int | None) -> int:
    """``lora_rank`` if given; else 0 (full fine-tuning) for the tiny model on the local engine,
    which starts from random weights (:func:`trains_tiny_from_scratch`), and 32 (LoRA) for any
    other model."""
    if lora_rank is not None:
        return lora_rank
    return 0 if trains_tiny_from_scratch(base_model) else 32


def fresh_model(
    config: RecipeConfig,
    lora_rank: int | None = None,
    *,
    seed: int | None = None,
    base_model: str | None = None,
    renderer_name: str | None = None,
) -> ModelConfig:
    """The ``ModelConfig`` of a stage that starts from a recipe's ``base_model`` itself (or
    ``base_model``), with the recipe's ``renderer_name``, its ``seed`` (or ``seed``) and its
    ``lora_rank`` resolved by :func:`default_lora_rank` (full fine-tuning for the local tiny model).

    Example::

        model = fresh_model(ChatSFTRecipe())    # tempering/tiny, lora_rank 0, seed 0
        model = fresh_model(recipe, seed=recipe.student_seed, base_model="tempering/tiny")
    """
    from tempering.backend import ModelConfig

    base = config.base_model if base_model is None else base_model
    return ModelConfig(
        base_model=base,
        lora_rank=default_lora_rank(base, config.lora_rank if lora_rank is None else lora_rank),
        seed=config.seed if seed is None else seed,
        renderer_name=config.renderer_name if renderer_name is None else renderer_name,
    )


def finish(result: RecipeResult, *, config: Any = None) -> RecipeResult:
    """Write ``<run_dir>/summary.json`` (figures, extra, and ``config`` if it is an attrs
    instance) and return ``result``."""
    payload: dict[str, Any] = {**result.figures, **result.extra, "recipe": result.name}
    if config is not None and attrs.has(type(config)):
        payload["config"] = attrs.asdict(config)
    (result.run_dir / "summary.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return result


def recipe_learning_rate(
    base_model: str, learning_rate: float | None, stage: Stage = "sft", *, tiny: float | None = None
) -> float:
    """A recipe stage's learning rate: ``learning_rate`` if given (it must be positive: an
    explicit 0 is refused, never replaced); else ``tiny`` where the recipe tunes its own value for
    the tiny model on the local engine; else the one policy,
    :func:`tempering.model_info.default_learning_rate` for ``stage``.

    Example::

        recipe_learning_rate("tempering/tiny", None)                    # 2e-3
        recipe_learning_rate("Qwen/Qwen3-4B-Instruct-2507", None)       # 5.4e-4 (get_lr)
        recipe_learning_rate("acme/Model-7B", None)                     # 2e-4
        recipe_learning_rate("tempering/tiny", None, "rl", tiny=2e-4)   # 2e-4
    """
    if learning_rate is not None:
        return check_learning_rate(learning_rate)
    from_scratch = trains_tiny_from_scratch(base_model)
    if tiny is not None and from_scratch:
        return tiny
    return default_learning_rate(base_model, stage, from_scratch=from_scratch)


@attrs.define
class RecipeSession:
    """A running recipe: its name, run directory, service and config (see :func:`recipe_session`)."""

    name: str
    run_dir: Path
    service: ServiceClient
    config: Any
    progress: bool = True
    t_start: float = attrs.field(factory=time.monotonic)

    def say(self, text: str) -> None:
        """Print ``tempering recipe <name>: <text>`` (flushed)."""
        print(f"tempering recipe {self.name}: {text}", flush=True)

    def run_config(self, name: str, eval_every: int = 0, save_every: int = 0) -> RunConfig:
        """The :class:`~tempering.training.RunConfig` of stage ``name``: ``<run dir>/<name>``,
        overwritten, checkpoints every ``save_every`` steps (0: the final one only)."""
        from tempering.training import RunConfig

        log_dir = str(self.run_dir / name)
        return RunConfig(
            log_dir=log_dir,
            if_exists="overwrite",
            save_every=save_every,
            eval_every=eval_every,
            progress=self.progress,
        )

    async def sampler(self, path: str | None) -> SamplingClient:
        """A sampling client of the sampler weights at ``path`` (a final checkpoint's)."""
        assert path is not None, "a final checkpoint always has sampler weights"
        return await self.service.create_sampling_client(model_path=path)

    def finish(
        self,
        figures: Mapping[str, float],
        extra: Mapping[str, Any] | None = None,
        *,
        ci95: Mapping[str, tuple[float, float]] | None = None,
    ) -> RecipeResult:
        """``figures`` plus ``wall_seconds``, and ``extra``, written to ``summary.json`` with the
        config; ``ci95``: the 95% intervals of accuracy figures (``summary.json``'s ``ci95``)."""
        payload = dict(extra or {})
        if ci95:
            payload["ci95"] = {k: [lo, hi] for k, (lo, hi) in ci95.items()}
        figures = {**figures, "wall_seconds": time.monotonic() - self.t_start}
        return finish(RecipeResult(self.name, self.run_dir, figures, payload), config=self.config)


@asynccontextmanager
async def recipe_session(
    name: str, config: Any, *, base_model: str | None = None, service: ServiceClient | None = None
) -> AsyncGenerator[RecipeSession]:
    """Open a recipe's session: ``service`` (default :func:`~tempering.recipes._common.recipe_service`
    of ``base_model``, default ``config.base_model``), then the run directory ``config.out``
    (replaced) or ``runs/<name>-<timestamp>``; the service is closed when the block exits (a
    hosted or ``tempering serve`` session is finished as ``success``, ``errored`` or
    ``interrupted``, as the block ended).

    Example::

        async with recipe_session("chat-sft", self) as s:
            ...
            return s.finish({"exact_match_after": 0.4})
    """
    t_start = time.monotonic()
    if service is None:
        service = recipe_service(base_model if base_model is not None else config.base_model)
    with ending_session(service):
        run_dir, lock = prepare_run_dir(name, config.out)
        with lock:
            yield RecipeSession(name, run_dir, service, config, getattr(config, "progress", True), t_start)
