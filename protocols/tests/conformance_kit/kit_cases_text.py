"""Correct and deliberately broken renderers and completers, one broken class per rule.

The toy renderers need no tokenizer: a character is its code point, and a few ids above
1000 are special tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import tinker

from tempering_protocols import (
    Message,
    Observation,
    StopCondition,
    SupervisedExample,
    TokensWithLogprobs,
    TrainOnWhat,
)
from tempering_protocols.testing import (
    check_message_completer,
    check_renderer,
    check_token_completer,
)

from .kit_cases_rl import forever, quickly

END = 1000
ROLE_IDS = {"system": 1001, "user": 1002, "assistant": 1003, "tool": 1004}


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(tokens: Sequence[int]) -> str:
    return "".join(chr(t) for t in tokens)


def _trained(train_on_what: TrainOnWhat, index: int, messages: Sequence[Message]) -> bool:
    role = messages[index]["role"]
    last_user = max((i for i, m in enumerate(messages[:-1]) if m["role"] == "user"), default=-1)
    match train_on_what:
        case TrainOnWhat.LAST_ASSISTANT_MESSAGE:
            return index == len(messages) - 1 and role == "assistant"
        case TrainOnWhat.LAST_ASSISTANT_TURN:
            return index > last_user and role == "assistant"
        case TrainOnWhat.ALL_ASSISTANT_MESSAGES:
            return role == "assistant"
        case TrainOnWhat.ALL_MESSAGES | TrainOnWhat.ALL_TOKENS:
            return True
        case TrainOnWhat.ALL_USER_AND_SYSTEM_MESSAGES:
            return role in ("user", "system")
        case TrainOnWhat.CUSTOMIZED:
            return messages[index].get("weight", 0.0) > 0


class ToyRenderer:
    """A correct renderer: ``<role id> content <END>`` per message; stops at token END."""

    def build_generation_prompt(self, messages: Sequence[Message], /) -> tinker.ModelInput:
        tokens = [t for m in messages for t in (ROLE_IDS[m["role"]], *encode(m["content"]), END)]
        return tinker.ModelInput.from_ints([*tokens, ROLE_IDS["assistant"]])

    def build_supervised_example(
        self,
        messages: Sequence[Message],
        train_on_what: TrainOnWhat = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
        /,
    ) -> SupervisedExample:
        tokens: list[int] = []
        weights: list[float] = []
        for i, m in enumerate(messages):
            body = [*encode(m["content"]), END]
            tokens += [ROLE_IDS[m["role"]], *body]
            weights += [0.0] + [float(_trained(train_on_what, i, messages))] * len(body)
        return SupervisedExample(tinker.ModelInput.from_ints(tokens), np.asarray(weights, np.float32))

    def get_stop_sequences(self) -> StopCondition:
        return [END]

    def parse_response(self, tokens: Sequence[int], /) -> tuple[Message, bool]:
        tokens = list(tokens)
        if END not in tokens:
            return {"role": "assistant", "content": decode(tokens)}, False
        return {"role": "assistant", "content": decode(tokens[: tokens.index(END)])}, True


class ToyTextRenderer:
    """A correct renderer in the ``User: …\\n\\nAssistant: …\\n\\n`` format; stops at a string."""

    STOP = "\n\nUser:"

    def _text(self, messages: Sequence[Message]) -> list[tuple[str, str]]:
        return [(f"{m['role'].capitalize()}:", f" {m['content']}\n\n") for m in messages]

    def build_generation_prompt(self, messages: Sequence[Message], /) -> tinker.ModelInput:
        text = "".join(header + body for header, body in self._text(messages))
        return tinker.ModelInput.from_ints(encode(text + "Assistant:"))

    def build_supervised_example(
        self,
        messages: Sequence[Message],
        train_on_what: TrainOnWhat = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
        /,
    ) -> SupervisedExample:
        tokens: list[int] = []
        weights: list[float] = []
        for i, (header, body) in enumerate(self._text(messages)):
            tokens += encode(header + body)
            weights += [0.0] * len(header) + [float(_trained(train_on_what, i, messages))] * len(body)
        return SupervisedExample(tinker.ModelInput.from_ints(tokens), np.asarray(weights, np.float32))

    def get_stop_sequences(self) -> StopCondition:
        return [self.STOP]

    def parse_response(self, tokens: Sequence[int], /) -> tuple[Message, bool]:
        text = decode(tokens)
        end = text.find(self.STOP)
        content = text if end < 0 else text[:end]
        return {"role": "assistant", "content": content.removeprefix(" ")}, end >= 0


class PromptAsList(ToyRenderer):
    def build_generation_prompt(self, messages: Sequence[Message], /) -> tinker.ModelInput:
        return super().build_generation_prompt(messages).to_ints()  # pyright: ignore[reportReturnType] -- deliberately broken


class ExampleAsTuple(ToyRenderer):
    def build_supervised_example(
        self,
        messages: Sequence[Message],
        train_on_what: TrainOnWhat = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
        /,
    ) -> SupervisedExample:
        example = super().build_supervised_example(messages, train_on_what)
        return (example.model_input, example.weights)  # pyright: ignore[reportReturnType] -- deliberately broken


class WeightsOneShort(ToyRenderer):
    """Builds its example around the validating constructor, one weight short."""

    def build_supervised_example(
        self,
        messages: Sequence[Message],
        train_on_what: TrainOnWhat = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
        /,
    ) -> SupervisedExample:
        example = super().build_supervised_example(messages, train_on_what)
        broken = object.__new__(SupervisedExample)
        object.__setattr__(broken, "model_input", example.model_input)
        object.__setattr__(broken, "weights", example.weights[:-1])
        return broken


class NegativeWeights(ToyRenderer):
    def build_supervised_example(
        self,
        messages: Sequence[Message],
        train_on_what: TrainOnWhat = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
        /,
    ) -> SupervisedExample:
        example = super().build_supervised_example(messages, train_on_what)
        return SupervisedExample(example.model_input, example.weights - 0.5)


class TrainsNothing(ToyRenderer):
    def build_supervised_example(
        self,
        messages: Sequence[Message],
        train_on_what: TrainOnWhat = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
        /,
    ) -> SupervisedExample:
        example = super().build_supervised_example(messages, train_on_what)
        return SupervisedExample(example.model_input, np.zeros_like(example.weights))


class StopAsString(ToyRenderer):
    def get_stop_sequences(self) -> StopCondition:
        return "<END>"  # pyright: ignore[reportReturnType] -- deliberately broken


class ParseReturnsMessage(ToyRenderer):
    def parse_response(self, tokens: Sequence[int], /) -> tuple[Message, bool]:
        return super().parse_response(tokens)[0]  # pyright: ignore[reportReturnType] -- deliberately broken


class ParseKeepsStopToken(ToyRenderer):
    def parse_response(self, tokens: Sequence[int], /) -> tuple[Message, bool]:
        return {"role": "assistant", "content": decode(tokens)}, END in tokens


class TextParseKeepsSpace(ToyTextRenderer):
    def parse_response(self, tokens: Sequence[int], /) -> tuple[Message, bool]:
        text = decode(tokens)
        return {"role": "assistant", "content": text.split(self.STOP)[0]}, self.STOP in text


class PromptRaises(ToyRenderer):
    def build_generation_prompt(self, messages: Sequence[Message], /) -> tinker.ModelInput:
        raise KeyError("tool")


# ---------------------------------------------------------------------------- completers


class FixedCompleter:
    """A correct token completer: always ``[7, 8, 0]`` with logprobs."""

    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        return TokensWithLogprobs(tokens=[7, 8, 0], maybe_logprobs=[-0.5, -1.0, -0.01])


async def array_policy(model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
    """A correct token completer as a plain function, returning numpy arrays."""
    return TokensWithLogprobs(
        tokens=np.array([4, 2], np.int64),
        maybe_logprobs=np.array([-0.1, -0.2], np.float32),
        stop_reason="length",
    )


class ReturnsTokenList(FixedCompleter):
    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        return [7, 8, 0]  # pyright: ignore[reportReturnType] -- deliberately broken


class FloatTokens(FixedCompleter):
    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        return TokensWithLogprobs(tokens=np.array([7.0, 8.0]), maybe_logprobs=[-0.5, -1.0])


class NoLogprobs(FixedCompleter):
    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        return TokensWithLogprobs(tokens=[7, 8, 0])


class LogprobsForPromptToo(FixedCompleter):
    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        return TokensWithLogprobs(tokens=[7, 8], maybe_logprobs=[-0.5] * (model_input.length + 2))


class ProbabilitiesNotLogprobs(FixedCompleter):
    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        return TokensWithLogprobs(tokens=[7, 8], maybe_logprobs=[math.exp(-0.5), 0.4])


class CompleterRaises(FixedCompleter):
    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        raise TimeoutError("sampler did not answer")


def sync_policy(model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
    return TokensWithLogprobs(tokens=[1], maybe_logprobs=[-1.0])


class EchoCompleter:
    """A correct message completer."""

    async def __call__(self, messages: Sequence[Message], /) -> Message:
        return {"role": "assistant", "content": messages[-1]["content"]}


class AnswersAsUser(EchoCompleter):
    async def __call__(self, messages: Sequence[Message], /) -> Message:
        return {"role": "user", "content": "?"}


class AnswersWithString(EchoCompleter):
    async def __call__(self, messages: Sequence[Message], /) -> Message:
        return "4"  # pyright: ignore[reportReturnType] -- deliberately broken


class CompleterFails(EchoCompleter):
    async def __call__(self, messages: Sequence[Message], /) -> Message:
        raise RuntimeError("rate limited")


class CompleterHangs(FixedCompleter):
    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        await forever()
        raise AssertionError("unreachable")


class MessageCompleterHangs(EchoCompleter):
    async def __call__(self, messages: Sequence[Message], /) -> Message:
        await forever()
        raise AssertionError("unreachable")


CASES: list[tuple[str, Callable[[], object], Callable[[object], object]]] = [
    # (rule, makes the broken object, the check that must fail with the rule)
    ("protocol/missing-member", FixedCompleter, check_renderer),
    ("renderer/generation-prompt-type", PromptAsList, check_renderer),
    ("renderer/supervised-example-type", ExampleAsTuple, check_renderer),
    ("renderer/weights-aligned", WeightsOneShort, check_renderer),
    ("renderer/weights-range", NegativeWeights, check_renderer),
    ("renderer/no-trained-tokens", TrainsNothing, check_renderer),
    ("renderer/stop-sequences-type", StopAsString, check_renderer),
    ("renderer/parse-response-type", ParseReturnsMessage, check_renderer),
    ("renderer/round-trip", ParseKeepsStopToken, check_renderer),
    ("renderer/round-trip", TextParseKeepsSpace, check_renderer),
    ("renderer/raised", PromptRaises, check_renderer),
    ("protocol/async", lambda: sync_policy, check_token_completer),
    ("completer/return-type", ReturnsTokenList, check_token_completer),
    ("completer/return-type", FloatTokens, check_token_completer),
    ("completer/missing-logprobs", NoLogprobs, check_token_completer),
    ("completer/logprobs-length", LogprobsForPromptToo, check_token_completer),
    ("completer/logprobs-range", ProbabilitiesNotLogprobs, check_token_completer),
    ("completer/raised", CompleterRaises, check_token_completer),
    ("message-completer/return-type", AnswersAsUser, check_message_completer),
    ("message-completer/return-type", AnswersWithString, check_message_completer),
    ("message-completer/raised", CompleterFails, check_message_completer),
    ("completer/timeout", CompleterHangs, quickly(check_token_completer)),
    ("message-completer/timeout", MessageCompleterHangs, quickly(check_message_completer)),
]
