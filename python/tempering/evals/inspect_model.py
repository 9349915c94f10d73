"""An inspect-ai model provider (``tempering/<base model>``) backed by a tempering or tinker
sampling client and a renderer, so any inspect task runs on the local engine (offline), on a
``tempering serve`` or on the hosted service.

Importing this module registers the provider with inspect (``@modelapi("tempering")``); the
``inspect_ai`` entry point of the package imports it, so ``inspect eval task.py --model
tempering/tempering/tiny`` finds it once tempering is installed with the ``eval`` extra.

Model name: everything after ``tempering/`` is the base model (``tempering/tiny``, a local model
directory, a hosted model name). Model args (``-M key=value`` or ``get_model(..., key=value)``):

================  ================================================================================
model_path        sampler weights to use instead of the base model (``tempering://…``/``tinker://…``)
base_url          a ``tempering serve`` (or other Tinker-compatible) server; else the hosted service
                  with ``TINKER_API_KEY``, else the local engine
renderer_name     the chat format (default: the one recommended for the base model)
seed              the provider's seed (default 0): each request's sampling seed is derived from it
                  (or from the generate config's ``seed``), the prompt's tokens and how many times
                  that prompt was asked before, so epochs and samples differ, reproducibly
sampling_client   an already open sampling client (with ``renderer``): no service is opened
renderer          a renderer object to use with ``sampling_client``
================  ================================================================================

Example::

    from inspect_ai import eval as inspect_eval
    import tempering.evals.inspect_model  # registers the provider (the entry point does it too)
    logs = inspect_eval(task, model="tempering/tempering/tiny", log_dir="logs")
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import Any, cast

import tinker
from inspect_ai.model import (
    ChatCompletionChoice,
    ChatMessage,
    ChatMessageAssistant,
    GenerateConfig,
    ModelAPI,
    ModelOutput,
    ModelUsage,
    modelapi,
)
from inspect_ai.tool import ToolChoice, ToolInfo

from tempering.backend import close_service, load_tokenizer
from tempering.evals.clients import ModelSource
from tempering.evals.stats import item_seed
from tempering.renderers import get_renderer
from tempering_protocols import Message, Renderer, SamplingClient

__all__ = ["TemperingModelAPI", "provider", "request_seed", "to_messages"]

_ROLES = ("system", "user", "assistant", "tool")
_DEFAULT_MAX_TOKENS = 1024


def to_messages(messages: list[ChatMessage]) -> list[Message]:
    """inspect chat messages as tempering messages (their text; images and other content are
    refused with a message naming the role)."""
    out: list[Message] = []
    for m in messages:
        if m.role not in _ROLES:
            raise ValueError(f"tempering provider: unsupported message role {m.role!r}")
        if not isinstance(m.content, str) and any(c.type not in ("text", "reasoning") for c in m.content):
            kinds = sorted({c.type for c in m.content})
            raise ValueError(
                f"tempering provider: a {m.role} message has {kinds} content; only text is supported"
            )
        out.append(cast(Message, {"role": m.role, "content": m.text}))
    return out


def request_seed(seed: int, prompt_tokens: Sequence[int], asked: int) -> int:
    """The sampling seed of the ``asked``-th request (from 0) of a prompt: a hash of the seed,
    the prompt's tokens and ``asked``, so a repeated prompt (another epoch, another sample)
    draws a new stream and a rerun draws the same ones."""
    digest = hashlib.blake2b(str(list(prompt_tokens)).encode(), digest_size=8).hexdigest()
    return item_seed(seed, digest, asked)


class TemperingModelAPI(ModelAPI):
    """The provider (see the module docstring)."""

    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        config: GenerateConfig = GenerateConfig(),  # noqa: B008 - inspect's own signature
        **model_args: Any,
    ) -> None:
        super().__init__(model_name=model_name, base_url=base_url, api_key=api_key, config=config)
        known = {"model_path", "renderer_name", "seed", "sampling_client", "renderer"}
        unknown = sorted(set(model_args) - known)
        if unknown:
            raise ValueError(f"tempering provider: unknown model args {unknown}; known: {sorted(known)}")
        self.source = ModelSource(
            base_model=model_name,
            model_path=model_args.get("model_path"),
            base_url=base_url,
            api_key=api_key,
            renderer_name=model_args.get("renderer_name"),
        )
        self.seed = int(model_args.get("seed", 0))
        self._client: SamplingClient | None = model_args.get("sampling_client")
        given_renderer: Renderer | None = model_args.get("renderer")
        if self._client is not None and given_renderer is None:
            raise ValueError("tempering provider: a sampling_client needs its renderer (model arg renderer)")
        self._renderer = given_renderer
        self._service: object | None = None
        self._lock = asyncio.Lock()
        self._asked: Counter[str] = Counter()

    async def _open(self) -> tuple[SamplingClient, Renderer]:
        async with self._lock:
            if self._renderer is None:
                self._renderer = get_renderer(self.source.renderer(), load_tokenizer(self.source.base_model))
            if self._client is None:
                service = self.source.service()
                self._service = service
                if self.source.model_path is not None:
                    self._client = await service.create_sampling_client(model_path=self.source.model_path)
                else:
                    self._client = await service.create_sampling_client(base_model=self.source.base_model)
            return self._client, self._renderer

    def _seed(self, prompt: tinker.ModelInput, config: GenerateConfig) -> int:
        tokens = prompt.to_ints()
        key = str(tokens)
        asked = self._asked[key]
        self._asked[key] += 1
        return request_seed(self.seed if config.seed is None else config.seed, tokens, asked)

    async def generate(
        self,
        input: list[ChatMessage],
        tools: list[ToolInfo],
        tool_choice: ToolChoice,
        config: GenerateConfig,
    ) -> ModelOutput:
        del tool_choice
        if tools:
            raise ValueError("tempering provider: tool calling is not supported (the task offers tools)")
        client, renderer = await self._open()
        prompt = renderer.build_generation_prompt(to_messages(input))
        params = tinker.SamplingParams(
            max_tokens=config.max_tokens or _DEFAULT_MAX_TOKENS,
            temperature=1.0 if config.temperature is None else config.temperature,
            top_p=1.0 if config.top_p is None else config.top_p,
            stop=renderer.get_stop_sequences(),
            seed=self._seed(prompt, config),
        )
        response = await client.sample(prompt, config.num_choices or 1, params)
        choices: list[ChatCompletionChoice] = []
        output_tokens = 0
        for sequence in response.sequences:
            message, _ = renderer.parse_response(sequence.tokens)
            output_tokens += len(sequence.tokens)
            choices.append(
                ChatCompletionChoice(
                    message=ChatMessageAssistant(
                        content=message["content"], model=self.model_name, source="generate"
                    ),
                    stop_reason="max_tokens" if sequence.stop_reason == "length" else "stop",
                )
            )
        usage = ModelUsage(
            input_tokens=prompt.length,
            output_tokens=output_tokens,
            total_tokens=prompt.length + output_tokens,
        )
        return ModelOutput(model=self.model_name, choices=choices, usage=usage)

    def close(self) -> None:
        if self._service is not None:
            service, self._service = self._service, None
            close_service(service)

    async def aclose(self) -> None:
        self.close()


provider = modelapi(name="tempering")(TemperingModelAPI)
"""The registered provider (``@modelapi("tempering")``): it builds :class:`TemperingModelAPI`."""
