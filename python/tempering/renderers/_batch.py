"""Rendering many conversations: one batch tokenizer call, off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tempering.renderers._base import BaseRenderer
from tempering_protocols import Message, Renderer, SupervisedExample, TrainOnWhat

__all__ = ["render_supervised_batch", "render_supervised_batch_sync"]


def render_supervised_batch_sync(
    renderer: Renderer,
    conversations: Sequence[Sequence[Message]],
    train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
    *,
    names: Sequence[str] | None = None,
) -> list[SupervisedExample]:
    """Render conversations into supervised examples (tokens and per-token weights).

    tempering's renderers tokenize the whole batch with one call to the tokenizer's batch path;
    any other :class:`~tempering_protocols.Renderer` is called conversation by conversation.
    ``names`` label the conversations in errors (a conversation with no trainable token raises
    :class:`~tempering.renderers.NoTrainableTokensError` naming it).

    Example::

        examples = render_supervised_batch_sync(renderer, [convo_a, convo_b], "all_assistant_messages")
        examples[0].model_input.length == examples[0].weights.shape[0]
    """
    if isinstance(renderer, BaseRenderer):
        return renderer.build_supervised_examples(conversations, train_on_what, names=names)
    mode = TrainOnWhat(train_on_what)
    out: list[SupervisedExample] = []
    for i, messages in enumerate(conversations):
        try:
            out.append(renderer.build_supervised_example(messages, mode))
        except (TypeError, ValueError) as exc:
            label = names[i] if names is not None else f"conversation {i} of the batch"
            raise (TypeError if isinstance(exc, TypeError) else ValueError)(f"{label}: {exc}") from exc
    return out


async def render_supervised_batch(
    renderer: Renderer,
    conversations: Sequence[Sequence[Message]],
    train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
    *,
    names: Sequence[str] | None = None,
) -> list[SupervisedExample]:
    """:func:`render_supervised_batch_sync` in a worker thread, so the event loop keeps running.

    Example::

        examples = await render_supervised_batch(renderer, conversations, TrainOnWhat.ALL_ASSISTANT_MESSAGES)
    """
    return await asyncio.to_thread(
        render_supervised_batch_sync, renderer, conversations, train_on_what, names=names
    )
