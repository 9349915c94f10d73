"""What the RL loop sends as ``loss_fn_inputs`` for a given loss.

:func:`loss_datums` turns a minibatch's datums (``target_tokens``, ``logprobs``, ``advantages``
and the client-side ``mask``) into those the loss takes: for ``gspo`` it adds
``sequence_ratio_mask`` (the trained action tokens: the sequence ratio is the geometric mean
of the importance ratio over the tokens the policy sampled, masked turns excluded) and leaves
out datums with no trained token (their advantages are all 0, so they add nothing to the loss
or its gradient, and a sequence ratio over no token is undefined); then it keeps only the
loss's own inputs (:func:`~tempering.rl.data.strip_loss_inputs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import tinker
from tinker.types import LossFnType

from tempering.rl.data import strip_loss_inputs

__all__ = ["loss_datums"]


def loss_datums(data_D: Sequence[tinker.Datum], loss_fn: LossFnType) -> list[tinker.Datum]:
    """The datums to send with ``loss_fn`` (see the module docstring); may be empty.

    Example::

        client.forward_backward(loss_datums(batch.to_datums(), "gspo"), "gspo")
    """
    if loss_fn == "gspo":
        with_mask: list[tinker.Datum] = []
        for d in data_D:
            mask = d.loss_fn_inputs.get("mask")
            if mask is None or "sequence_ratio_mask" in d.loss_fn_inputs:
                with_mask.append(d)
            elif mask.to_numpy().any():
                inputs = {**d.loss_fn_inputs, "sequence_ratio_mask": mask}
                with_mask.append(dataclasses.replace(d, loss_fn_inputs=inputs))
        data_D = with_mask
    return strip_loss_inputs(data_D, loss_fn)
