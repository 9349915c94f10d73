"""Learning-rate schedules and the Adam settings that go with them.

A trainer asks :meth:`AdamConfig.adam_params` for the ``tinker.AdamParams`` of each step; the
learning rate there comes from :meth:`LRSchedule.multiplier`, a pure function of (step, total
steps), so a resumed run gets exactly the learning rates the uninterrupted run would have.
"""

from __future__ import annotations

import math
from typing import Literal, TypeAlias

import attrs
import tinker

from tempering.model_info import Stage, check_learning_rate, default_learning_rate

__all__ = ["AdamConfig", "LRSchedule", "ScheduleKind", "fine_tuning_adam"]

ScheduleKind: TypeAlias = Literal["constant", "linear", "cosine"]


def _non_negative(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    # ``not value >= 0`` is also true for NaN; infinity is refused separately.
    if not value >= 0 or math.isinf(value):
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value}")


def _positive_or_unset(
    _instance: object, attribute: attrs.Attribute[float | None], value: float | None
) -> None:
    if value is not None:
        check_learning_rate(value, attribute.name)


def _beta(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0 <= value < 1:
        raise ValueError(f"{attribute.name} must be in [0, 1), got {value}")


@attrs.frozen
class LRSchedule:
    """How the learning rate moves over a run: linear warmup, then constant, linear or cosine decay.

    ``warmup_steps`` steps ramp the multiplier from ``1 / (warmup_steps + 1)`` to 1 (never 0: a
    step with learning rate 0 would be wasted); the remaining steps decay from 1 to
    ``min_lr_ratio`` (``"constant"`` stays at 1).

    Example::

        schedule = LRSchedule("cosine", warmup_steps=10, min_lr_ratio=0.1)
        lr = base_lr * schedule.multiplier(step, total_steps)
    """

    kind: ScheduleKind = "linear"
    """The decay after warmup: ``constant``, ``linear`` or ``cosine``."""
    warmup_steps: int = 0
    """Steps of linear warmup."""
    min_lr_ratio: float = attrs.field(default=0.0, validator=_non_negative)
    """The multiplier the decay ends at."""

    def multiplier(self, step: int, total_steps: int) -> float:
        """The factor on the base learning rate at ``step`` (0-based) of ``total_steps``."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        if self.kind == "constant":
            return 1.0
        decay_steps = max(total_steps - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / decay_steps, 1.0)
        shape = 1.0 - progress if self.kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * shape


@attrs.frozen
class AdamConfig:
    """Adam settings for every step of a run (``weight_decay`` is decoupled, as in AdamW;
    ``grad_clip_norm`` clips the global gradient norm, 0 disables it).

    Example::

        adam = AdamConfig(learning_rate=1e-4, schedule=LRSchedule("cosine", warmup_steps=5))
        client.optim_step(adam.adam_params(step, total_steps))
    """

    learning_rate: float | None = attrs.field(default=None, validator=_positive_or_unset)
    """The peak learning rate; ``schedule`` scales it per step. Unset: the model's default for
    the trainer (:func:`tempering.model_info.default_learning_rate`), filled by :meth:`for_model`
    when the run starts."""
    beta1: float = attrs.field(default=0.9, validator=_beta)
    """Decay of the gradient's moving average."""
    beta2: float = attrs.field(default=0.95, validator=_beta)
    """Decay of the squared gradient's moving average."""
    eps: float = attrs.field(default=1e-8, validator=_non_negative)
    """Added to the denominator for stability."""
    weight_decay: float = attrs.field(default=0.0, validator=_non_negative)
    """Decoupled weight decay (AdamW)."""
    grad_clip_norm: float = attrs.field(default=0.0, validator=_non_negative)
    """Clip the global gradient norm to this; 0: no clipping."""
    schedule: LRSchedule = LRSchedule()

    def for_model(self, base_model: str, stage: Stage, *, lora: bool = True) -> AdamConfig:
        """These settings with an unset :attr:`learning_rate` filled by the model's default."""
        if self.learning_rate is not None:
            return self
        return attrs.evolve(self, learning_rate=default_learning_rate(base_model, stage, lora=lora))

    def lr(self, step: int, total_steps: int) -> float:
        """The learning rate of ``step`` (0-based) of ``total_steps``."""
        if self.learning_rate is None:
            raise ValueError(
                "AdamConfig.learning_rate is unset: resolve it with for_model(base_model, stage)"
            )
        return self.learning_rate * self.schedule.multiplier(step, total_steps)

    def adam_params(self, step: int, total_steps: int) -> tinker.AdamParams:
        """The ``tinker.AdamParams`` for ``step`` (0-based) of ``total_steps``."""
        return tinker.AdamParams(
            learning_rate=self.lr(step, total_steps),
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            grad_clip_norm=self.grad_clip_norm,
        )


def fine_tuning_adam() -> AdamConfig:
    """The fine-tuning trainers' default Adam settings (SFT, the reward model, DPO, top-K
    distillation): the model's default learning rate (unset until :meth:`AdamConfig.for_model`),
    two warmup steps, then a linear decay to 0.

    Example::

        adam: AdamConfig = attrs.field(factory=fine_tuning_adam)
    """
    return AdamConfig(schedule=LRSchedule("linear", warmup_steps=2))
