"""A :class:`tempering_protocols.MessageCompleter` over any sampling client: the other model of
an env (a judge, an opponent, a user simulator).

:class:`SamplingMessageCompleter` renders the conversation as a generation prompt, samples one
reply from the ``SamplingClient`` (the hosted service's or the local engine's) and parses it
with the renderer. :meth:`~SamplingMessageCompleter.complete` also says whether the reply parsed
cleanly (it stopped at the format's stop sequence); ``__call__`` returns the message alone.
``seed`` fixes the sampling seed of every request (``None``: unseeded); :meth:`with_seed` gives
a copy with another.

Example::

    judge_model = SamplingMessageCompleter(
        await service.create_sampling_client(base_model="Qwen/Qwen3-8B"), renderer, max_tokens=256)
    reply = await judge_model([{"role": "user", "content": "Is 7 prime? Answer yes or no."}])
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import tinker

from tempering_protocols import Message, Renderer, SamplingClient

__all__ = ["SamplingMessageCompleter"]


@attrs.frozen
class SamplingMessageCompleter:
    """Replies to a conversation with one sampled assistant message (see the module docstring)."""

    sampling_client: SamplingClient = attrs.field(eq=False)
    renderer: Renderer = attrs.field(eq=False)
    max_tokens: int = 256
    temperature: float = 1.0
    seed: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"SamplingMessageCompleter: max_tokens must be >= 1, got {self.max_tokens}")

    def with_seed(self, seed: int | None, /) -> SamplingMessageCompleter:
        """This completer with its requests seeded by ``seed``."""
        return attrs.evolve(self, seed=seed)

    async def complete(self, messages: Sequence[Message], /) -> tuple[Message, bool]:
        """The reply and whether it parsed cleanly."""
        prompt = self.renderer.build_generation_prompt(messages)
        params = tinker.SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            stop=self.renderer.get_stop_sequences(),
            seed=self.seed,
        )
        response = await self.sampling_client.sample(prompt, 1, params)
        if not response.sequences:
            raise RuntimeError("the sampling client returned no sequence")
        return self.renderer.parse_response(list(response.sequences[0].tokens))

    async def __call__(self, messages: Sequence[Message], /) -> Message:
        message, _ = await self.complete(messages)
        return message
