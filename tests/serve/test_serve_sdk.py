"""The official ``tinker`` SDK, unchanged, against ``tempering serve`` in a subprocess: training,
every built-in loss, checkpoints, sampling, several clients, and the errors a user can make."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.request_conv import forward_backward_request_to_proto

from tempering.local import BUILTIN_LOSSES
from tempering.local import ServiceClient as LocalService
from tempering.serve.testing import API_KEY, ServerProcess

pytestmark = pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")  # the SDK's leak (conftest)

TEXT = "the quick brown fox jumps over the lazy dog"
ERROR_DEADLINE_S = 15.0
"""A user's mistake must surface this fast (the SDK would retry a 5xx or 429 for minutes)."""


def sft_datum(tokens: Sequence[int]) -> tinker.Datum:
    tokens = list(tokens)
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


def rl_datum(tokens: Sequence[int], rng: np.random.Generator) -> tinker.Datum:
    tokens = list(tokens)
    n = len(tokens) - 1
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": (-3.0 + 0.1 * rng.standard_normal(n)).astype(np.float32),
            "advantages": rng.standard_normal(n).astype(np.float32),
            # gspo's sequence ratio over the second half (other losses don't take it)
            "sequence_ratio_mask": (np.arange(n) >= n // 2).astype(np.float32),
        },
    )


def loss_data(loss: str, data: Sequence[tinker.Datum]) -> list[tinker.Datum]:
    """``data`` with only the inputs ``loss`` takes."""
    keep = {"target_tokens", *BUILTIN_LOSSES[loss].required, *BUILTIN_LOSSES[loss].per_token_config}
    return [
        tinker.Datum(
            model_input=d.model_input,
            loss_fn_inputs={k: v for k, v in d.loss_fn_inputs.items() if k in keep},
        )
        for d in data
    ]


def logprobs_of(output: tinker.ForwardBackwardOutput) -> list[np.ndarray]:
    return [o["logprobs"].to_numpy() for o in output.loss_fn_outputs]


@pytest.fixture(scope="module")
def tokens(tiny_dir: Path) -> list[int]:
    return list(TEXT.encode())  # the tiny tokenizer: token id b is byte b


@pytest.fixture(scope="module")
def trainer(service: tinker.ServiceClient, tiny_dir: Path) -> tinker.TrainingClient:
    return service.create_lora_training_client(str(tiny_dir), rank=4).result(timeout=120)


def test_sft_steps_match_the_in_process_engine(
    trainer: tinker.TrainingClient, tiny_dir: Path, tokens: list[int], tmp_path: Path
) -> None:
    data = [sft_datum(tokens), sft_datum(tokens[:20])]
    adam = tinker.AdamParams(learning_rate=1e-2)
    wire: list[float] = []
    for _ in range(3):
        # optim_step queued right behind forward_backward, before either is awaited
        fb = trainer.forward_backward(data, "cross_entropy")
        opt = trainer.optim_step(adam)
        out = fb.result(timeout=60)
        assert opt.result(timeout=60).metrics is not None
        assert set(out.metrics) == {"loss:sum"}
        assert [o["logprobs"].shape for o in out.loss_fn_outputs] == [[len(tokens) - 1], [19]]
        wire.append(out.metrics["loss:sum"])
    with LocalService(root=tmp_path, device="cpu", dtype="float32", num_threads=1) as local:
        client = local.create_lora_training_client(str(tiny_dir), rank=4).result()
        in_process: list[float] = []
        for _ in range(3):
            fb_local = client.forward_backward(data, "cross_entropy")
            client.optim_step(adam).result()
            in_process.append(fb_local.result().metrics["loss:sum"])
        client.close()
    np.testing.assert_allclose(wire, in_process, rtol=1e-4)
    assert wire[-1] < wire[0]


@pytest.mark.parametrize(
    ("loss", "config"),
    [
        ("gspo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
        ("stable_reinforce", {"kl_coeff": 0.05}),
    ],
)
def test_sequence_losses_train_like_the_in_process_engine(
    service: tinker.ServiceClient,
    tiny_dir: Path,
    tokens: list[int],
    tmp_path: Path,
    loss: str,
    config: dict[str, float],
) -> None:
    """Three steps of ``gspo`` / ``stable_reinforce`` through the SDK: the same losses as the
    engine in process, and the weights move."""
    rng = np.random.default_rng(4)
    data = loss_data(loss, [rl_datum(tokens, rng), rl_datum(tokens[:12], rng), rl_datum(tokens[5:30], rng)])
    adam = tinker.AdamParams(learning_rate=1e-2)
    client = service.create_lora_training_client(str(tiny_dir), rank=4).result(timeout=120)
    wire: list[float] = []
    for _ in range(3):
        fb = client.forward_backward(data, loss, config)  # type: ignore[arg-type]
        client.optim_step(adam).result(timeout=60)
        wire.append(fb.result(timeout=60).metrics["loss:sum"])
    with LocalService(root=tmp_path, device="cpu", dtype="float32", num_threads=1) as local:
        in_process_client = local.create_lora_training_client(str(tiny_dir), rank=4).result()
        in_process: list[float] = []
        for _ in range(3):
            fb_local = in_process_client.forward_backward(data, loss, config)  # type: ignore[arg-type]
            in_process_client.optim_step(adam).result()
            in_process.append(fb_local.result().metrics["loss:sum"])
        in_process_client.close()
    assert all(np.isfinite(wire))
    np.testing.assert_allclose(wire, in_process, rtol=1e-4, atol=1e-5)
    assert wire[0] != pytest.approx(wire[-1], rel=1e-6), "the weights did not move"


def test_tokenizer_and_info_offline(trainer: tinker.TrainingClient, tiny_dir: Path) -> None:
    tokenizer = trainer.get_tokenizer()  # AutoTokenizer.from_pretrained(<local directory>)
    assert tokenizer.encode("hi") == [104, 105]
    info = trainer.get_info()
    assert info.model_data.model_name == str(tiny_dir.resolve())
    assert info.lora_rank == 4
    assert trainer.model_id.endswith(":train:0")


@pytest.mark.parametrize("loss", sorted(BUILTIN_LOSSES))
def test_every_builtin_loss(trainer: tinker.TrainingClient, tokens: list[int], loss: str) -> None:
    rng = np.random.default_rng(0)
    data = (
        [sft_datum(tokens)]
        if loss == "cross_entropy"
        else loss_data(loss, [rl_datum(tokens, rng), rl_datum(tokens[:9], rng)])
    )
    config = {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3} if loss == "ppo" else None
    forward = trainer.forward(data, loss, config).result(timeout=60)
    backward = trainer.forward_backward(data, loss, config).result(timeout=60)
    assert np.isfinite(backward.metrics["loss:sum"])
    np.testing.assert_allclose(backward.metrics["loss:sum"], forward.metrics["loss:sum"], rtol=1e-5)
    for a, b in zip(logprobs_of(forward), logprobs_of(backward), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_checkpoints_round_trip(
    service: tinker.ServiceClient, trainer: tinker.TrainingClient, tokens: list[int]
) -> None:
    data = [sft_datum(tokens)]
    saved = trainer.save_state("ckpt-a").result(timeout=60)
    assert saved.path.startswith("tinker://")
    assert saved.path.endswith("/weights/ckpt-a")
    before = logprobs_of(trainer.forward(data, "cross_entropy").result(timeout=60))
    trainer.forward_backward(data, "cross_entropy")
    trainer.optim_step(tinker.AdamParams(learning_rate=5e-2)).result(timeout=60)
    moved = logprobs_of(trainer.forward(data, "cross_entropy").result(timeout=60))
    assert not np.allclose(moved[0], before[0])
    with pytest.warns(FutureWarning):
        trainer.load_state(saved.path).result(timeout=60)
    np.testing.assert_allclose(
        logprobs_of(trainer.forward(data, "cross_entropy").result(timeout=60))[0], before[0], rtol=1e-5
    )
    with pytest.warns(FutureWarning):
        trainer.load_state_with_optimizer(saved.path).result(timeout=60)
    for create in (
        service.create_training_client_from_state,
        service.create_training_client_from_state_with_optimizer,
    ):
        resumed = create(saved.path).result(timeout=120)
        assert resumed.model_id != trainer.model_id
        got = logprobs_of(resumed.forward(data, "cross_entropy").result(timeout=60))
        np.testing.assert_allclose(got[0], before[0], rtol=1e-5)


def test_sampling(
    service: tinker.ServiceClient, trainer: tinker.TrainingClient, tokens: list[int], tiny_dir: Path
) -> None:
    prompt = tinker.ModelInput.from_ints(tokens[:6])
    saved = trainer.save_weights_for_sampler("sampler-a").result(timeout=60)
    assert saved.path.endswith("/sampler_weights/sampler-a")
    from_path = service.create_sampling_client(model_path=saved.path).result(timeout=120)
    snapshot = trainer.save_weights_and_get_sampling_client().result(timeout=120)
    base = service.create_sampling_client(base_model=str(tiny_dir)).result(timeout=120)
    assert from_path.get_base_model() == str(tiny_dir.resolve())
    assert base.get_tokenizer().decode([104, 105]) == "hi"

    params = tinker.SamplingParams(max_tokens=12, temperature=0.9, seed=7, stop=["e"])
    first = from_path.sample(prompt, 3, params).result(timeout=60)
    again = snapshot.sample(prompt, 3, params).result(timeout=60)
    assert len(first.sequences) == 3
    assert len({s.sequence_id for s in first.sequences}) == 3
    # Same weights (saved vs snapshot of the same state), same seed: same tokens.
    assert [s.tokens for s in first.sequences] == [s.tokens for s in again.sequences]
    for seq in first.sequences:
        text = bytes(t for t in seq.tokens if t < 256).decode(errors="replace")
        assert seq.stop_reason == "length" or "e" in text or seq.tokens[-1] >= 256
        assert seq.logprobs is not None
        assert len(seq.logprobs) == len(seq.tokens)
    greedy = base.sample(prompt, 2, tinker.SamplingParams(max_tokens=5, temperature=0.0)).result(timeout=60)
    assert greedy.sequences[0].tokens == greedy.sequences[1].tokens

    # compute_logprobs agrees with the trainer's forward on the same weights.
    seq = tokens[:16]
    lp = snapshot.compute_logprobs(tinker.ModelInput.from_ints(seq)).result(timeout=60)
    assert lp[0] is None
    assert len(lp) == 16
    fwd = logprobs_of(trainer.forward([sft_datum(seq)], "cross_entropy").result(timeout=60))[0]
    np.testing.assert_allclose(np.asarray(lp[1:], dtype=np.float32), fwd, rtol=1e-4, atol=1e-4)


def test_several_clients_at_once(service: tinker.ServiceClient, tiny_dir: Path, tokens: list[int]) -> None:
    clients = [service.create_lora_training_client(str(tiny_dir), rank=2, seed=s) for s in (1, 2)]
    trainers = [c.result(timeout=120) for c in clients]
    sampler = service.create_sampling_client(base_model=str(tiny_dir)).result(timeout=60)
    errors: list[BaseException] = []

    def train(t: tinker.TrainingClient) -> None:
        try:
            for _ in range(2):
                t.forward_backward([sft_datum(tokens)], "cross_entropy")
                t.optim_step(tinker.AdamParams(learning_rate=1e-2)).result(timeout=60)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=train, args=(t,)) for t in trainers]
    for th in threads:
        th.start()
    futures = [
        sampler.sample(tinker.ModelInput.from_ints(tokens[:4]), 2, tinker.SamplingParams(max_tokens=6))
        for _ in range(4)
    ]
    assert all(len(f.result(timeout=60).sequences) == 2 for f in futures)
    for th in threads:
        th.join(120)
    assert not errors


def test_another_process(server: ServerProcess, tiny_dir: Path) -> None:
    script = textwrap.dedent(
        f"""
        import tinker
        svc = tinker.ServiceClient(base_url={server.url!r}, api_key={API_KEY!r})
        t = svc.create_lora_training_client({str(tiny_dir)!r}, rank=2).result(timeout=120)
        d = tinker.Datum(model_input=tinker.ModelInput.from_ints([1, 2, 3]),
                         loss_fn_inputs={{"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]}})
        print(t.forward_backward([d], "cross_entropy").result(timeout=60).metrics["loss:sum"] > 0)
        s = t.save_weights_and_get_sampling_client().result(timeout=60)
        p = tinker.SamplingParams(max_tokens=3)
        print(len(s.sample(tinker.ModelInput.from_ints([1, 2]), 2, p).result(timeout=60).sequences))
        svc.close("success").result(timeout=30)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=150, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "2"]


# ---- errors: each surfaces at once, with a message ----------------------------------------------


def test_bad_api_key(server: ServerProcess, tiny_dir: Path) -> None:
    start = time.monotonic()
    bad = tinker.ServiceClient(base_url=server.url, api_key="tml-wrong")
    with pytest.raises(tinker.AuthenticationError, match="invalid API key"):
        bad.create_lora_training_client(str(tiny_dir), rank=2).result(timeout=30)
    assert time.monotonic() - start < ERROR_DEADLINE_S
    bad.close("errored").result(timeout=10)


def test_bad_datum_fails_its_future(service: tinker.ServiceClient, tiny_dir: Path, tokens: list[int]) -> None:
    client = service.create_lora_training_client(str(tiny_dir), rank=2).result(timeout=120)
    bad = tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:5]),
        loss_fn_inputs={"target_tokens": tokens[1:6], "weights": [1.0, 1.0]},
    )
    start = time.monotonic()
    with pytest.raises(tinker.RequestFailedError, match="weights") as info:
        client.forward_backward([bad], "cross_entropy").result(timeout=60)
    assert info.value.category == tinker.types.RequestErrorCategory.User
    with pytest.raises(tinker.RequestFailedError, match="gspo"):
        client.forward([sft_datum(tokens)], "gspo").result(timeout=60)
    assert time.monotonic() - start < ERROR_DEADLINE_S
    # The model is unharmed.
    assert client.forward([sft_datum(tokens)], "cross_entropy").result(timeout=60).metrics["loss:sum"] > 0


def test_unknown_checkpoint_and_model(service: tinker.ServiceClient) -> None:
    start = time.monotonic()
    missing = "tinker://run-nope/weights/none"
    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        service.create_training_client_from_state(missing).result(timeout=30)
    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        service.create_sampling_client(model_path=missing).result(timeout=30)
    with pytest.raises(tinker.NotFoundError, match="base model"):
        service.create_lora_training_client("/nonexistent/model", rank=2).result(timeout=30)
    assert time.monotonic() - start < ERROR_DEADLINE_S


def test_raw_protocol_errors(server: ServerProcess) -> None:
    headers = {"X-API-Key": API_KEY}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        r = http.post("/api/v1/forward_backward", content=b"\xff\x00garbage", headers=headers)
        assert r.status_code == 400
        assert "protobuf" in r.json()["detail"]
        r = http.post("/api/v1/optim_step", content=b"{not json", headers=headers)
        assert r.status_code == 400
        assert "JSON" in r.json()["detail"]
        r = http.post("/api/v1/retrieve_future", json={"request_id": "req-0"}, headers=headers)
        assert r.status_code == 404
        assert r.json()["detail"]
        r = http.post("/api/v1/telemetry", content=b"x" * (5 * 1024 * 1024), headers=headers)
        assert r.status_code == 413
        r = http.post("/api/v1/create_session", json={}, headers={"X-API-Key": "tml-other"})
        assert r.status_code == 401


def test_sequence_order_and_resends(server: ServerProcess, tiny_dir: Path, tokens: list[int]) -> None:
    """Requests run in seq_id order whatever their arrival order; a resend runs once."""
    headers = {"X-API-Key": API_KEY}
    with httpx.Client(base_url=server.url, timeout=60, headers=headers) as http:

        def result(request_id: str) -> httpx.Response:
            for _ in range(20):
                r = http.post("/api/v1/retrieve_future", json={"request_id": request_id})
                r.raise_for_status()
                if (
                    r.headers["content-type"].startswith("application/x-protobuf")
                    or r.json().get("type") != "try_again"
                ):
                    return r
            raise AssertionError("no result")

        session = http.post(
            "/api/v1/create_session", json={"tags": [], "user_metadata": {}, "sdk_version": "x"}
        ).json()["session_id"]
        created = http.post(
            "/api/v1/create_model",
            json={
                "session_id": session,
                "model_seq_id": 0,
                "base_model": str(tiny_dir),
                "lora_config": {"rank": 2},
            },
        ).json()
        model_id = result(created["request_id"]).json()["model_id"]

        def fwd(seq: int, forward_only: bool) -> str:
            request = tinker.types.ForwardBackwardRequest(
                forward_backward_input=tinker.types.ForwardBackwardInput(
                    data=[sft_datum(tokens)], loss_fn="cross_entropy"
                ),
                model_id=model_id,
                seq_id=seq,
            )
            message = forward_backward_request_to_proto(request)
            message.forward_only = forward_only
            r = http.post(
                "/api/v1/forward_backward",
                content=message.SerializeToString(),
                headers={"Content-Type": "application/x-protobuf"},
            )
            return r.json()["request_id"]

        def loss(request_id: str) -> float:
            out = pb.ForwardBackwardOutput()
            out.ParseFromString(result(request_id).content)
            return out.metrics["loss:sum"]

        # A small step: at 0.05 whether one Adam step lowers the loss depends on the adapter's draw.
        optim = {"model_id": model_id, "seq_id": 2, "adam_params": {"learning_rate": 0.01}}
        first = fwd(1, forward_only=False)
        after = fwd(3, forward_only=True)  # arrives before seq 2 and must wait for it
        step = http.post("/api/v1/optim_step", json=optim).json()["request_id"]
        resent = http.post("/api/v1/optim_step", json=optim).json()["request_id"]
        assert resent == step
        later = fwd(4, forward_only=True)
        assert fwd(1, forward_only=False) == first
        assert loss(after) < loss(first)
        assert loss(after) == pytest.approx(loss(later), rel=1e-6)  # the step ran once
