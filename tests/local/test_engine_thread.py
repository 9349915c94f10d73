"""The engine thread: every client's torch work on one thread (one OpenMP pool per process),
each client's requests in order, a request that waits for another one helped rather than
deadlocked, and a decoding batch that yields the thread to a queued training request."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tinker
import torch
from local_helpers import sft_datum

from tempering.local import ServiceClient
from tempering.local.engine_thread import engine_thread, on_engine_thread, run_on_engine_thread
from tempering.local.futures import Worker
from tempering.local.tiny import TINY_MODEL


def _engine_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("tempering-"))


def test_trainers_and_samplers_share_one_thread(service: ServiceClient) -> None:
    trainer = service.create_lora_training_client(TINY_MODEL, rank=4).result()
    other = service.create_lora_training_client(TINY_MODEL, rank=4).result()
    seen: list[str] = []

    def loss(data: list[tinker.Datum], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        del data
        seen.append(threading.current_thread().name)
        return -sum(lp.sum() for lp in logprobs), {}  # type: ignore[return-value]

    datum = sft_datum(list(range(40, 60)))
    trainer.forward_backward_custom([datum], loss).result()
    other.forward_backward_custom([datum], loss).result()
    sampler = trainer.save_weights_and_get_sampling_client()
    out = sampler.sample(
        tinker.ModelInput.from_ints([40, 41, 42]), 2, tinker.SamplingParams(max_tokens=4)
    ).result()
    assert len(out.sequences) == 2
    assert seen == ["tempering-engine", "tempering-engine"]
    assert _engine_threads() == ["tempering-engine"]  # no thread per client
    assert run_on_engine_thread(on_engine_thread).result() is True
    assert not on_engine_thread()
    for client in (sampler, trainer, other):
        client.close()


def test_a_waiting_request_is_helped_and_queues_stay_in_order() -> None:
    a, b = Worker("test-a"), Worker("test-b")
    order: list[str] = []
    gate = threading.Event()

    def first_of_a() -> str:
        gate.wait(10)
        # Waits for a request of b queued after this one: on one thread that runs b's queue
        # meanwhile, but not a's own second request (a's order holds).
        inner = b.submit(lambda: order.append("b1") or "from b")
        got = inner.result(timeout=10)
        order.append("a1")
        return got

    f1 = a.submit(first_of_a)
    f2 = a.submit(lambda: order.append("a2"))
    f3 = b.submit(lambda: order.append("b0"))
    gate.set()
    assert f1.result(timeout=20) == "from b"
    f2.result(timeout=20)
    f3.result(timeout=20)
    assert order == ["b0", "b1", "a1", "a2"]
    a.close()
    b.close()
    assert a.submit(lambda: None).future().exception() is not None  # closed: refused


def test_a_decoding_batch_yields_to_a_queued_training_request(service: ServiceClient) -> None:
    """Requests that arrive while another client's request waits are not admitted into the
    running batch: the training request runs before them (before this engine it ran beside
    the batch on its own thread, and the late request joined the batch)."""
    trainer = service.create_lora_training_client(TINY_MODEL, rank=4).result()
    sampler = trainer.save_weights_and_get_sampling_client()
    prompt = tinker.ModelInput.from_ints([40, 41, 42])
    sampler.sample(prompt, 1, tinker.SamplingParams(max_tokens=2)).result()  # weights ready
    finished: list[str] = []
    gate = threading.Event()
    blocker = run_on_engine_thread(lambda: gate.wait(10))
    long = sampler.sample(prompt, 4, tinker.SamplingParams(max_tokens=400, stop=[], seed=0))
    gate.set()
    blocker.result(timeout=10)
    time.sleep(0.05)  # the long request is decoding now (400 steps take far longer)
    rng = np.random.default_rng(0)
    train = trainer.forward_backward([sft_datum(list(rng.integers(32, 127, size=20)))], "cross_entropy")
    late = sampler.sample(prompt, 1, tinker.SamplingParams(max_tokens=1, seed=1))
    train.future().add_done_callback(lambda _: finished.append("train"))
    late.future().add_done_callback(lambda _: finished.append("late"))
    long.future().add_done_callback(lambda _: finished.append("long"))
    assert len(long.result(timeout=120).sequences[0].tokens) == 400
    late.result(timeout=60)
    train.result(timeout=60)
    assert finished == ["long", "train", "late"]
    assert not engine_thread().others_waiting()
    sampler.close()
    trainer.close()


def test_a_closed_sampler_refuses_new_requests(service: ServiceClient) -> None:
    sampler = service.create_sampling_client(base_model=TINY_MODEL).result()
    sampler.close()
    with pytest.raises(RuntimeError, match="closed"):
        sampler.sample(tinker.ModelInput.from_ints([40]), 1, tinker.SamplingParams(max_tokens=1)).result()


def test_sampling_from_the_engine_thread_does_not_deadlock(service: ServiceClient) -> None:
    """A sample's future is completed by the decoding batch, a later request on the same
    thread: waiting for it there runs the batch instead of blocking."""
    sampler = service.create_sampling_client(base_model=TINY_MODEL).result()

    def inside() -> int:
        params = tinker.SamplingParams(max_tokens=3, stop=[], seed=0)
        response = sampler.sample(tinker.ModelInput.from_ints([40, 41]), 2, params).result(timeout=60)
        return len(response.sequences)

    assert run_on_engine_thread(inside).result(timeout=120) == 2
    sampler.close()
