"""The RL-format model: a small causal transformer over a learning history's transitions, with
separate heads for the action, its log-probability, the reward and the next state.

Two ways to turn transitions into tokens (``ADModelConfig.tokens``):

``"transition"`` (the default): one token per transition ``t``, the sum of the state's
embedding ``s_t`` and the *previous* transition's action and reward: an embedding of
``a_{t-1}``, a projection of ``r_{t-1}``, and ``r_{t-1}`` times a second embedding of
``a_{t-1}`` (so the token says which action paid, not only that something paid); plus a
projection of ``l_{t-1}`` with ``feed_logprobs``, and an embedding of ``s_{t-1}`` with
``previous_state``. The first token of a window has a learned
"no previous transition" embedding instead. Each action sits in the same token as its reward,
so one attention layer can sum, per action, its pulls and its payoffs (what a bandit learner
acts on); and a window of ``T`` transitions is ``T`` tokens, three times shorter than
``"sar"``'s. The heads read token ``t``, which does not know ``a_t``, so the reward and state
heads predict for every action and the loss takes the one that was played.

States are embedded one vector per state, or (``grid_width``, for a grid such as Dark Room's)
as a row embedding plus a column embedding, so that a cell never rewarded in training shares
its row and column with cells that were.

``"sar"``: three tokens per transition, ``s_t``, ``a_t`` (plus ``l_t`` with
``feed_logprobs``), ``r_t``, with a learned kind embedding; the action and logprob heads read
``s_t``, the reward head ``a_t``, the state head ``r_t`` (``s_{t+1}``). Measured on bandits it
learns to repeat the last action, nearly blind to the reward (docs/recipes/algorithm-distillation.md).

==============  ==================================================================
head            predicts
==============  ==================================================================
action          ``a_t`` (categorical; the policy when the model acts)
logprob         ``l_t``, the acting learner's log-probability of its action
reward          ``r_t`` (``"transition"``: one value per action, ``a_t``'s is used)
state           ``s_{t+1}`` (``"transition"``: per action, ``a_t``'s is used)
==============  ==================================================================

Shapes: ``B`` windows, ``T`` transitions (``≤ context``), ``X`` tokens (``T`` or ``3T``),
``D`` width, ``A`` actions, ``S`` states, ``H`` heads, ``K`` width per head.

Example::

    model = ADTransformer(ADModelConfig(n_states=81, n_actions=5, context=80))
    out = model(states_BT, actions_BT, rewards_BT, logprobs_BT)
    out.action_logits_BTA.shape          # (B, T, 5)
"""

from __future__ import annotations

from typing import Literal

import attrs
import torch
from torch import nn
from torch.nn import functional

__all__ = [
    "ADModelConfig",
    "ADOutput",
    "ADTransformer",
    "SpaceMismatchError",
    "Tokens",
    "check_spaces",
]

Tokens = Literal["transition", "sar"]


class SpaceMismatchError(ValueError):
    """A task whose states or actions do not fit the model's heads."""


@attrs.frozen(kw_only=True)
class ADModelConfig:
    """The model's sizes: ``context`` transitions (``context`` tokens, ``3 × context`` with
    ``tokens="sar"``).

    Example::

        ADModelConfig(n_states=1, n_actions=5, context=100, d_model=64, n_layers=2)
    """

    n_states: int
    n_actions: int
    context: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    dropout: float = 0.0
    tokens: Tokens = "transition"
    """How transitions become tokens; see the module docstring."""
    previous_state: bool = False
    """``tokens="transition"`` only: add an embedding of ``s_{t-1}`` (a table of its own) to
    token ``t``, which then holds the whole transition ``(s_{t-1}, a_{t-1}, r_{t-1}, s_t)``: "at
    this state I did this and got that" is one token, for one attention layer to look up
    (where a state is visited more than once, as in Dark Room; a bandit has one state)."""
    grid_width: int = 0
    """States are the cells of a grid ``grid_width`` wide (``state = row * grid_width + col``, as
    in Dark Room): embed a state as the sum of a row embedding and a column embedding (for
    ``s_t`` and, with ``previous_state``, ``s_{t-1}``) instead of one embedding per cell, so a
    cell never seen rewarded in training still shares its row and column with cells that were.
    ``0`` (the default): one embedding per state."""
    label_smoothing: float = 0.0
    """Label smoothing of the action cross-entropy."""
    feed_logprobs: bool = False
    """Feed the acting learner's log-probability of each action to the model. Off by default:
    when the model acts, it is its own confidence, and a model that reads "the learner was sure"
    as "pull the same arm again" confirms itself into repeating its first choice (measured on
    bandits: docs/recipes/algorithm-distillation.md). The logprob head is trained either way."""

    def __attrs_post_init__(self) -> None:
        for name in ("n_states", "n_actions", "context", "d_model", "n_layers", "n_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"ADModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"ADModelConfig: d_model {self.d_model} is not a multiple of n_heads {self.n_heads}"
            )
        if self.tokens not in ("transition", "sar"):
            raise ValueError(f"ADModelConfig.tokens must be 'transition' or 'sar', got {self.tokens!r}")
        if self.grid_width < 0 or (self.grid_width and self.n_states % self.grid_width):
            raise ValueError(
                f"ADModelConfig.grid_width must be 0 or a divisor of n_states {self.n_states}, "
                f"got {self.grid_width}"
            )
        if self.previous_state and self.tokens != "transition":
            raise ValueError("ADModelConfig: previous_state needs tokens='transition'")
        if not 0.0 <= self.label_smoothing < 1.0 or not 0.0 <= self.dropout < 1.0:
            raise ValueError(
                f"ADModelConfig: label_smoothing and dropout must be in [0, 1), got "
                f"{self.label_smoothing} and {self.dropout}"
            )


def check_spaces(config: ADModelConfig, *, n_states: int, n_actions: int, what: str) -> None:
    """Raise :class:`SpaceMismatchError` when ``what`` (a task family, a history) has states or
    actions the model's heads do not have.

    Example::

        check_spaces(model_config, n_states=family.n_states, n_actions=family.n_actions, what="darkroom")
    """
    if n_states != config.n_states or n_actions != config.n_actions:
        raise SpaceMismatchError(
            f"{what}: {n_states} states and {n_actions} actions, but the model's heads have "
            f"{config.n_states} states and {config.n_actions} actions; build the model from the "
            "task's family (ADModelConfig(n_states=family.n_states, n_actions=family.n_actions, ...))"
        )


@attrs.frozen
class ADOutput:
    """The heads' outputs for every transition of the windows (the reward and state heads' for
    the action that was played)."""

    action_logits_BTA: torch.Tensor
    logprob_BT: torch.Tensor
    reward_BT: torch.Tensor
    state_logits_BTS: torch.Tensor


class _Block(nn.Module):
    """A pre-norm causal self-attention block (``scaled_dot_product_attention(is_causal=True)``)."""

    def __init__(self, d: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(dropout))

    def forward(self, x_BXD: torch.Tensor) -> torch.Tensor:
        b, x, d = x_BXD.shape
        qkv_3BHXK = self.qkv(self.norm1(x_BXD)).reshape(b, x, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        y_BHXK = functional.scaled_dot_product_attention(*qkv_3BHXK, dropout_p=p, is_causal=True)
        y_BXD = y_BHXK.transpose(1, 2).reshape(b, x, d)
        x_BXD = x_BXD + functional.dropout(self.out(y_BXD), p)
        return x_BXD + self.mlp(self.norm2(x_BXD))


class _GridEmbedding(nn.Module):
    """A grid cell's embedding: its row's plus its column's (``ADModelConfig.grid_width``)."""

    def __init__(self, n_states: int, grid_width: int, d: int) -> None:
        super().__init__()
        self.grid_width = grid_width
        self.row_emb = nn.Embedding(n_states // grid_width, d)
        self.col_emb = nn.Embedding(grid_width, d)

    def forward(self, s_BT: torch.Tensor) -> torch.Tensor:
        return self.row_emb(s_BT // self.grid_width) + self.col_emb(s_BT % self.grid_width)


def _state_embedding(n_states: int, grid_width: int, d: int) -> nn.Module:
    return _GridEmbedding(n_states, grid_width, d) if grid_width else nn.Embedding(n_states, d)


class ADTransformer(nn.Module):
    """See the module docstring."""

    def __init__(self, config: ADModelConfig) -> None:
        super().__init__()
        self.config = config
        d, n_a, n_s = config.d_model, config.n_actions, config.n_states
        self.state_emb = _state_embedding(n_s, config.grid_width, d)
        self.action_emb = nn.Embedding(n_a, d)
        self.logprob_proj = nn.Linear(1, d)
        self.reward_proj = nn.Linear(1, d)
        sar = config.tokens == "sar"
        self.extra_emb = nn.Embedding(3 if sar else n_a + 1, d)
        """``"sar"``: the kind of each token; ``"transition"``: per action, the reward-scaled
        embedding, then (row ``A``) the "no previous transition" embedding."""
        self.pos_emb = nn.Embedding((3 if sar else 1) * config.context, d)
        self.blocks = nn.ModuleList(_Block(d, config.n_heads, config.dropout) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(d)
        self.action_head = nn.Linear(d, n_a)
        self.logprob_head = nn.Linear(d, 1)
        self.reward_head = nn.Linear(d, 1 if sar else n_a)
        self.state_head = nn.Linear(d, n_s if sar else n_a * n_s)
        self.previous_state_emb = (
            _state_embedding(n_s, config.grid_width, d) if config.previous_state else None
        )

    def _tokens_sar(
        self, s_BT: torch.Tensor, a_BT: torch.Tensor, r_BT: torch.Tensor, l_BT: torch.Tensor
    ) -> torch.Tensor:
        b, t = s_BT.shape
        a_BTD = self.action_emb(a_BT)
        if self.config.feed_logprobs:
            a_BTD = a_BTD + self.logprob_proj(l_BT.unsqueeze(-1))
        r_BTD = self.reward_proj(r_BT.unsqueeze(-1))
        x_BT3D = torch.stack([self.state_emb(s_BT), a_BTD, r_BTD], dim=2) + self.extra_emb.weight
        return x_BT3D.reshape(b, 3 * t, -1)  # s_0 a_0 r_0 s_1 …

    def _tokens_transition(
        self, s_BT: torch.Tensor, a_BT: torch.Tensor, r_BT: torch.Tensor, l_BT: torch.Tensor
    ) -> torch.Tensor:
        a_BTD = self.action_emb(a_BT)
        r_BT1 = r_BT.unsqueeze(-1)
        prev_BTD = a_BTD + self.reward_proj(r_BT1) + r_BT1 * self.extra_emb(a_BT)
        if self.config.feed_logprobs:
            prev_BTD = prev_BTD + self.logprob_proj(l_BT.unsqueeze(-1))
        if self.previous_state_emb is not None:
            prev_BTD = prev_BTD + self.previous_state_emb(s_BT)
        none_B1D = self.extra_emb.weight[self.config.n_actions].expand(s_BT.shape[0], 1, -1)
        prev_BTD = torch.cat([none_B1D, prev_BTD[:, :-1]], dim=1)  # token t: transition t - 1
        return self.state_emb(s_BT) + prev_BTD

    def forward(
        self,
        states_BT: torch.Tensor,
        actions_BT: torch.Tensor,
        rewards_BT: torch.Tensor,
        logprobs_BT: torch.Tensor,
    ) -> ADOutput:
        b, t = states_BT.shape
        if t > self.config.context:
            raise ValueError(
                f"ADTransformer: {t} transitions, more than the context of {self.config.context}"
            )
        sar = self.config.tokens == "sar"
        tokens = self._tokens_sar if sar else self._tokens_transition
        x_BXD = tokens(states_BT, actions_BT, rewards_BT, logprobs_BT)
        x_BXD = x_BXD + self.pos_emb.weight[: x_BXD.shape[1]]
        for block in self.blocks:
            x_BXD = block(x_BXD)
        h_BXD = self.norm(x_BXD)
        if sar:
            h_BT3D = h_BXD.reshape(b, t, 3, -1)
            hs_BTD, ha_BTD, hr_BTD = h_BT3D[:, :, 0], h_BT3D[:, :, 1], h_BT3D[:, :, 2]
            reward_BT = self.reward_head(ha_BTD).squeeze(-1)
            state_logits_BTS = self.state_head(hr_BTD)
        else:
            hs_BTD = h_BXD
            a_BT1 = actions_BT.unsqueeze(-1)
            reward_BT = self.reward_head(hs_BTD).gather(-1, a_BT1).squeeze(-1)
            n_s = self.config.n_states
            state_BTAS = self.state_head(hs_BTD).reshape(b, t, self.config.n_actions, n_s)
            state_logits_BTS = state_BTAS.gather(2, a_BT1[..., None].expand(b, t, 1, n_s)).squeeze(2)
        return ADOutput(
            action_logits_BTA=self.action_head(hs_BTD),
            logprob_BT=self.logprob_head(hs_BTD).squeeze(-1),
            reward_BT=reward_BT,
            state_logits_BTS=state_logits_BTS,
        )

    def losses(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The training losses of a batch of windows (``loss`` is what is minimised: the action
        cross-entropy plus 0.1 × each auxiliary head's loss), and the action accuracy."""
        states, actions = batch["states"], batch["actions"]
        rewards, logprobs = batch["rewards"], batch["logprobs"]
        out = self(states, actions, rewards, logprobs)
        n_a, n_s = self.config.n_actions, self.config.n_states
        action = functional.cross_entropy(
            out.action_logits_BTA.reshape(-1, n_a), actions.reshape(-1),
            label_smoothing=self.config.label_smoothing,
        )  # fmt: skip
        state = (
            functional.cross_entropy(out.state_logits_BTS[:, :-1].reshape(-1, n_s), states[:, 1:].reshape(-1))
            if states.shape[1] > 1
            else out.state_logits_BTS.sum() * 0.0
        )
        reward = functional.mse_loss(out.reward_BT, rewards)
        logprob = functional.mse_loss(out.logprob_BT, logprobs)
        loss = action + 0.1 * (state + reward + logprob)
        accuracy = (out.action_logits_BTA.argmax(-1) == actions).float().mean()
        return {
            "loss": loss,
            "action_loss": action,
            "state_loss": state,
            "reward_loss": reward,
            "logprob_loss": logprob,
            "action_accuracy": accuracy,
        }
