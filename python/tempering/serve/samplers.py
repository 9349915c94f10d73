"""The server's sampler weights: shared, deduplicated, bounded in memory.

An RL loop against the server makes a sampling client every step
(``save_weights_and_get_sampling_client``) and drops it; the SDK never says so. Kept as they
were made, those samplers would grow the server by one set of weights per step. Here:

- **A sampler's weights are a reference** (:class:`SamplerRef`) that several sampling
  sessions can hold: the base model (one per directory, never evicted); a checkpoint path (one
  per path); a training model's snapshot (one per model and weights version, so saving twice
  without an ``optim_step`` between makes no second copy); a training model's ``inflight``
  target (one per model, updated in place by each later inflight save).
- **LoRA snapshots share the base model's weights** (``tempering.local.model.sampling_copy``):
  each costs its adapter's memory, plus, once it decodes, its decode copy (the adapter merged
  into the adapted weights in float32, or cast to the model's dtype:
  ``SamplerModel.decode_model``). Only the most recently used resident samplers
  (:data:`DECODE_COPIES`) keep that copy; it goes with a sampler that is evicted or released.
- **At most ``max_resident`` non-base weight sets stay in memory** (least recently used
  first out). An evicted snapshot's adapter is written to ``spill_dir`` once and read back when
  a request needs it again, so its samples are unchanged; an evicted checkpoint sampler reloads
  from its checkpoint. So resident memory is flat over an RL run of any length, while every
  sampler the server handed out keeps working until its session ends.
- **A session's end releases its references**: a weight set no session refers to any more is
  dropped from memory and its spill file deleted.

Threads: references are made on training-model queues (snapshots) and on the event loop
(sessions); every method takes the pool's lock. Loading and spilling run on the pool's worker,
in order, so a reload always finds the spill written before it.
"""

from __future__ import annotations

import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future as ConcurrentFuture
from pathlib import Path

import attrs
import torch
from safetensors.torch import load_file, save_file

from tempering.local.checkpoints import LoraMeta
from tempering.local.futures import Worker
from tempering.local.loader import ModelLoader
from tempering.local.sampling import LocalSamplingClient, SamplerModel

__all__ = ["DECODE_COPIES", "DEFAULT_MAX_RESIDENT", "SamplerPool", "SamplerRef"]

DEFAULT_MAX_RESIDENT = 4
"""Non-base sampler weight sets kept in memory at once (``TEMPERING_SERVE_RESIDENT_SAMPLERS``)."""

DECODE_COPIES = 1
"""Resident samplers that keep their decode copy (the most recently used): a merged copy costs
the adapted weights, so an RL loop's older snapshots, which the SDK never says it dropped, keep
their adapter only, and make the copy again if a request comes for them."""


@attrs.define(eq=False)
class SamplerRef:
    """One set of sampler weights that sampling sessions refer to (see the module docstring).

    ``client()`` returns the resident sampling client, reloading the weights first if they
    were evicted.
    """

    pool: SamplerPool
    key: Hashable
    reload: Callable[[], SamplerModel] | None
    """Builds the weights again after an eviction (None: only from a spill file)."""
    pinned: bool = attrs.field(default=False, kw_only=True)
    lora: LoraMeta | None = attrs.field(default=None, kw_only=True)
    """The adapter's shape, for a snapshot that may be spilled."""
    users: set[str] = attrs.field(init=False, factory=set[str])
    """The sampler ids (sampling sessions) that refer to these weights."""
    weights: ConcurrentFuture[SamplerModel] | None = attrs.field(init=False, default=None)
    resident_client: LocalSamplingClient | None = attrs.field(init=False, default=None)
    spill: Path | None = attrs.field(init=False, default=None)

    def client(self) -> LocalSamplingClient:
        return self.pool.resident(self)


class SamplerPool:
    """Sampler weights for one server (see the module docstring)."""

    def __init__(
        self,
        loader: ModelLoader,
        worker: Worker,
        spill_dir: Path,
        *,
        max_resident: int = DEFAULT_MAX_RESIDENT,
    ) -> None:
        if max_resident < 1:
            raise ValueError(f"max_resident must be >= 1, got {max_resident}")
        self.loader = loader
        self.worker = worker
        self.spill_dir = spill_dir
        self.max_resident = max_resident
        self.refs: dict[Hashable, SamplerRef] = {}
        self._lru: OrderedDict[Hashable, SamplerRef] = OrderedDict()
        self._versions: dict[str, int] = {}
        self._lock = threading.RLock()
        self.spilled = 0
        """How many times weights were written out (for tests and ``/healthz``)."""
        self.reloaded = 0

    # ---- versions of training models' weights ---------------------------------------------------

    def bump(self, model_id: str) -> None:
        """The weights of ``model_id`` changed (an ``optim_step`` or a load ran on its queue)."""
        with self._lock:
            self._versions[model_id] = self._versions.get(model_id, 0) + 1

    def version(self, model_id: str) -> int:
        with self._lock:
            return self._versions.get(model_id, 0)

    # ---- making references ----------------------------------------------------------------------

    def base(self, user: str, base_model: str, model_dir: Path) -> SamplerRef:
        """The base model's sampler (one per directory, kept while the server runs)."""
        loader = self.loader
        return self._ref(user, ("base", model_dir), lambda: loader.base_sampler(base_model), pinned=True)

    def checkpoint(self, user: str, local_path: str) -> SamplerRef:
        """A sampler of the checkpoint at ``local_path`` (reloaded from it after an eviction)."""
        loader = self.loader
        return self._ref(user, ("path", local_path), lambda: loader.sampler(local_path))

    def snapshot(
        self, user: str, model_id: str, make: Callable[[], SamplerModel], lora: LoraMeta | None
    ) -> SamplerRef:
        """A sampler of a training model's weights as they are now (call it on the model's
        queue). The same weights version shares one reference; ``make`` runs only for a new
        one, on the calling thread."""
        with self._lock:
            key = ("snapshot", model_id, self._versions.get(model_id, 0))
            ref = self.refs.get(key)
            if ref is not None and (ref.weights is not None or ref.spill is not None):
                ref.users.add(user)
                return ref
        weights = make()
        with self._lock:
            ref = self._ref(user, key, None, lora=lora, ready=weights)
            return ref

    def inflight(
        self, user: str, model_id: str, make: Callable[[], SamplerModel], lora: LoraMeta | None
    ) -> SamplerRef:
        """The training model's one ``inflight`` sampler, its weights set to the model's weights
        now (copied in place into the existing target; call it on the model's queue)."""
        key = ("inflight", model_id)
        with self._lock:
            ref = self.refs.get(key)
            current = ref.weights if ref is not None else None
        fresh = make()
        with self._lock:
            if ref is None or current is None or not current.done() or current.exception() is not None:
                if ref is not None:
                    self._drop_weights(ref)
                    ref.spill = None
                return self._ref(user, key, None, lora=lora, ready=fresh)
            target = current.result().model
            with torch.no_grad():
                sources = dict(fresh.model.named_parameters())
                for name, p in target.named_parameters():
                    source = sources[name]
                    if source is not p:
                        p.copy_(source)
            ref.users.add(user)
            self._touch(ref)
            return ref

    def _ref(
        self,
        user: str,
        key: Hashable,
        reload: Callable[[], SamplerModel] | None,
        *,
        pinned: bool = False,
        lora: LoraMeta | None = None,
        ready: SamplerModel | None = None,
    ) -> SamplerRef:
        with self._lock:
            ref = self.refs.get(key)
            if ref is None:
                ref = SamplerRef(self, key, reload, pinned=pinned, lora=lora)
                self.refs[key] = ref
            if ready is not None and ref.weights is None:
                done: ConcurrentFuture[SamplerModel] = ConcurrentFuture()
                done.set_result(ready)
                ref.weights = done
                ref.resident_client = LocalSamplingClient(done)
                self._touch(ref)
            ref.users.add(user)
            return ref

    # ---- residency ------------------------------------------------------------------------------

    def resident(self, ref: SamplerRef) -> LocalSamplingClient:
        """``ref``'s sampling client, loading its weights first if they were evicted."""
        with self._lock:
            if ref.resident_client is None:
                spill, lora = ref.spill, ref.lora
                reload = ref.reload
                loader = self.loader
                if reload is None:
                    if spill is None or lora is None:
                        raise RuntimeError(f"sampler weights {ref.key!r} were released")

                    def from_spill(spill: Path = spill, lora: LoraMeta = lora) -> SamplerModel:
                        return loader.sampler_from_weights(_spill_base(spill), lora, load_file(spill))

                    reload = from_spill
                ref.weights = self.worker.submit(reload).future()
                ref.resident_client = LocalSamplingClient(ref.weights)
                if not ref.pinned:
                    self.reloaded += 1
            self._touch(ref)
            return ref.resident_client

    def _touch(self, ref: SamplerRef) -> None:
        if ref.pinned:
            return
        self._lru[ref.key] = ref
        self._lru.move_to_end(ref.key)
        while len(self._lru) > self.max_resident:
            _, oldest = self._lru.popitem(last=False)
            self._evict(oldest)
        for older in list(self._lru.values())[:-DECODE_COPIES]:
            weights = older.weights
            if weights is None or not weights.done() or weights.exception() is not None:
                continue
            weights.result().release_decode_copy()

    def _evict(self, ref: SamplerRef) -> None:
        """Take ``ref``'s weights out of memory (a snapshot's adapter is spilled first)."""
        client, weights = ref.resident_client, ref.weights
        ref.resident_client, ref.weights = None, None
        needs_spill = ref.reload is None and ref.spill is None and ref.lora is not None
        if needs_spill:
            ref.spill = self.spill_dir / f"{abs(hash(ref.key)):x}-{id(ref):x}.safetensors"
            self.spilled += 1
        spill = ref.spill if needs_spill else None

        def retire() -> None:
            if client is not None:
                client.close()  # finishes the requests queued on it
            if spill is not None and weights is not None:
                model = weights.result()
                _write_spill(spill, model)

        self.worker.submit(retire)

    def _drop_weights(self, ref: SamplerRef) -> None:
        self._lru.pop(ref.key, None)
        client = ref.resident_client
        ref.resident_client, ref.weights = None, None
        spill = ref.spill
        ref.spill = None

        def retire() -> None:
            if client is not None:
                client.close()
            if spill is not None:
                spill.unlink(missing_ok=True)

        self.worker.submit(retire)

    # ---- releasing ------------------------------------------------------------------------------

    def release(self, user: str, ref: SamplerRef) -> None:
        """Sampler ``user`` is gone; drop ``ref``'s weights once nobody refers to them."""
        with self._lock:
            ref.users.discard(user)
            if ref.users or ref.pinned:
                return
            self.refs.pop(ref.key, None)
            self._drop_weights(ref)

    def held_count(self) -> int:
        """Non-base weight sets that some sampling session refers to (in memory or spilled)."""
        with self._lock:
            return sum(not r.pinned for r in self.refs.values())

    def resident_count(self) -> int:
        """Non-base weight sets in memory now."""
        with self._lock:
            return len(self._lru)

    def decode_copy_count(self) -> int:
        """Resident non-base samplers holding a decode copy now (at most :data:`DECODE_COPIES`
        once their decodes have ended)."""
        with self._lock:
            weights = [r.weights for r in self._lru.values()]
        return sum(
            w is not None and w.done() and w.exception() is None and w.result().has_decode_copy()
            for w in weights
        )

    def close(self) -> None:
        with self._lock:
            clients = [r.resident_client for r in self.refs.values() if r.resident_client is not None]
            self.refs.clear()
            self._lru.clear()
        for client in clients:
            client.close()
        shutil.rmtree(self.spill_dir, ignore_errors=True)


def _spill_base(spill: Path) -> str:
    return spill.with_suffix(".base").read_text()


def _write_spill(spill: Path, model: SamplerModel) -> None:
    """Write a snapshot's adapter weights (not the shared base) and its base model's name."""
    spill.parent.mkdir(parents=True, exist_ok=True)
    adapter = {name: p.detach().contiguous() for name, p in model.model.named_parameters() if "lora_" in name}
    tmp = spill.with_suffix(".tmp")
    save_file(adapter, str(tmp))
    spill.with_suffix(".base").write_text(model.base_model)
    tmp.replace(spill)
