"""What every renderer shares: pieces, special-token lookup, weights, batch tokenization.

A renderer describes a conversation as *pieces*: text to tokenize, or token ids already known
(special tokens, constant headers). Each message has a **header** (what the prompt contains
before the model starts writing: ``<|im_start|>assistant\\n``) and a **completion** (what the
model writes: the content and the end-of-turn token). Text pieces are tokenized one by one and
the token lists concatenated, never re-tokenized as one string, so a rendering of turns ``1..k``
is a token-for-token prefix of the rendering of turns ``1..k+1`` whenever the pieces of earlier
messages do not change (``extends_prefix``).

Tokenization goes through the tokenizer's batch path (one call per batch of conversations,
duplicate texts encoded once).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeAlias, cast

import attrs
import numpy as np
import numpy.typing as npt
import tinker

from tempering_protocols import Message, StopCondition, SupervisedExample, Tokenizer, TrainOnWhat, decode_text

__all__ = [
    "BaseRenderer",
    "MessageParts",
    "MissingSpecialTokenError",
    "NoTrainableTokensError",
    "Piece",
    "Rendering",
    "describe_conversation",
    "encode_batch",
]

Piece: TypeAlias = "str | tuple[int, ...]"
"""Text to tokenize, or token ids (special tokens, pre-encoded constants)."""

_ASSISTANT_ONLY = (TrainOnWhat.LAST_ASSISTANT_MESSAGE, TrainOnWhat.ALL_ASSISTANT_MESSAGES)


class MissingSpecialTokenError(ValueError):
    """The tokenizer lacks a special token the chat format needs.

    Example::

        try:
            get_renderer("llama3", gpt2_tokenizer)
        except MissingSpecialTokenError as err:
            err.token  # "<|begin_of_text|>"
    """

    token: str

    def __init__(self, token: str, renderer: str, detail: str) -> None:
        super().__init__(f"the {renderer} renderer needs the special token {token!r}: {detail}")
        self.token = token

    def __reduce__(self) -> tuple[Callable[..., MissingSpecialTokenError], tuple[str, ...]]:
        return (_missing_special_token, (self.token, str(self)))


def _missing_special_token(token: str, message: str) -> MissingSpecialTokenError:
    err = MissingSpecialTokenError.__new__(MissingSpecialTokenError)
    ValueError.__init__(err, message)
    err.token = token
    return err


class NoTrainableTokensError(ValueError):
    """``train_on_what`` gives no token a non-zero weight in a conversation.

    A silent all-zero mask would train on nothing; this names the conversation instead.

    Example::

        renderer.build_supervised_example([{"role": "user", "content": "hi"}])
        # NoTrainableTokensError: train_on_what=last_assistant_message leaves no trainable
        # token in conversation [user: 'hi'] (it has no assistant message)
    """


@attrs.frozen
class MessageParts:
    """One rendered message: the prompt-side header and the model-written completion."""

    header: tuple[Piece, ...]
    completion: tuple[Piece, ...]


@attrs.frozen
class Rendering:
    """A rendered conversation before tokenization.

    ``prefix`` starts the conversation (a BOS token); ``generation_header`` is the header of
    the next assistant turn (empty unless rendering a generation prompt).
    """

    prefix: tuple[Piece, ...]
    messages: tuple[MessageParts, ...]
    generation_header: tuple[Piece, ...] = ()


def describe_conversation(messages: Sequence[Message], limit: int = 200) -> str:
    """A short, one-line description of a conversation for error messages.

    Example::

        describe_conversation([{"role": "user", "content": "What is 2+2?"}])
        # "[user: 'What is 2+2?']"
    """
    parts: list[str] = []
    for m in messages:
        content = m.get("content", "")
        text = content if len(content) <= 40 else content[:37] + "..."
        parts.append(f"{m.get('role', '?')}: {text!r}")
    out = "[" + ", ".join(parts) + "]"
    return out if len(out) <= limit else out[: limit - 4] + "...]"


def encode_batch(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Tokenize many texts without special tokens, through the tokenizer's batch path.

    Hugging Face tokenizers are called once on the whole list (the Rust backend encodes the
    batch in parallel); any other :class:`Tokenizer` is called text by text.

    Example::

        encode_batch(tokenizer, ["user\\n", "What is 2+2?"])  # [[882, 198], [3923, 374, ...]]
    """
    if not texts:
        return []
    if callable(tokenizer):
        call = cast("Callable[..., object]", tokenizer)
        out = call(list(texts), add_special_tokens=False)
        ids = out.get("input_ids") if isinstance(out, Mapping) else getattr(out, "input_ids", None)
        if isinstance(ids, list) and len(ids) == len(texts):
            return [list(cast("Iterable[int]", row)) for row in cast("list[object]", ids)]
    return [list(tokenizer.encode(text, add_special_tokens=False)) for text in texts]


def _check_messages(messages: object, *, allow_empty: bool) -> None:
    """Messages are checked at runtime: they often come straight from JSON."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"a conversation is a sequence of messages, got {type(messages).__name__}")
    items = cast("Sequence[object]", messages)
    if not items and not allow_empty:
        raise ValueError("empty conversation: there is nothing to render")
    for i, m in enumerate(items):
        if not isinstance(m, Mapping):
            raise TypeError(f"message {i} is a {type(m).__name__}, not a mapping with role and content")
        msg = cast("Mapping[str, object]", m)
        role, content = msg.get("role"), msg.get("content")
        if not isinstance(role, str) or not role:
            raise ValueError(f"message {i} has no role (a non-empty string): {msg!r:.120}")
        if not isinstance(content, str):
            raise TypeError(f"message {i} ({role}) has content of type {type(content).__name__}, not str")


def _message_weight(message: Message, index: int) -> float:
    weight: object = message.get("weight", 0.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ValueError(f"message {index} has weight {weight!r}; customized weights are finite numbers")
    return float(weight)


def message_weights(messages: Sequence[Message], train_on_what: TrainOnWhat) -> list[float]:
    """The weight of each message's completion tokens under ``train_on_what``.

    Headers get weight 0 in every mode but ``ALL_TOKENS`` (where every token gets 1).

    Example::

        message_weights(convo, TrainOnWhat.ALL_ASSISTANT_MESSAGES)  # [0.0, 1.0, 0.0, 1.0]
    """
    roles = [m["role"] for m in messages]
    if train_on_what in (TrainOnWhat.ALL_MESSAGES, TrainOnWhat.ALL_TOKENS):
        return [1.0] * len(messages)
    if train_on_what == TrainOnWhat.ALL_ASSISTANT_MESSAGES:
        return [float(r == "assistant") for r in roles]
    if train_on_what == TrainOnWhat.LAST_ASSISTANT_MESSAGE:
        weights = [0.0] * len(messages)
        last = max((i for i, r in enumerate(roles) if r == "assistant"), default=None)
        if last is not None:
            weights[last] = 1.0
        return weights
    if train_on_what == TrainOnWhat.CUSTOMIZED:
        return [_message_weight(m, i) for i, m in enumerate(messages)]
    raise ValueError(f"unknown train_on_what: {train_on_what!r}")


class BaseRenderer(abc.ABC):
    """Base class of tempering's renderers: implements :class:`tempering_protocols.Renderer`.

    Subclasses implement :meth:`render` (messages -> pieces), :meth:`get_stop_sequences` and
    :meth:`parse_response`, and say whether they extend prefixes.

    Example::

        renderer = get_renderer("chatml", tokenizer)
        prompt = renderer.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        example = renderer.build_supervised_example(
            [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
            TrainOnWhat.LAST_ASSISTANT_MESSAGE,
        )
        message, ok = renderer.parse_response(sampled_tokens)
    """

    name: str = "base"
    """The registry name of the format."""

    tokenizer: Tokenizer

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._constants: dict[str, tuple[int, ...]] = {}

    # --------------------------------------------------------------- what subclasses provide

    @property
    @abc.abstractmethod
    def extends_prefix(self) -> bool:
        """Whether the generation prompt of turn ``k+1`` extends, token for token, the full
        rendering of turns ``1..k`` (what multi-turn RL relies on to merge turns)."""

    @abc.abstractmethod
    def render(self, messages: Sequence[Message], *, generation: bool) -> Rendering:
        """The pieces of ``messages`` (validated), plus the next assistant header if ``generation``."""

    @abc.abstractmethod
    def get_stop_sequences(self) -> StopCondition:
        """What ends an assistant message when sampling."""

    @abc.abstractmethod
    def parse_response(self, tokens: Sequence[int], /) -> tuple[Message, bool]:
        """The assistant message in sampled tokens, and whether it parsed cleanly."""

    # --------------------------------------------------------------- helpers for subclasses

    def special_token(self, token: str) -> int:
        """The id of ``token``, which must be a single token of the tokenizer.

        Raises :class:`MissingSpecialTokenError` naming the token otherwise.
        """
        ids = list(self.tokenizer.encode(token, add_special_tokens=False))
        if len(ids) != 1:
            raise MissingSpecialTokenError(
                token, self.name, f"the tokenizer encodes it as {len(ids)} tokens, not one"
            )
        if decode_text(self.tokenizer, ids) != token:
            raise MissingSpecialTokenError(token, self.name, "the tokenizer maps it to an unknown token")
        return ids[0]

    def constant(self, text: str) -> tuple[int, ...]:
        """``text`` tokenized once and cached (for headers and separators)."""
        ids = self._constants.get(text)
        if ids is None:
            ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            self._constants[text] = ids
        return ids

    def decode(self, tokens: Sequence[int]) -> str:
        return decode_text(self.tokenizer, list(tokens))

    # --------------------------------------------------------------- the Renderer protocol

    def build_generation_prompt(self, messages: Sequence[Message], /) -> tinker.ModelInput:
        """Tokens that prompt the model for the next assistant message.

        Example::

            prompt = renderer.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        """
        _check_messages(messages, allow_empty=True)
        rendering = self.render(messages, generation=True)
        pieces = [*rendering.prefix]
        for parts in rendering.messages:
            pieces += parts.header
            pieces += parts.completion
        pieces += rendering.generation_header
        texts = [p for p in pieces if isinstance(p, str)]
        encoded = dict(zip(texts, encode_batch(self.tokenizer, texts), strict=True))
        tokens: list[int] = []
        for p in pieces:
            tokens += encoded[p] if isinstance(p, str) else p
        return tinker.ModelInput.from_ints(tokens)

    def build_supervised_example(
        self,
        messages: Sequence[Message],
        train_on_what: TrainOnWhat = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
        /,
    ) -> SupervisedExample:
        """Tokens of the whole conversation and a weight per token.

        Raises :class:`NoTrainableTokensError` when ``train_on_what`` leaves every weight 0.

        Example::

            ex = renderer.build_supervised_example(convo, TrainOnWhat.ALL_ASSISTANT_MESSAGES)
            ex.model_input.length == ex.weights.shape[0]
        """
        return self.build_supervised_examples([messages], train_on_what)[0]

    def build_supervised_examples(
        self,
        conversations: Sequence[Sequence[Message]],
        train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
        *,
        names: Sequence[str] | None = None,
    ) -> list[SupervisedExample]:
        """Render many conversations with one batch tokenizer call.

        ``names`` label the conversations in errors (for example ``"chat.jsonl:17"``; by
        default ``"conversation 3 of the batch"``).

        Example::

            examples = renderer.build_supervised_examples([convo_a, convo_b], "all_assistant_messages")
        """
        mode = TrainOnWhat(train_on_what)
        if names is not None and len(names) != len(conversations):
            raise ValueError(f"{len(names)} names for {len(conversations)} conversations")
        plans: list[tuple[list[Piece], list[float]]] = []
        for i, messages in enumerate(conversations):
            label = names[i] if names is not None else None
            if label is None and len(conversations) > 1:
                label = f"conversation {i} of the batch"
            try:
                _check_messages(messages, allow_empty=False)
                plans.append(self._plan(messages, mode))
            except (TypeError, ValueError) as exc:
                if label is None:
                    raise
                raise (TypeError if isinstance(exc, TypeError) else ValueError)(f"{label}: {exc}") from exc
            if not any(w != 0.0 for w in plans[-1][1]):
                where = f"{label}: " if label is not None else ""
                why = (
                    " (it has no assistant message)"
                    if mode in _ASSISTANT_ONLY and all(m["role"] != "assistant" for m in messages)
                    else ""
                )
                raise NoTrainableTokensError(
                    f"{where}train_on_what={mode.value} leaves no trainable token in conversation "
                    f"{describe_conversation(messages)}{why}"
                )
        unique = list(dict.fromkeys(p for pieces, _ in plans for p in pieces if isinstance(p, str)))
        encoded = dict(zip(unique, encode_batch(self.tokenizer, unique), strict=True))
        return [self._assemble(pieces, weights, encoded) for pieces, weights in plans]

    # --------------------------------------------------------------- internals

    def _plan(self, messages: Sequence[Message], mode: TrainOnWhat) -> tuple[list[Piece], list[float]]:
        """Pieces of the conversation and the weight of each piece."""
        rendering = self.render(messages, generation=False)
        per_message = message_weights(messages, mode)
        everything = mode == TrainOnWhat.ALL_TOKENS
        header_weight = 1.0 if everything else 0.0
        pieces: list[Piece] = list(rendering.prefix)
        weights = [header_weight] * len(pieces)
        for parts, w in zip(rendering.messages, per_message, strict=True):
            pieces += parts.header
            weights += [header_weight] * len(parts.header)
            pieces += parts.completion
            weights += [w] * len(parts.completion)
        # A piece that tokenizes to nothing carries no weight; drop it so the check above is exact.
        kept = [(p, w) for p, w in zip(pieces, weights, strict=True) if p]
        return [p for p, _ in kept], [w for _, w in kept]

    @staticmethod
    def _assemble(
        pieces: Sequence[Piece], weights: Sequence[float], encoded: Mapping[str, list[int]]
    ) -> SupervisedExample:
        chunks = [encoded[p] if isinstance(p, str) else p for p in pieces]
        lengths = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
        weights_T: npt.NDArray[np.float32] = np.repeat(np.asarray(weights, dtype=np.float32), lengths)
        tokens_T = [t for c in chunks for t in c]
        return SupervisedExample(model_input=tinker.ModelInput.from_ints(tokens_T), weights=weights_T)
