"""The built-in losses, one registry: names, inputs, config defaults and the per-token term.

The local engine (:mod:`tempering.local.losses`: checks, padding, the objective's sum),
``tempering serve`` (through the local engine), the CLI (``--loss-fn`` takes a
:data:`RLLossName`) and the RL loop (:mod:`tempering.rl.loss_inputs`: which inputs to send) all
read :data:`LOSSES`. Adding a loss is one :class:`LossSpec` here (its name also in
:data:`RLLossName` or :data:`LossName`) and its row in docs/rl.md's table.

Every loss is a sum over tokens (reduction ``sum``) of an elementwise term, as the hosted
service defines them. With ``lp`` the trainer's log-probability of ``target_tokens``, ``q`` the
sampler's (``logprobs`` input), ``A`` the ``advantages``, ``r = exp(lp - q)`` and ``sg`` a
stop-gradient:

======================  ======================================================  ==========================
loss                    loss (summed over tokens)                                config (default)
======================  ======================================================  ==========================
``cross_entropy``       ``-weights * lp`` (also ``[T, K]`` targets and weights)  —
``importance_sampling`` ``-r * A``                                               —
``ppo``                 ``-min(r * A, clip(r, low, high) * A)``                  ``clip_low_threshold`` (0.8),
                                                                                 ``clip_high_threshold`` (1.2)
``cispo``               ``-sg(clip(r, low, high)) * lp * A``                     ``clip_low_threshold`` (0.0),
                                                                                 ``clip_high_threshold`` (4.0)
``dro``                 ``-(lp * A - beta / 2 * (lp - q) ** 2)``                 ``beta`` (0.1)
``gspo``                ``-min(s_t * A, clip(s_t, low, high) * A)``, with        ``clip_low_threshold``
                        ``s_t = exp(mean_M(sg(lp) - q) + lp - sg(lp))``          (0.9997),
                        (``M``: the datum's ``sequence_ratio_mask != 0``)        ``clip_high_threshold``
                                                                                 (1.0004)
``stable_reinforce``    ``-sg(r) * A * lp + kl_coeff * (r - 1 - log r)``         ``kl_coeff`` (0.01)
======================  ======================================================  ==========================

``ppo``, ``cispo`` and ``gspo`` also take per-token ``clip_low_threshold`` /
``clip_high_threshold`` in ``loss_fn_inputs``; they override the config for that datum. ``gspo``
(GSPO-token) gives every token its datum's sequence ratio ``s`` (the geometric mean of ``r``
over the tokens ``sequence_ratio_mask`` marks) as value and its own ``lp``'s gradient; its
clip defaults are the GSPO paper's (the hosted service does not publish its own).
``stable_reinforce`` on the hosted service reads sampling-time information recorded by the
server (``record_stability_info`` and datum provenance); its exact objective is not published.
The local engine's is REINFORCE with a stop-gradient importance weight plus ``kl_coeff`` times
the ``k3`` estimate of ``KL(q || p)`` against the sampler, from the ``logprobs`` input; datum
provenance, if given, is not needed and is ignored. See docs/rl.md.

The objectives use tensor methods only, so this module imports no torch: the hosted-service
path (names, inputs) runs without it.

Example::

    spec = LOSSES["ppo"]
    spec.required, spec.config_defaults   # ('logprobs', 'advantages'), {'clip_low_threshold': 0.8, ...}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias, get_args

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["LOSSES", "LossName", "LossSpec", "Objective", "RLLossName"]

RLLossName: TypeAlias = Literal["importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce"]
"""The policy-gradient losses (``RLConfig.loss_fn``, ``--loss-fn``)."""
LossName: TypeAlias = Literal["cross_entropy", RLLossName]
"""Every built-in loss."""

Objective: TypeAlias = "Callable[[Tensor, Mapping[str, Tensor], Mapping[str, float]], Tensor]"
"""``(lp_B_L_K, inputs, config) -> elementwise loss [B, L, K]``; padding is masked afterwards."""


def _cross_entropy(lp: Tensor, inputs: Mapping[str, Tensor], _cfg: Mapping[str, float]) -> Tensor:
    return -lp * inputs["weights"]


def _ratio(lp: Tensor, inputs: Mapping[str, Tensor]) -> Tensor:
    return (lp - inputs["logprobs"]).exp()


def _importance_sampling(lp: Tensor, inputs: Mapping[str, Tensor], _cfg: Mapping[str, float]) -> Tensor:
    return -_ratio(lp, inputs) * inputs["advantages"]


def _clipped(ratio: Tensor, inputs: Mapping[str, Tensor]) -> Tensor:
    """``-min(ratio * A, clip(ratio, low, high) * A)`` with the per-token thresholds."""
    clipped = ratio.clamp(inputs["clip_low_threshold"], inputs["clip_high_threshold"])
    advantages = inputs["advantages"]
    return -(ratio * advantages).minimum(clipped * advantages)


def _ppo(lp: Tensor, inputs: Mapping[str, Tensor], _cfg: Mapping[str, float]) -> Tensor:
    return _clipped(_ratio(lp, inputs), inputs)


def _cispo(lp: Tensor, inputs: Mapping[str, Tensor], _cfg: Mapping[str, float]) -> Tensor:
    ratio = _ratio(lp, inputs)
    clipped = ratio.clamp(inputs["clip_low_threshold"], inputs["clip_high_threshold"]).detach()
    return -clipped * lp * inputs["advantages"]


def _dro(lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float]) -> Tensor:
    quadratic = (lp - inputs["logprobs"]) ** 2
    return -(lp * inputs["advantages"] - 0.5 * cfg["beta"] * quadratic)


def _gspo(lp: Tensor, inputs: Mapping[str, Tensor], _cfg: Mapping[str, float]) -> Tensor:
    """GSPO-token: each token's ratio has its datum's sequence ratio as value (the geometric
    mean of ``r`` over the marked tokens) and its own logprob's gradient."""
    in_ratio = (inputs["sequence_ratio_mask"] != 0).to(lp.dtype)
    log_ratio = (lp.detach() - inputs["logprobs"]) * in_ratio
    sequence_B_1_1 = log_ratio.sum(dim=(1, 2), keepdim=True) / in_ratio.sum(dim=(1, 2), keepdim=True)
    return _clipped((sequence_B_1_1 + lp - lp.detach()).exp(), inputs)


def _stable_reinforce(lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float]) -> Tensor:
    log_ratio = lp - inputs["logprobs"]
    ratio = log_ratio.exp()
    k3 = ratio - 1.0 - log_ratio
    return -ratio.detach() * inputs["advantages"] * lp + cfg["kl_coeff"] * k3


@dataclass(frozen=True)
class LossSpec:
    """One built-in loss: the inputs it reads, its config and its elementwise term.

    Example::

        LossSpec("ppo", ("logprobs", "advantages"), _ppo, per_token_config=_CLIP,
                 config_defaults={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
    """

    name: LossName
    required: tuple[str, ...]
    """``loss_fn_inputs`` keys it needs besides ``target_tokens``."""
    objective: Objective
    per_token_config: tuple[str, ...] = ()
    """Config keys a datum may also give per token in ``loss_fn_inputs``."""
    config_defaults: Mapping[str, float] = field(default_factory=dict[str, float])
    allows_topk: bool = False
    """Whether ``target_tokens`` may be ``[T, K]``."""
    nonzero: tuple[str, ...] = ()
    """Required inputs that must be nonzero somewhere in every datum."""
    from_mask: tuple[str, ...] = ()
    """Inputs the RL loop fills with its trained-token ``mask`` (a datum whose mask marks no
    token is left out: it has no advantage, and these inputs must mark a token)."""
    gradient_from: tuple[str, ...] = ()
    """Inputs that scale every token's gradient: where all of them are zero the token's loss
    has no gradient, so a trainer may score that token without building its backward pass
    (empty: every token may carry a gradient)."""

    @property
    def accepted_inputs(self) -> frozenset[str]:
        """Every ``loss_fn_inputs`` key the loss reads (the rest is not sent)."""
        return frozenset({"target_tokens", *self.required, *self.per_token_config})


_CLIP = ("clip_low_threshold", "clip_high_threshold")
_PG = ("logprobs", "advantages")
_ADV = ("advantages",)


def _clip_defaults(low: float, high: float) -> dict[str, float]:
    """A clipping loss's default ratio clip ``[low, high]`` (the ``_CLIP`` config keys)."""
    return {"clip_low_threshold": low, "clip_high_threshold": high}


LOSSES: Mapping[str, LossSpec] = {
    spec.name: spec
    for spec in (
        LossSpec("cross_entropy", ("weights",), _cross_entropy, allows_topk=True, gradient_from=("weights",)),
        LossSpec("importance_sampling", _PG, _importance_sampling, gradient_from=_ADV),
        LossSpec(
            "ppo",
            _PG,
            _ppo,
            per_token_config=_CLIP,
            config_defaults=_clip_defaults(0.8, 1.2),
            gradient_from=_ADV,
        ),
        LossSpec(
            "cispo",
            _PG,
            _cispo,
            per_token_config=_CLIP,
            config_defaults=_clip_defaults(0.0, 4.0),
            gradient_from=_ADV,
        ),
        LossSpec("dro", _PG, _dro, config_defaults={"beta": 0.1}),
        LossSpec(
            "gspo",
            (*_PG, "sequence_ratio_mask"),
            _gspo,
            per_token_config=_CLIP,
            config_defaults=_clip_defaults(1.0 - 3e-4, 1.0 + 4e-4),
            nonzero=("sequence_ratio_mask",),
            from_mask=("sequence_ratio_mask",),
        ),
        LossSpec("stable_reinforce", _PG, _stable_reinforce, config_defaults={"kl_coeff": 0.01}),
    )
}
"""Every built-in loss by name, in :data:`LossName`'s order."""

if tuple(LOSSES) != get_args(LossName):  # the one place to keep in step, checked on import
    raise ImportError(f"tempering.losses: LOSSES {tuple(LOSSES)} and LossName {get_args(LossName)} differ")
