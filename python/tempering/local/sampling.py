"""The local sampling client: batched decoding with a KV cache.

One ``sample`` request prefills its prompt once, then copies the cache to its ``num_samples``
rows and decodes them together, dropping rows as they stop. Requests that arrive while the
client is busy, or while its weights are still being prepared (a sampling client made right
after an ``optim_step``, as RL makes one every step), are coalesced: their prompts are
prefilled one by one and their rows decoded in one batch (the shorter prompts' caches are
left-padded and masked), up to ``MAX_BATCH_ROWS`` rows.

The logprob returned for each sampled token is its logprob under the distribution it was drawn
from: logits divided by the temperature, then restricted to the top-k tokens and to the top-p
nucleus, renormalised. At temperature 1 with no top-k/top-p that is the model's own logprob,
which is what ``forward`` computes for the same tokens. At temperature 0 the token is the
argmax and its logprob is the model's own (temperature 1) logprob.

Stopping (``SamplingParams.stop``): ``None`` stops at the model's end-of-sequence tokens; a
list of token ids or strings stops there too, and at the first of those (the stop token, or the
token that completes a stop string, is the last one returned); ``[]`` never stops before
``max_tokens``. ``stop_reason`` is ``"stop"`` or ``"length"``.

Reproducibility: a request with a ``seed`` draws from its own ``torch.Generator``; run alone it
gives the same tokens every time. Coalesced with others it draws the same random numbers, but
float rounding in a bigger batch can differ in the last bits.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future as ConcurrentFuture

import tinker
import torch
from tinker import types as ttypes
from transformers import PreTrainedTokenizerBase

from tempering.local.continuous import ContinuousBatch
from tempering.local.decoding import (
    MAX_BATCH_ROWS,
    Decoder,
    SampleRequest,
    SamplerModel,
    has_plain_cache,
    make_request,
)
from tempering.local.engine_thread import engine_thread
from tempering.local.fastdecode import supports_static_decoding
from tempering.local.futures import LocalFuture, Worker

__all__ = ["LocalSamplingClient", "SamplerModel"]


class _SamplerState:
    """What the sampling worker needs (kept apart from the client so that dropping the client
    frees the model once queued work is done)."""

    def __init__(self, model: ConcurrentFuture[SamplerModel], worker: Worker) -> None:
        self.model = model
        self.worker = worker
        """The client's queue on the engine thread (a decoding batch that yields the thread
        queues another drain there for the requests it left)."""
        self.pending: deque[SampleRequest] = deque()
        self.unmade: deque[_Unmade] = deque()
        """Requests that arrived before the weights were ready, checked once they are."""
        self.lock = threading.Lock()
        self.queued_drains = 0
        """Drains queued on the engine thread and not started (under ``lock``)."""

    def queue_drain(self, drain: Callable[[], None] | None = None) -> None:
        """Queue ``drain`` (default :meth:`drain`) for the requests just added; it counts as
        queued until it starts."""
        with self.lock:
            self._queue_locked(drain or self.drain)

    def _queue_locked(self, drain: Callable[[], None]) -> None:
        def started() -> None:
            with self.lock:
                self.queued_drains -= 1
            drain()

        self.queued_drains += 1
        self.worker.requeue(started)

    def _yield_thread(self) -> None:
        """Leave the pending requests to a drain queued behind the waiting requests of other
        clients (queue one if none of ours is waiting). Called under ``lock``."""
        if self.pending and self.queued_drains == 0:
            self._queue_locked(self.drain)

    def make_pending(self) -> None:
        """Check the requests that waited for the weights and queue them (together, so that
        they decode in one batch); a request that fails its check fails alone."""
        with self.lock:
            unmade, self.unmade = list(self.unmade), deque()
        if not unmade:
            return
        try:
            sampler = self.model.result()
        except BaseException as exc:
            for _, out in unmade:
                _fail(out, exc)
            if not isinstance(exc, Exception):
                raise
            return
        made: list[SampleRequest] = []
        for make, out in unmade:
            try:
                request = make(sampler)
            except Exception as exc:
                _fail(out, exc)
                continue
            request.result = out
            made.append(request)
        with self.lock:
            self.pending.extend(made)

    def drain(self) -> None:
        """Run every pending request, coalescing as many as fit in one batch (with static
        decoding: continuously, requests joining the running batch between steps)."""
        self.make_pending()
        with self.lock:
            if not self.pending:
                return
        try:
            sampler = self.model.result()
        except BaseException:
            sampler = None
        if sampler is not None and supports_static_decoding(sampler.model):
            self._run_continuously(sampler)
            return
        engine, started = engine_thread(), False
        while True:
            with self.lock:
                if not self.pending:
                    return
                if started and engine.others_waiting():  # yield; a drain queued behind takes the rest
                    self._yield_thread()
                    return
                started = True
                batch = [self.pending.popleft()]
                rows = batch[0].num_samples
                while self.pending and rows + self.pending[0].num_samples <= MAX_BATCH_ROWS:
                    rows += self.pending[0].num_samples
                    batch.append(self.pending.popleft())
            self._run(batch)

    def _run_continuously(self, sampler: SamplerModel) -> None:
        """Decode until no request is pending or running; requests that arrive meanwhile join
        between steps (:mod:`tempering.local.continuous`)."""
        batch = ContinuousBatch(sampler)
        engine = engine_thread()
        started = False
        with torch.inference_mode():
            while True:
                self.make_pending()
                joining: list[SampleRequest] = []
                # Once another client's request waits for the engine thread, new requests wait
                # too: the batch finishes its rows and yields the thread, and a drain queued
                # behind that request takes the rest.
                with self.lock:  # checked under the lock: a request queued before these is seen
                    yielding = started and engine.others_waiting()
                    started = True
                    if yielding and not batch.rows:
                        self._yield_thread()
                        return
                    room = 0 if yielding else batch.room()
                    while self.pending and (
                        self.pending[0].num_samples <= room or not (yielding or batch.rows or joining)
                    ):
                        room -= self.pending[0].num_samples
                        joining.append(self.pending.popleft())
                try:
                    if joining:
                        batch.admit(joining)
                    if not batch.rows:
                        with self.lock:
                            if not self.pending:
                                return
                        continue
                    batch.step()
                except BaseException as exc:
                    try:
                        batch.fail(exc)
                    finally:
                        for r in joining:
                            if not r.result.done():
                                r.result.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    batch = ContinuousBatch(sampler)

    def _run(self, batch: list[SampleRequest]) -> None:
        live = [r for r in batch if r.result.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            sampler = self.model.result()
            with torch.inference_mode():
                if len(live) > 1 and not _coalescable(sampler):
                    responses = [Decoder(sampler, [r]).run()[0] for r in live]
                else:
                    responses = Decoder(sampler, live).run()
        except BaseException as exc:
            for r in live:
                r.result.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for r, response in zip(live, responses, strict=True):
            r.result.set_result(response)


def _fail(out: ConcurrentFuture[ttypes.SampleResponse], exc: BaseException) -> None:
    if not out.done():
        out.set_exception(exc)


_Unmade = tuple[Callable[[SamplerModel], SampleRequest], ConcurrentFuture[ttypes.SampleResponse]]


def _coalescable(sampler: SamplerModel) -> bool:
    return has_plain_cache(sampler.model)


class LocalSamplingClient:
    """Samples from a fixed set of weights, in-process. Satisfies
    ``tempering_protocols.SamplingClient`` with the official ``tinker`` types.

    Example::

        sampler = training_client.save_weights_and_get_sampling_client()
        params = tinker.SamplingParams(max_tokens=20, temperature=0.7, seed=0)
        response = sampler.sample(tinker.ModelInput.from_ints(prompt), 4, params).result()
        for seq in response.sequences:
            print(seq.tokens, seq.logprobs, seq.stop_reason)
    """

    def __init__(self, model: SamplerModel | ConcurrentFuture[SamplerModel]) -> None:
        if isinstance(model, SamplerModel):
            ready: ConcurrentFuture[SamplerModel] = ConcurrentFuture()
            ready.set_result(model)
            model = ready
        self._worker = Worker("sampler")
        self._state = _SamplerState(model, self._worker)

    def _sampler(self) -> SamplerModel:
        return self._state.model.result()

    def sample(
        self,
        prompt: tinker.ModelInput,
        num_samples: int,
        sampling_params: tinker.SamplingParams,
        include_prompt_logprobs: bool = False,
        *,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: tinker.TensorData | None = None,
    ) -> LocalFuture[ttypes.SampleResponse]:
        """Draw ``num_samples`` continuations of ``prompt``; see the module docstring.

        As in the SDK: ``topk_prompt_logprobs=k`` returns the top ``k`` tokens of each prompt
        position's distribution (``SampleResponse.topk_prompt_logprobs``),
        ``topk_sample_logprobs=k`` those of each sampled token's distribution
        (``SampledSequence.topk_logprobs``), and ``target_prompt_logprobs`` (int64 ``[len(prompt)
        - 1, K]``, ``-1`` for none) the logprobs of the given ids (see
        :mod:`tempering.local.scores`)."""
        return self._submit(
            lambda sampler: make_request(
                sampler,
                prompt,
                num_samples,
                sampling_params,
                include_prompt_logprobs,
                topk_prompt_logprobs=topk_prompt_logprobs,
                topk_sample_logprobs=topk_sample_logprobs,
                target_prompt_logprobs=target_prompt_logprobs,
            )
        )

    def compute_logprobs(self, prompt: tinker.ModelInput) -> LocalFuture[list[float | None]]:
        """Logprob of each prompt token given those before it (``None`` for the first)."""
        params = tinker.SamplingParams(max_tokens=0)
        response = self._submit(lambda sampler: make_request(sampler, prompt, 1, params, True))
        out: ConcurrentFuture[list[float | None]] = ConcurrentFuture()

        def finish(done: ConcurrentFuture[ttypes.SampleResponse]) -> None:
            error = done.exception()
            if error is not None:
                out.set_exception(error)
            else:
                logprobs = done.result().prompt_logprobs
                out.set_result(list(logprobs) if logprobs is not None else [])

        response.future().add_done_callback(finish)
        return LocalFuture(out)

    def _submit(self, make: Callable[[SamplerModel], SampleRequest]) -> LocalFuture[ttypes.SampleResponse]:
        if self._worker.closed:
            return LocalFuture.failed(RuntimeError("this sampling client has been closed"))
        model = self._state.model
        if model.done() and model.exception() is None:
            try:
                request = make(model.result())
            except Exception as exc:
                return LocalFuture.failed(exc)
            with self._state.lock:
                self._state.pending.append(request)
            self._state.queue_drain()
            return LocalFuture(request.result)
        # The weights are still being prepared: check the request once they are. Every request
        # that arrives meanwhile waits in ``unmade``; the first worker task after the weights
        # are ready checks them all and decodes them together.
        out: ConcurrentFuture[ttypes.SampleResponse] = ConcurrentFuture()
        with self._state.lock:
            self._state.unmade.append((make, out))
        state = self._state

        def when_ready() -> None:
            state.model.exception()  # waits for the weights
            state.drain()

        state.queue_drain(when_ready)
        return LocalFuture(out)

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        """The tokenizer of the model (waits for the weights to be ready)."""
        return self._sampler().tokenizer

    def get_base_model(self) -> str:
        """The base model's name (``"tempering/tiny"`` or a directory)."""
        return self._sampler().base_model

    def close(self) -> None:
        """Finish queued requests; refuse new ones."""
        self._worker.close(wait=True)
