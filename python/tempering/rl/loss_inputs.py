"""What the RL loop sends as ``loss_fn_inputs`` for a given loss.

:func:`loss_datums` turns a minibatch's datums (``target_tokens``, ``logprobs``, ``advantages``
and the client-side ``mask``) into those the loss takes, as its
:class:`~tempering.losses.LossSpec` says: each input of ``from_mask`` (``gspo``'s
``sequence_ratio_mask``: the sequence ratio is the geometric mean of the importance ratio over
the tokens the policy sampled, masked turns excluded) is filled with the ``mask``, and datums
with no trained token are left out (their advantages are all 0, so they add nothing to the loss
or its gradient, and a sequence ratio over no token is undefined); then only the loss's own
inputs are kept (:func:`~tempering.rl.data.strip_loss_inputs`). A client-side custom loss
(``"custom"``) gets every input, ``mask`` included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import tinker
from tinker.types import LossFnType

from tempering.losses import LOSSES
from tempering.rl.data import strip_loss_inputs

__all__ = ["loss_datums"]


def loss_datums(data_D: Sequence[tinker.Datum], loss_fn: LossFnType) -> list[tinker.Datum]:
    """The datums to send with ``loss_fn`` (see the module docstring); may be empty.

    Example::

        client.forward_backward(loss_datums(batch.to_datums(), "gspo"), "gspo")
    """
    if loss_fn == "custom":
        return list(data_D)
    spec = LOSSES.get(loss_fn)
    if spec is not None and spec.from_mask:
        filled: list[tinker.Datum] = []
        for d in data_D:
            mask = d.loss_fn_inputs.get("mask")
            missing = [k for k in spec.from_mask if k not in d.loss_fn_inputs]
            if mask is None or not missing:
                filled.append(d)
            elif mask.to_numpy().any():
                inputs = {**d.loss_fn_inputs, **dict.fromkeys(missing, mask)}
                filled.append(dataclasses.replace(d, loss_fn_inputs=inputs))
        data_D = filled
    return strip_loss_inputs(data_D, loss_fn)
