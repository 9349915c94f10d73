"""The RL-format model: a small causal transformer over interleaved (state, action + logprob,
reward) embeddings, with separate heads.

Each transition ``t`` is three tokens, in order: ``s_t`` (the state's embedding), ``a_t``
(the action's embedding, plus a projection of its log-probability ``l_t`` with
``feed_logprobs``), ``r_t`` (a projection of the reward). The heads read the final hidden state of:

==============  ===========  ===============================================================
head            reads token  predicts
==============  ===========  ===============================================================
action          ``s_t``      ``a_t`` (categorical; the policy when the model acts)
logprob         ``s_t``      ``l_t``, the acting learner's log-probability of its action
reward          ``a_t``      ``r_t``
state           ``r_t``      ``s_{t+1}`` (categorical)
==============  ===========  ===============================================================

Shapes: ``B`` windows, ``T`` transitions (``≤ context``), ``X = 3T`` tokens, ``D`` width,
``A`` actions, ``S`` states.

Example::

    model = ADTransformer(ADModelConfig(n_states=81, n_actions=5, context=80))
    out = model(states_BT, actions_BT, rewards_BT, logprobs_BT)
    out.action_logits_BTA.shape          # (B, T, 5)
"""

from __future__ import annotations

import attrs
import torch
from torch import nn
from torch.nn import functional

__all__ = ["ADModelConfig", "ADOutput", "ADTransformer", "SpaceMismatchError", "check_spaces"]


class SpaceMismatchError(ValueError):
    """A task whose states or actions do not fit the model's heads."""


@attrs.frozen(kw_only=True)
class ADModelConfig:
    """The model's sizes: ``context`` transitions (``3 × context`` tokens).

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
    feed_logprobs: bool = False
    """Add the projection of ``l_t`` to the action token. Off by default: when the model acts,
    ``l_t`` is its own confidence, and a model that reads "the learner was sure" as "pull the
    same arm again" confirms itself into repeating its first choice (measured on bandits:
    docs/recipes/algorithm-distillation.md). The logprob head is trained either way."""

    def __attrs_post_init__(self) -> None:
        for name in ("n_states", "n_actions", "context", "d_model", "n_layers", "n_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"ADModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"ADModelConfig: d_model {self.d_model} is not a multiple of n_heads {self.n_heads}"
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
    """The heads' outputs for every transition of the windows."""

    action_logits_BTA: torch.Tensor
    logprob_BT: torch.Tensor
    reward_BT: torch.Tensor
    state_logits_BTS: torch.Tensor


class ADTransformer(nn.Module):
    """See the module docstring."""

    def __init__(self, config: ADModelConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.state_emb = nn.Embedding(config.n_states, d)
        self.action_emb = nn.Embedding(config.n_actions, d)
        self.logprob_proj = nn.Linear(1, d)
        self.reward_proj = nn.Linear(1, d)
        self.kind_emb = nn.Embedding(3, d)
        self.pos_emb = nn.Embedding(3 * config.context, d)
        layer = nn.TransformerEncoderLayer(
            d, config.n_heads, 4 * d, config.dropout, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, config.n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.action_head = nn.Linear(d, config.n_actions)
        self.logprob_head = nn.Linear(d, 1)
        self.reward_head = nn.Linear(d, 1)
        self.state_head = nn.Linear(d, config.n_states)

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
        s_BTD = self.state_emb(states_BT)
        a_BTD = self.action_emb(actions_BT)
        if self.config.feed_logprobs:
            a_BTD = a_BTD + self.logprob_proj(logprobs_BT.unsqueeze(-1))
        r_BTD = self.reward_proj(rewards_BT.unsqueeze(-1))
        x_BT3D = torch.stack([s_BTD, a_BTD, r_BTD], dim=2) + self.kind_emb.weight
        x_BXD = x_BT3D.reshape(b, 3 * t, -1)  # s_0 a_0 r_0 s_1 …
        x_BXD = x_BXD + self.pos_emb.weight[: 3 * t]
        mask_XX = nn.Transformer.generate_square_subsequent_mask(3 * t, device=x_BXD.device)
        h_BXD = self.norm(self.blocks(x_BXD, mask=mask_XX, is_causal=True))
        h_BT3D = h_BXD.reshape(b, t, 3, -1)
        hs_BTD, ha_BTD, hr_BTD = h_BT3D[:, :, 0], h_BT3D[:, :, 1], h_BT3D[:, :, 2]
        return ADOutput(
            action_logits_BTA=self.action_head(hs_BTD),
            logprob_BT=self.logprob_head(hs_BTD).squeeze(-1),
            reward_BT=self.reward_head(ha_BTD).squeeze(-1),
            state_logits_BTS=self.state_head(hr_BTD),
        )

    def losses(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The training losses of a batch of windows (``loss`` is what is minimised: the action
        cross-entropy plus 0.1 × each auxiliary head's loss), and the action accuracy."""
        states, actions = batch["states"], batch["actions"]
        rewards, logprobs = batch["rewards"], batch["logprobs"]
        out = self(states, actions, rewards, logprobs)
        n_a, n_s = self.config.n_actions, self.config.n_states
        action = functional.cross_entropy(out.action_logits_BTA.reshape(-1, n_a), actions.reshape(-1))
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
