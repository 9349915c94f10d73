"""The server's state: sessions, training models, samplers and the futures the SDK polls.

Everything here except the model work runs on the event loop thread, so the bookkeeping needs
no locks. Model work goes to threads:

- each training model has one ordered queue (a single-thread :class:`Worker`); its first job
  builds the model, and every later request runs there in the SDK's ``seq_id`` order;
- each sampler's weights are a reference in the sampler pool (:mod:`tempering.serve.samplers`:
  shared, deduplicated, bounded in memory), decoded by a ``LocalSamplingClient``.

A base model is loaded once per directory and shared by every LoRA training client and sampler
of it (nothing ever writes to the base weights).

Sequence numbers (``seq_id``): each request runs once, in the SDK's order; see
:class:`tempering.serve.state.TrainingModel`.

Idle sessions: the SDK heartbeats every 10 s while its client lives. A session that has sent
nothing for the session TTL (``tempering serve --session-ttl-s``) belongs to a client that exited
without ``close()``; :meth:`Engine.expire_idle_sessions` finishes it, releasing its models'
threads and memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Generator, Mapping
from concurrent.futures import Future as ConcurrentFuture
from pathlib import Path

from tinker import types as ttypes

from tempering.local.checkpoints import SCHEME, CheckpointStore
from tempering.local.errors import LocalEngineError
from tempering.local.futures import Worker, set_torch_threads
from tempering.local.inventory import remove_checkpoint
from tempering.local.loader import LoraShape, ModelLoader
from tempering.local.model import Placement, resolve_model_dir, resolve_placement
from tempering.local.training import LocalTrainingClient
from tempering.serve.jobs import (
    forward_backward_job,
    info_payload,
    load_state_job,
    optim_step_job,
    save_sampler_weights_job,
    save_state_job,
)
from tempering.serve.samplers import DEFAULT_MAX_RESIDENT, SamplerPool
from tempering.serve.state import (
    DEFAULT_SESSION_TTL_S,
    GAP_TIMEOUT_S,
    TINKER_SCHEME,
    FutureTable,
    Payload,
    RequestError,
    Sampler,
    Sessions,
    TrainingModel,
    call_on_loop,
    check_optimizer,
    check_sample_request,
    error_category,
    forward_outcome,
    log,
    metadata_strings,
    remember,
    to_local_path,
    to_tinker_path,
)
from tempering.serve.wire import (
    ForwardBackwardCall,
    WireError,
    check_sparse_inputs,
    encode_sample_response,
)

__all__ = [
    "DEFAULT_SESSION_TTL_S",
    "GAP_TIMEOUT_S",
    "Engine",
    "Payload",
    "RequestError",
    "error_category",
    "to_local_path",
]


class Engine:
    """The local engine behind the wire protocol (see the module docstring).

    ``data_dir`` holds the checkpoint store (and the tiny model when it is asked for), so
    ``tinker://`` paths handed out resolve after a restart.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        device: str | None = None,
        dtype: str | None = None,
    ) -> None:
        threads = os.environ.get("TEMPERING_NUM_THREADS")
        if threads:
            set_torch_threads(int(threads))
        self.placement: Placement = resolve_placement(device, dtype)  # a bad one: nothing written yet
        self.store = CheckpointStore(data_dir)
        self.store.root.mkdir(parents=True, exist_ok=True)
        self.futures = FutureTable()
        self.sessions = Sessions()
        self.models: dict[str, TrainingModel] = {}
        """Model id (``<session>:train:<model_seq_id>``, as the SDK derives it) -> training model."""
        self.session_models: dict[str, list[str]] = {}
        """Session id -> every model id created in it (``GET /sessions/{id}``)."""
        self.samplers: dict[str, Sampler] = {}
        self.loader = ModelLoader(self.store, self.placement, share_bases=True)
        """Builds every model; base models are loaded once and shared (see the module docstring)."""
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loader = Worker("serve-loader")
        spill = Path(tempfile.mkdtemp(prefix="tempering-serve-samplers-"))
        resident = int(os.environ.get("TEMPERING_SERVE_RESIDENT_SAMPLERS", DEFAULT_MAX_RESIDENT))
        self.pool = SamplerPool(self.loader, self._loader, spill, max_resident=resident)
        """Sampler weights: shared, deduplicated, bounded in memory (:mod:`tempering.serve.samplers`)."""

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Remember the event loop that owns the bookkeeping (workers report back to it)."""
        self.loop = loop

    # ---- sessions ----------------------------------------------------------------------------

    def create_session(self, request: ttypes.CreateSessionRequest) -> str:
        return self.sessions.create(request)

    def open_session(self, session_id: str) -> None:
        """Check that ``session_id`` exists and is not finished; it counts as activity."""
        self.sessions.touch(session_id)

    def get_session(self, session_id: str) -> dict[str, object]:
        """``GET /sessions/{id}`` in the SDK's ``GetSessionResponse`` shape."""
        if session_id not in self.sessions.state:
            raise RequestError(404, f"unknown session {session_id!r}")
        return {
            "training_run_ids": list(self.session_models.get(session_id, [])),
            "sampler_ids": [s for s, sampler in self.samplers.items() if sampler.session_id == session_id],
            "user_metadata": self.sessions.described[session_id][0],
            "display_name": self.sessions.described[session_id][1],
        }

    def finish_session(self, session_id: str) -> None:
        """Mark the session finished and release its models and samplers (queued work first)."""
        self.sessions.finish(session_id)
        for model_id in [m for m, model in self.models.items() if model.session_id == session_id]:
            model = self.models.pop(model_id)
            model.queue.submit(lambda model=model: model.trainer().close())
            model.queue.close(wait=False)
        for sampler_id in [s for s, sampler in self.samplers.items() if sampler.session_id == session_id]:
            sampler = self.samplers.pop(sampler_id)
            self.pool.release(sampler_id, sampler.ref)

    def expire_idle_sessions(self, ttl_s: float, now: float | None = None) -> list[str]:
        """Finish every open session that has sent nothing for ``ttl_s`` seconds (its client
        exited without ``close()``); returns their ids."""
        idle = self.sessions.idle(ttl_s, time.monotonic() if now is None else now)
        for session_id in idle:
            models = sum(m.session_id == session_id for m in self.models.values())
            samplers = sum(s.session_id == session_id for s in self.samplers.values())
            self.finish_session(session_id)
            log.warning(
                "session %s expired after %.0f s without a request or heartbeat (--session-ttl-s %g): "
                "released %d training model(s) and %d sampler(s)",
                session_id,
                self.sessions.expired[session_id],
                ttl_s,
                models,
                samplers,
            )
        return idle

    def counts(self) -> dict[str, int]:
        """Open sessions, training models and samplers (reported by ``/healthz``)."""
        return {
            "sessions": len(self.sessions.last_seen),
            "training_models": len(self.models),
            "samplers": len(self.samplers),
            "sampler_weights": self.pool.held_count(),
            "resident_sampler_weights": self.pool.resident_count(),
            "sampler_decode_copies": self.pool.decode_copy_count(),
        }

    # ---- base models ---------------------------------------------------------------------------

    def model_dir(self, base_model: str) -> Path:
        """The directory of ``base_model`` (``tempering/tiny`` or a local model directory)."""
        try:
            return resolve_model_dir(base_model, self.store.root)
        except LocalEngineError as exc:
            raise RequestError(404, str(exc)) from exc

    # ---- training models -----------------------------------------------------------------------

    def model(self, model_id: str) -> TrainingModel:
        model = self.models.get(model_id)
        if model is None:
            session_id = model_id.partition(":train:")[0]
            if session_id in self.sessions.expired:
                raise RequestError(410, f"model {model_id!r}: {self.sessions.finished_message(session_id)}")
            raise RequestError(404, f"unknown model {model_id!r} (finished session, or a restarted server)")
        if model.session_id in self.sessions.last_seen:
            self.sessions.last_seen[model.session_id] = time.monotonic()
        return model

    def create_model(self, request: ttypes.CreateModelRequest) -> str:
        check_optimizer("create_model", request.optimizer_config)
        if request.lora_config is None:
            raise RequestError(400, "create_model: the local server trains LoRA adapters; give lora_config")
        lora_config = request.lora_config
        if lora_config.rank < 1:
            raise RequestError(400, f"create_model: LoRA rank must be >= 1, got {lora_config.rank}")
        self.model_dir(request.base_model)
        shape = LoraShape(
            lora_config.rank, lora_config.train_mlp, lora_config.train_attn, lora_config.train_unembed
        )
        seed = lora_config.seed or 0
        base_model = request.base_model
        model_id = f"{request.session_id}:train:{request.model_seq_id}"
        return self._register(
            request.session_id,
            request.model_seq_id,
            lambda: self.loader.trainer(base_model, shape, seed),
            lambda: ("json", {"model_id": model_id, "type": "create_model"}),
            request.user_metadata,
        )

    def create_model_from_state(self, request: ttypes.LoadWeightsRequest) -> str:
        """``load_weights`` addressed by session: a new training model starting from a checkpoint."""
        assert request.session_id is not None
        assert request.model_seq_id is not None
        check_optimizer("load_weights", request.optimizer_config)
        path = to_local_path(request.path)
        self.check_checkpoint(path)
        with_optimizer = request.optimizer
        model_id = f"{request.session_id}:train:{request.model_seq_id}"
        tinker_path = request.path
        return self._register(
            request.session_id,
            request.model_seq_id,
            lambda: self.loader.trainer_from_checkpoint(
                path, with_optimizer=with_optimizer, shown_as=to_tinker_path(path)
            ),
            lambda: ("json", {"path": tinker_path, "model_id": model_id, "type": "load_weights"}),
            request.user_metadata,
        )

    def _register(
        self,
        session_id: str,
        model_seq_id: int,
        build: Callable[[], LocalTrainingClient],
        answer: Callable[[], Payload],
        user_metadata: Mapping[str, object] | None,
    ) -> str:
        """Build a training model in the session's slot ``model_seq_id``; its id is
        ``<session>:train:<model_seq_id>`` (the SDK derives it so too). The run id of its
        checkpoints is the trainer's; the run's ``tinker.json`` records the model id (so
        ``RestClient.list_checkpoints(model_id)`` finds them) and ``user_metadata``."""
        self.open_session(session_id)
        model_id = f"{session_id}:train:{model_seq_id}"
        existing = self.models.get(model_id)
        if existing is not None:
            return existing.create_request_id
        if model_id in self.session_models.get(session_id, []):
            raise RequestError(
                400, f"model_seq_id {model_seq_id} of session {session_id!r} holds a copy (copy_weights)"
            )
        queue = Worker("serve-model")
        created = queue.submit(build).future()
        metadata = metadata_strings(user_metadata)

        def ready(trainer: LocalTrainingClient) -> Payload:
            self.store.annotate_run(trainer.model_id, model_id=model_id, user_metadata=metadata)
            return answer()

        payload: ConcurrentFuture[Payload] = ConcurrentFuture()
        forward_outcome(created, payload, ready)
        model = TrainingModel(model_id=model_id, session_id=session_id, queue=queue, created=created)
        model.create_request_id = self.futures.add(payload)
        self.models[model_id] = model
        self.session_models.setdefault(session_id, []).append(model_id)
        return model.create_request_id

    def check_checkpoint(self, local_path: str) -> None:
        """Refuse an unknown checkpoint at once (404) rather than through a failed future; an
        expired one (``ttl_seconds``) is removed and refused the same way."""
        try:
            self.store.read_meta(local_path)
        except LocalEngineError as exc:
            status = 404 if isinstance(exc, FileNotFoundError) else 400
            raise RequestError(status, str(exc).replace(SCHEME, TINKER_SCHEME)) from exc
        expires = self.store.annotations(local_path).get("expires_at")
        if local_path.startswith(SCHEME) and expires is not None and float(expires) < time.time():
            remove_checkpoint(self.store, local_path)
            raise RequestError(
                404, f"checkpoint {to_tinker_path(local_path)} expired (ttl_seconds) and is gone"
            )

    def submit_ordered(
        self, model_id: str, seq_id: int | None, job: Callable[[LocalTrainingClient], Payload]
    ) -> str:
        """Queue ``job`` on the model in ``seq_id`` order (see the module docstring)."""
        model = self.model(model_id)
        if seq_id is not None and seq_id in model.seen:
            return model.seen[seq_id]
        result: ConcurrentFuture[Payload] = ConcurrentFuture()
        request_id = self.futures.add(result)

        def dispatch() -> None:
            forward_outcome(model.queue.submit(lambda: job(model.trainer())).future(), result, lambda p: p)

        if seq_id is None:
            dispatch()
            return request_id
        remember(model.seen, seq_id, request_id)
        model.in_order(seq_id, dispatch)
        return request_id

    def refused(self, model_id: str | None, seq_id: int | None) -> None:
        """A request numbered ``seq_id`` for ``model_id`` was refused (4xx) before it was queued.

        The SDK never resends a refused request, so its number is used up: the requests behind
        it must not wait :data:`GAP_TIMEOUT_S` for it. A resend of an accepted request, an
        unknown model or a number already passed changes nothing.
        """
        model = self.models.get(model_id) if model_id is not None else None
        if model is None or seq_id is None or seq_id in model.seen or seq_id < model.next_seq:
            return
        model.in_order(seq_id, lambda: None)

    @contextlib.contextmanager
    def refusals_consume(self, model_id: str | None, seq_id: int | None) -> Generator[None]:
        """Mark ``seq_id`` used up (:meth:`refused`) if the block refuses the request."""
        try:
            yield
        except (RequestError, WireError):
            self.refused(model_id, seq_id)
            raise

    # ---- training requests ---------------------------------------------------------------------

    def forward_backward(self, call: ForwardBackwardCall) -> str:
        check_sparse_inputs(call.message)
        return self.submit_ordered(call.model_id, call.seq_id, forward_backward_job(call))

    def optim_step(self, request: ttypes.OptimStepRequest) -> str:
        job = self._new_weights(request.model_id, optim_step_job(request))
        return self.submit_ordered(request.model_id, request.seq_id, job)

    def _new_weights(
        self, model_id: str, job: Callable[[LocalTrainingClient], Payload]
    ) -> Callable[[LocalTrainingClient], Payload]:
        """``job``, then a new weights version of ``model_id`` for the sampler pool's snapshots."""

        def run(trainer: LocalTrainingClient) -> Payload:
            payload = job(trainer)
            self.pool.bump(model_id)
            return payload

        return run

    def save_state(self, request: ttypes.SaveWeightsRequest) -> str:
        return self.submit_ordered(request.model_id, request.seq_id, save_state_job(self.store, request))

    def save_weights_for_sampler(
        self, request: ttypes.SaveWeightsForSamplerRequest, *, kind: ttypes.SamplingClientKind = "snapshot"
    ) -> str:
        """A named sampler checkpoint (``path``), or a sampler of the current weights for a
        sampling session (``sampling_session_seq_id``). ``kind`` is the request's:
        ``"snapshot"`` fixes the weights as they are now, ``"inflight"`` points the sampler at
        the model's one inflight target, updated in place (:mod:`tempering.serve.samplers`)."""
        model = self.model(request.model_id)
        if request.path is not None:
            job = save_sampler_weights_job(self.store, request)
            return self.submit_ordered(request.model_id, request.seq_id, job)
        if request.sampling_session_seq_id is None:
            raise RequestError(400, "save_weights_for_sampler: give path or sampling_session_seq_id")
        if request.ttl_seconds is not None or request.user_metadata is not None:
            raise RequestError(
                400,
                "save_weights_for_sampler: ttl_seconds and user_metadata belong to a named checkpoint "
                "(give path); a save for a sampling session keeps no checkpoint",
            )
        sampler_id = f"{model.session_id}:sample:{request.sampling_session_seq_id}"
        if request.seq_id is not None and request.seq_id in model.seen:
            return model.seen[request.seq_id]

        def snapshot(trainer: LocalTrainingClient) -> Payload:
            # Runs in order on the model's queue, so the weights are those after every earlier
            # request; the snapshot is taken before the next request starts. The same weights
            # version shares one snapshot; inflight clients share one target, updated here.
            make = trainer.snapshot
            lora = trainer.spec.lora
            if kind == "inflight":
                ref = self.pool.inflight(sampler_id, model.model_id, make, lora)
            else:
                ref = self.pool.snapshot(sampler_id, model.model_id, make, lora)
            base = str(trainer.spec.model_dir)
            sampler = Sampler(sampler_id, model.session_id, ref, base, None)
            assert self.loop is not None, "Engine.attach(loop) was not called"
            call_on_loop(self.loop, lambda: self.samplers.__setitem__(sampler_id, sampler))
            return ("json", {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"})

        return self.submit_ordered(request.model_id, request.seq_id, snapshot)

    def load_state(self, request: ttypes.LoadWeightsRequest) -> str:
        assert request.model_id is not None
        path = to_local_path(request.path)
        self.check_checkpoint(path)
        job = self._new_weights(request.model_id, load_state_job(request, path))
        return self.submit_ordered(request.model_id, request.seq_id, job)

    async def get_info(self, model_id: str) -> dict[str, object]:
        model = self.model(model_id)
        try:
            trainer = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(model.created)), 60)
        except TimeoutError as exc:
            raise RequestError(409, f"model {model_id!r} is still loading") from exc
        except Exception as exc:
            raise RequestError(400, f"model {model_id!r} failed to load: {exc}") from exc
        return info_payload(trainer, model_id)

    # ---- sampling ------------------------------------------------------------------------------

    def create_sampling_session(self, request: ttypes.CreateSamplingSessionRequest) -> str:
        self.open_session(request.session_id)
        sampler_id = f"{request.session_id}:sample:{request.sampling_session_seq_id}"
        if sampler_id in self.samplers:
            return sampler_id
        if request.model_path is not None:
            path = to_local_path(request.model_path)
            self.check_checkpoint(path)
            meta = self.store.read_meta(path)
            model_dir = self.model_dir(meta.base_model)
            ref = self.pool.checkpoint(sampler_id, path)
            self.samplers[sampler_id] = Sampler(
                sampler_id, request.session_id, ref, str(model_dir), request.model_path
            )
            return sampler_id
        if request.base_model is None:
            raise RequestError(400, "create_sampling_session: give model_path or base_model")
        model_dir = self.model_dir(request.base_model)
        ref = self.pool.base(sampler_id, request.base_model, model_dir)
        self.samplers[sampler_id] = Sampler(sampler_id, request.session_id, ref, str(model_dir), None)
        return sampler_id

    def sampler(self, sampler_id: str) -> Sampler:
        sampler = self.samplers.get(sampler_id)
        if sampler is None:
            raise RequestError(404, f"unknown sampler {sampler_id!r}")
        return sampler

    def sample(self, request: ttypes.SampleRequest) -> tuple[str, list[str]]:
        if request.sampling_session_id is None:
            raise RequestError(400, "asample: the local server samples through sampling sessions only")
        target = check_sample_request(request)
        sampler = self.sampler(request.sampling_session_id)
        seq = request.seq_id
        if seq is not None and seq in sampler.seen:
            return sampler.seen[seq]
        local = (
            sampler.ref.client()
            .sample(
                request.prompt,
                request.num_samples,
                request.sampling_params,
                bool(request.prompt_logprobs),
                topk_prompt_logprobs=request.topk_prompt_logprobs,
                topk_sample_logprobs=request.topk_sample_logprobs,
                target_prompt_logprobs=target,
            )
            .future()
        )
        if local.done() and local.exception() is not None:
            error = local.exception()
            raise RequestError(400, f"asample: {error}")
        result: ConcurrentFuture[Payload] = ConcurrentFuture()
        forward_outcome(local, result, lambda response: ("proto", encode_sample_response(response)))
        request_id = self.futures.add(result)
        ids = [f"{sampler.sampler_id}:{seq}:{i}" for i in range(request.num_samples)]
        if seq is not None:
            remember(sampler.seen, seq, (request_id, ids))
        return request_id, ids

    def close(self) -> None:
        """Stop every queue (queued work is dropped; checkpoints on disk stay)."""
        for model in self.models.values():
            model.queue.close(wait=False)
        self.pool.close()
        self._loader.close(wait=False)
