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
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, TypeAlias

import attrs
import numpy as np
import numpy.typing as npt
import tinker

from tempering.renderers._conversation import (
    check_messages,
    describe_conversation,
    last_user_index,
    message_weights,
)
from tempering.renderers._encoding import (
    encode_batch,
    text_encoder,
)
from tempering_protocols import Message, StopCondition, SupervisedExample, Tokenizer, TrainOnWhat, decode_text

__all__ = [
    "BaseRenderer",
    "MessageParts",
    "MissingSpecialTokenError",
    "NoTrainableTokensError",
    "ParseTermination",
    "Piece",
    "Rendering",
    "describe_conversation",
    "encode_batch",
    "last_user_index",
    "message_weights",
    "text_encoder",
]

Piece: TypeAlias = "str | tuple[int, ...]"
"""Text to tokenize, or token ids (special tokens, pre-encoded constants)."""

_ASSISTANT_ONLY = (
    TrainOnWhat.LAST_ASSISTANT_MESSAGE,
    TrainOnWhat.LAST_ASSISTANT_TURN,
    TrainOnWhat.ALL_ASSISTANT_MESSAGES,
)


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


class ParseTermination(enum.StrEnum):
    """How a sampled response ended (the Tinker Cookbook's three cases).

    ``parse_response`` reports ``termination.is_clean`` as its bool.
    """

    STOP_SEQUENCE = "stop_sequence"
    """The format's stop token or string ended the response."""
    EOS = "eos"
    """The model's end-of-sequence token ended it (accepted as a fallback by some formats)."""
    MALFORMED = "malformed"
    """Truncated, or not in the format (an unterminated block, a bad tool call)."""

    @property
    def is_clean(self) -> bool:
        return self != ParseTermination.MALFORMED


class BaseRenderer(abc.ABC):
    """Base class of tempering's renderers: implements :class:`tempering_protocols.Renderer`.

    Subclasses implement :meth:`render` (messages -> pieces), :meth:`get_stop_sequences` and
    :meth:`parse` (or :meth:`parse_response`), and say whether they extend prefixes.

    Weights follow the Tinker Cookbook exactly: a BOS prefix gets 0, headers get 1 only with
    ``all_tokens``, each message's completion gets :meth:`message_weights`; then, for the two
    "last assistant" modes, everything the generation prompt of the trained turn would have
    supplied (a prefilled ``<think>``) is set back to 0.

    Example::

        renderer = get_renderer("qwen3", tokenizer)
        prompt = renderer.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        example = renderer.build_supervised_example(
            [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
            TrainOnWhat.LAST_ASSISTANT_MESSAGE,
        )
        message, ok = renderer.parse_response(sampled_tokens)
    """

    name: str = "base"
    """The registry name of the format."""

    disables_thinking: ClassVar[bool] = False
    """The generation prompt closes the think block (tells the model not to reason): a trained
    turn that reasons anyway is refused rather than trained after a prompt it contradicts."""

    special_tokens_in_text: ClassVar[bool] = False
    """Text pieces may spell special tokens, matched as the tokenizer matches them (a chat
    template's output). By default they may not: renderers give special tokens as ids, and text
    (a user's content included) is tokenized with special tokens taken as plain text."""

    tokenizer: Tokenizer

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._constants: dict[str, tuple[int, ...]] = {}
        self._encode = self._make_encoder()

    def _make_encoder(self) -> Callable[[Sequence[str]], list[list[int]]]:
        if self.special_tokens_in_text:
            tokenizer = self.tokenizer
            return lambda texts: encode_batch(tokenizer, texts)
        return text_encoder(self.tokenizer)

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        del state["_encode"]  # a closure over the tokenizer's backend: rebuilt on load
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        for key, value in state.items():
            setattr(self, key, value)
        self._encode = self._make_encoder()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # ABCMeta sets __abstractmethods__ only after this hook runs: look at the members instead,
        # so that an intermediate base (one still abstract) need not parse.
        abstract = any(getattr(getattr(cls, name, None), "__isabstractmethod__", False) for name in dir(cls))
        if not abstract and (
            cls.parse is BaseRenderer.parse and cls.parse_response is BaseRenderer.parse_response
        ):
            raise TypeError(f"{cls.__name__} must override parse() or parse_response()")

    # --------------------------------------------------------------- what subclasses provide

    @property
    @abc.abstractmethod
    def extends_prefix(self) -> bool:
        """Whether the generation prompt of turn ``k+1`` extends, token for token, the full
        rendering of turns ``1..k`` (what multi-turn RL relies on to merge turns; the Tinker
        Cookbook's ``has_extension_property``)."""

    @abc.abstractmethod
    def render(self, messages: Sequence[Message], *, generation: bool) -> Rendering:
        """The pieces of ``messages`` (validated), plus the next assistant header if ``generation``.

        Each reference ``tokenizer.encode(s)`` call is mirrored by the pieces of ``s``: its
        special tokens as ids (:meth:`special_token`) and the text between them as one ``str``
        piece. With ``generation=False`` a renderer whose stop sequence overlaps the next
        header (``role_colon``) appends that overlap to the last message's completion.
        """

    @abc.abstractmethod
    def get_stop_sequences(self) -> StopCondition:
        """What ends an assistant message when sampling."""

    def parse(self, tokens: Sequence[int], /) -> tuple[Message, ParseTermination]:
        """The assistant message in sampled tokens, and how the response ended."""
        message, ok = self.parse_response(tokens)
        return message, ParseTermination.STOP_SEQUENCE if ok else ParseTermination.MALFORMED

    def parse_response(self, tokens: Sequence[int], /) -> tuple[Message, bool]:
        """The assistant message in sampled tokens, and whether it ended cleanly and parsed."""
        message, termination = self.parse(tokens)
        return message, termination.is_clean

    def create_conversation_prefix_with_tools(
        self, tools: Sequence[Mapping[str, object]], system_prompt: str = ""
    ) -> list[Message]:
        """Messages that declare ``tools`` (``{"name", "description", "parameters"}`` JSON-schema
        specs) in this format's own way, to put before the conversation.

        Raises ``NotImplementedError`` for a format that has no tool declarations.

        Example::

            prefix = renderer.create_conversation_prefix_with_tools(tools, "You are terse.")
            prompt = renderer.build_generation_prompt([*prefix, {"role": "user", "content": "hi"}])
        """
        raise NotImplementedError(f"the {self.name} format has no tool declarations")

    def turn_start_index(self, messages: Sequence[Message]) -> int:
        """Index of the first message of the turn the model produces: after the last user message.

        Renderers whose format draws the line elsewhere override this. For a supervised example
        it is computed over all messages but the last (as the Tinker Cookbook does).
        """
        return last_user_index(messages) + 1

    def message_weights(self, messages: Sequence[Message], train_on_what: TrainOnWhat) -> list[float]:
        """The weight of each message's completion under ``train_on_what``."""
        return message_weights(messages, train_on_what, turn_start=self.turn_start_index(messages[:-1]))

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
            ids = tuple(self._encode([text])[0])
            self._constants[text] = ids
        return ids

    def decode(self, tokens: Sequence[int]) -> str:
        return decode_text(self.tokenizer, list(tokens))

    def encode_texts(self, texts: Sequence[str]) -> list[list[int]]:
        """Tokenize text pieces (special tokens in them as text) in one batch call."""
        return self._encode(texts)

    # --------------------------------------------------------------- the Renderer protocol

    def build_generation_prompt(
        self, messages: Sequence[Message], /, *, prefill: str | None = None
    ) -> tinker.ModelInput:
        """Tokens that prompt the model for the next assistant message.

        ``prefill`` is text the model's reply is made to start with (tokenized on its own).

        Example::

            prompt = renderer.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        """
        check_messages(messages, allow_empty=True)
        pieces = self._prompt_pieces(messages)
        if prefill:
            pieces.append(prefill)
        texts = list(dict.fromkeys(p for p in pieces if isinstance(p, str)))
        encoded = dict(zip(texts, self._encode(texts), strict=True))
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
        plans: list[_Plan] = []
        labels: list[str | None] = []
        for i, messages in enumerate(conversations):
            label = names[i] if names is not None else None
            if label is None and len(conversations) > 1:
                label = f"conversation {i} of the batch"
            labels.append(label)
            try:
                check_messages(messages, allow_empty=False)
                plans.append(self._plan(messages, mode))
            except (TypeError, ValueError) as exc:
                if label is None:
                    raise
                raise (TypeError if isinstance(exc, TypeError) else ValueError)(f"{label}: {exc}") from exc
        unique = list(
            dict.fromkeys(p for plan in plans for p in (*plan.pieces, *plan.prompt) if isinstance(p, str))
        )
        encoded = dict(zip(unique, self._encode(unique), strict=True))
        out: list[SupervisedExample] = []
        for plan, label, messages in zip(plans, labels, conversations, strict=True):
            where = f"{label}: " if label is not None else ""
            example = self._assemble(plan, encoded, where)
            if not np.any(example.weights):
                why = (
                    " (it has no assistant message)"
                    if mode in _ASSISTANT_ONLY and all(m["role"] != "assistant" for m in messages)
                    else " (its last message is not an assistant's)"
                    if mode == TrainOnWhat.LAST_ASSISTANT_MESSAGE and messages[-1]["role"] != "assistant"
                    else ""
                )
                raise NoTrainableTokensError(
                    f"{where}train_on_what={mode.value} leaves no trainable token in conversation "
                    f"{describe_conversation(messages)}{why}"
                )
            out.append(example)
        return out

    # --------------------------------------------------------------- internals

    def _prompt_pieces(self, messages: Sequence[Message]) -> list[Piece]:
        rendering = self.render(messages, generation=True)
        pieces = [*rendering.prefix]
        for parts in rendering.messages:
            pieces += parts.header
            pieces += parts.completion
        pieces += rendering.generation_header
        return [p for p in pieces if p]

    def _plan(self, messages: Sequence[Message], mode: TrainOnWhat) -> _Plan:
        """Pieces of the conversation, the weight of each piece, and the prompt to check against."""
        rendering = self.render(messages, generation=False)
        per_message = self.message_weights(messages, mode)
        header_weight = 1.0 if mode == TrainOnWhat.ALL_TOKENS else 0.0
        pieces: list[Piece] = list(rendering.prefix)
        weights = [0.0] * len(pieces)
        for parts, w in zip(rendering.messages, per_message, strict=True):
            pieces += parts.header
            weights += [header_weight] * len(parts.header)
            pieces += parts.completion
            weights += [w] * len(parts.completion)
        # A piece that tokenizes to nothing carries no weight; drop it so the check above is exact.
        kept = [(p, w) for p, w in zip(pieces, weights, strict=True) if p]
        boundary = _first_trained_message(messages, mode)
        prompt = self._prompt_pieces(messages[:boundary]) if boundary is not None else []
        return _Plan([p for p, _ in kept], [w for _, w in kept], prompt, boundary is not None)

    def _assemble(self, plan: _Plan, encoded: Mapping[str, list[int]], where: str) -> SupervisedExample:
        chunks = [encoded[p] if isinstance(p, str) else p for p in plan.pieces]
        lengths = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
        weights_T: npt.NDArray[np.float32] = np.repeat(np.asarray(plan.weights, dtype=np.float32), lengths)
        tokens_T = [t for c in chunks for t in c]
        if plan.check_prompt:
            prompt_T = [t for p in plan.prompt for t in (encoded[p] if isinstance(p, str) else p)]
            if tokens_T[: len(prompt_T)] == prompt_T:
                weights_T[: len(prompt_T)] = 0.0
            elif self.disables_thinking:
                raise ValueError(
                    f"{where}the {self.name} renderer has thinking turned off: its generation prompt "
                    "closes the think block, but the trained turn reasons, so training on it would "
                    "teach the model to reason after being told not to. Use the thinking variant "
                    "of this renderer, or drop the reasoning from the turn."
                )
        return SupervisedExample(model_input=tinker.ModelInput.from_ints(tokens_T), weights=weights_T)


@attrs.frozen
class _Plan:
    pieces: list[Piece]
    weights: list[float]
    prompt: list[Piece]
    """The generation prompt of the trained turn (``check_prompt``): weights under it become 0."""
    check_prompt: bool


def _first_trained_message(messages: Sequence[Message], mode: TrainOnWhat) -> int | None:
    """Where the generation prompt of the trained turn stops, for the two "last assistant" modes."""
    if mode == TrainOnWhat.LAST_ASSISTANT_MESSAGE:
        boundary = len(messages) - 1
    elif mode == TrainOnWhat.LAST_ASSISTANT_TURN:
        boundary = last_user_index(messages) + 1
    else:
        return None
    if not 0 <= boundary < len(messages):
        return None
    return boundary if messages[boundary]["role"] == "assistant" else None
