"""Training within a memory budget (tempering.local.microbatch, tempering.local.forward):
micro-batches equal the unsplit computation, logits are never materialised over the whole batch,
activation checkpointing changes nothing but memory, and a request that cannot fit is refused
before anything runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tinker
import torch
from local_helpers import random_tokens, reference_model
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tempering.local import LocalTrainingClient
from tempering.local.checkpoints import CheckpointStore
from tempering.local.errors import DatumError
from tempering.local.forward import (
    CHECKPOINTING_ENV,
    TrainingForward,
    chunked_target_logprobs,
    resolve_checkpointing,
)
from tempering.local.loader import LoraShape, ModelLoader
from tempering.local.losses import check_data, pad_batch
from tempering.local.microbatch import (
    MAX_BATCH_TOKENS_ENV,
    RequestTooLargeError,
    TokenBudget,
    activation_bytes_per_token,
    plan_microbatches,
    resolve_token_budget,
)
from tempering.local.model import resolve_placement
from tempering.local.training import TrainingMemory

TINY = "tempering/tiny"
BUDGET = 48  # tokens per micro-batch in the split runs: the data below needs several


class SavedBytes:
    """Peak live bytes of the tensors autograd saves for the backward pass (parameters aside)."""

    def __init__(self, model: nn.Module) -> None:
        self._params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._live: dict[int, list[int]] = {}
        self.current = 0
        self.peak = 0

    def _pack(self, t: torch.Tensor) -> object:
        ptr = t.untyped_storage().data_ptr()
        if ptr in self._params:
            return t
        entry = self._live.get(ptr)
        if entry is None:
            entry = self._live[ptr] = [0, t.untyped_storage().nbytes()]
            self.current += entry[1]
            self.peak = max(self.peak, self.current)
        entry[0] += 1
        return _Held(self, ptr, t)

    def release(self, ptr: int) -> None:
        entry = self._live[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.current -= entry[1]
            del self._live[ptr]

    def hooks(self) -> Any:
        return torch.autograd.graph.saved_tensors_hooks(
            self._pack, lambda held: held.t if isinstance(held, _Held) else held
        )


class _Held:
    def __init__(self, owner: SavedBytes, ptr: int, t: torch.Tensor) -> None:
        self.owner, self.ptr, self.t = owner, ptr, t

    def __del__(self) -> None:
        self.owner.release(self.ptr)


class LargestWithLastDim(TorchDispatchMode):
    """The most elements of any tensor an operation returns whose last dimension is ``size``,
    other than one of shape ``skip`` (the unembedding's transposed weight)."""

    def __init__(self, size: int, skip: tuple[int, ...]) -> None:
        super().__init__()
        self.size = size
        self.skip = skip
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.shape[-1:] == (self.size,) and tuple(t.shape) != self.skip:
                self.largest = max(self.largest, t.numel())
        return out


@pytest.fixture(scope="module")
def loader(tmp_path_factory: pytest.TempPathFactory, local_root: Path) -> ModelLoader:
    del tmp_path_factory
    return ModelLoader(CheckpointStore(local_root), resolve_placement("cpu", "float32"))


def _client(
    loader: ModelLoader, memory: TrainingMemory, lora: LoraShape | None = None
) -> LocalTrainingClient:
    loader.memory = memory
    try:
        return loader.trainer(TINY, lora)
    finally:
        loader.memory = None


@pytest.fixture(scope="module")
def pair(loader: ModelLoader) -> Iterator[tuple[LocalTrainingClient, LocalTrainingClient]]:
    """Two full fine-tuning clients of the same weights: one splits every request into
    micro-batches of ``BUDGET`` tokens, the other runs it whole."""
    split = _client(loader, TrainingMemory(max_batch_tokens=BUDGET))
    whole = _client(loader, TrainingMemory(max_batch_tokens=1 << 30))
    yield split, whole
    split.close()
    whole.close()


def _rl_data(seed: int, loss: str) -> list[tinker.Datum]:
    """Groups of samples that share a prompt, of ragged lengths, in no length order."""
    rng = np.random.default_rng(seed)
    data: list[tinker.Datum] = []
    for g in range(3):
        prompt = random_tokens(rng, 6 + 3 * g)
        for _ in range(3):
            tokens = prompt + random_tokens(rng, int(rng.integers(2, 12)))
            n = len(tokens) - 1
            fields: dict[str, Any] = {
                "target_tokens": tokens[1:],
                "logprobs": rng.normal(-5.6, 0.3, size=n).astype(np.float32),
                "advantages": rng.normal(size=n).astype(np.float32),
            }
            if loss == "gspo":
                fields["sequence_ratio_mask"] = (rng.random(n) < 0.7).astype(np.float32)
                fields["sequence_ratio_mask"][0] = 1.0
            if loss == "cross_entropy":
                fields = {"target_tokens": tokens[1:], "weights": rng.random(n).astype(np.float32)}
            data.append(
                tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=fields)
            )
    return data


def _soft_data(seed: int) -> list[tinker.Datum]:
    rng = np.random.default_rng(seed)
    data = []
    for n in (7, 15, 4, 11, 9):
        targets = rng.integers(0, 256, size=(n, 3)).astype(np.int64)
        weights = rng.dirichlet(np.ones(3), size=n).astype(np.float32)
        data.append(
            tinker.Datum(
                model_input=tinker.ModelInput.from_ints(random_tokens(rng, n)),
                loss_fn_inputs={
                    "target_tokens": tinker.TensorData.from_numpy(targets),
                    "weights": tinker.TensorData.from_numpy(weights),
                },
            )
        )
    return data


Run = Callable[[LocalTrainingClient], tinker.ForwardBackwardOutput]


def _compare(pair: tuple[LocalTrainingClient, LocalTrainingClient], run: Run) -> None:
    """The split client's loss, logprobs and gradients equal the whole client's."""
    results = []
    for client in pair:
        for p in client._params.values():
            p.grad = None
        out = run(client)
        grads = {name: p.grad.clone() for name, p in client._params.items() if p.grad is not None}
        lps = [np.asarray(o["logprobs"].to_numpy()) for o in out.loss_fn_outputs]
        results.append((out.metrics["loss:sum"], lps, grads))
    (loss_a, lps_a, grads_a), (loss_b, lps_b, grads_b) = results
    # Absolute: the loss is a sum of terms of both signs (advantages), summed in another order.
    assert loss_a == pytest.approx(loss_b, rel=1e-5, abs=5e-5)
    assert len(lps_a) == len(lps_b)
    for a, b in zip(lps_a, lps_b, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert grads_a.keys() == grads_b.keys()
    assert grads_a
    for name, g in grads_a.items():
        assert float((g - grads_b[name]).norm()) <= 1e-4 * float(grads_b[name].norm()) + 1e-7, name


def test_the_data_needs_several_micro_batches() -> None:
    """The equality tests below are about splitting: their data does not fit one budget."""
    for loss in ("cross_entropy", "ppo"):
        tokens = [np.asarray(d.model_input.to_ints()) for d in _rl_data(0, loss)]
        assert len(plan_microbatches(tokens, TokenBudget(BUDGET, "test"))) >= 4


LOSSES = ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce"]


@pytest.mark.parametrize("loss", LOSSES)
def test_micro_batches_equal_the_whole_batch(
    pair: tuple[LocalTrainingClient, LocalTrainingClient], loss: str
) -> None:
    data = _rl_data(1, loss)
    _compare(pair, lambda c: c.forward_backward(data, loss).result())


def test_micro_batches_equal_the_whole_batch_with_soft_targets(
    pair: tuple[LocalTrainingClient, LocalTrainingClient],
) -> None:
    data = _soft_data(2)
    assert (
        len(plan_microbatches([np.asarray(d.model_input.to_ints()) for d in data], TokenBudget(BUDGET, "")))
        > 1
    )
    _compare(pair, lambda c: c.forward_backward(data, "cross_entropy").result())


def test_micro_batches_equal_the_whole_batch_for_a_custom_loss(
    pair: tuple[LocalTrainingClient, LocalTrainingClient],
) -> None:
    """A loss that couples datums (a DPO-like pairing across micro-batches) sees every logprob."""
    data = _rl_data(3, "cross_entropy")
    seen: list[int] = []

    def loss_fn(
        batch: Sequence[tinker.Datum], lps: list[torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        seen.append(len(lps))
        sums = torch.stack([lp.sum() for lp in lps])
        margin = sums[0::2][: len(sums) // 2] - sums[1::2][: len(sums) // 2]
        return -torch.nn.functional.logsigmoid(0.1 * margin).sum(), {"pairs": float(margin.numel())}

    _compare(pair, lambda c: c.forward_backward_custom(data, loss_fn).result())
    assert seen == [len(data), len(data)]


def test_forward_without_gradients_is_split_too(
    pair: tuple[LocalTrainingClient, LocalTrainingClient],
) -> None:
    data = _rl_data(4, "ppo")
    split, whole = pair
    for p in split._params.values():
        p.grad = None
    a = split.forward(data, "ppo").result()
    b = whole.forward(data, "ppo").result()
    assert a.metrics["loss:sum"] == pytest.approx(b.metrics["loss:sum"], rel=1e-5)
    for x, y in zip(a.loss_fn_outputs, b.loss_fn_outputs, strict=True):
        np.testing.assert_allclose(x["logprobs"].to_numpy(), y["logprobs"].to_numpy(), rtol=1e-5, atol=1e-5)
    assert all(p.grad is None for p in split._params.values())


def test_plan_keeps_budget_order_and_prefix_groups() -> None:
    rng = np.random.default_rng(5)
    tokens: list[np.ndarray] = []
    for g in range(4):
        prompt = random_tokens(rng, 10 + g)
        tokens += [np.asarray(prompt + random_tokens(rng, int(rng.integers(1, 9)))) for _ in range(4)]
    budget = TokenBudget(60, "test")
    parts = plan_microbatches(tokens, budget)
    assert sorted(i for part in parts for i in part) == list(range(len(tokens)))
    for part in parts:
        assert len(part) * max(len(tokens[i]) for i in part) <= budget.tokens
    # Each group's rows sit together: consecutive in the concatenated order.
    order = [i for part in parts for i in part]
    groups = [order.index(i) for i in range(len(tokens))]
    for g in range(4):
        positions = sorted(groups[4 * g : 4 * g + 4])
        assert positions == list(range(positions[0], positions[0] + 4)), g
    # A request that fits runs whole, in its own order.
    assert plan_microbatches(tokens, TokenBudget(10_000, "test")) == [list(range(len(tokens)))]


def test_a_row_longer_than_the_budget_is_refused_before_anything_runs(loader: ModelLoader) -> None:
    client = _client(loader, TrainingMemory(max_batch_tokens=20), LoraShape(rank=4))
    try:
        ok = _rl_data(6, "cross_entropy")[:2]
        client.forward_backward(ok, "cross_entropy").result()
        before = {name: p.grad.clone() for name, p in client._params.items() if p.grad is not None}
        rng = np.random.default_rng(0)
        long = [*ok, tinker.Datum(
            model_input=tinker.ModelInput.from_ints(random_tokens(rng, 30)),
            loss_fn_inputs={"target_tokens": random_tokens(rng, 30), "weights": [1.0] * 30},
        )]  # fmt: skip
        with pytest.raises(RequestTooLargeError) as info:
            client.forward_backward(long, "cross_entropy").result()
        assert (info.value.index, info.value.tokens, info.value.limit) == (2, 30, 20)
        message = str(info.value)
        for part in ("datum 2 has 30 tokens", "the 20 tokens", "max_batch_tokens=20", MAX_BATCH_TOKENS_ENV):
            assert part in message
        after = {name: p.grad for name, p in client._params.items() if p.grad is not None}
        assert after.keys() == before.keys()
        for name, g in before.items():
            assert torch.equal(after[name], g), name
        # The client keeps serving: the next request runs.
        out = client.forward(ok, "cross_entropy").result()
        assert np.isfinite(out.metrics["loss:sum"])
    finally:
        client.close()


def test_a_row_longer_than_the_context_is_refused(
    pair: tuple[LocalTrainingClient, LocalTrainingClient],
) -> None:
    split, _ = pair
    n = split._max_length + 1
    datum = tinker.Datum(
        model_input=tinker.ModelInput.from_ints([1] * n),
        loss_fn_inputs={"target_tokens": [1] * n, "weights": [1.0] * n},
    )
    with pytest.raises(DatumError, match=rf"has {n} tokens; the model's context .* is {n - 1}"):
        split.forward([datum], "cross_entropy").result()


def test_budget_settings(
    monkeypatch: pytest.MonkeyPatch, pair: tuple[LocalTrainingClient, LocalTrainingClient]
) -> None:
    split, _ = pair
    config = split._model.config
    cpu = resolve_placement("cpu", "float32")
    assert split.max_batch_tokens == BUDGET
    monkeypatch.setenv(MAX_BATCH_TOKENS_ENV, "4096")
    assert resolve_token_budget(None, config, cpu, checkpointing=False) == TokenBudget(
        4096, f"{MAX_BATCH_TOKENS_ENV}=4096"
    )
    assert resolve_token_budget(100, config, cpu, checkpointing=False).tokens == 100  # the argument wins
    monkeypatch.setenv(MAX_BATCH_TOKENS_ENV, "lots")
    with pytest.raises(ValueError, match=MAX_BATCH_TOKENS_ENV):
        resolve_token_budget(None, config, cpu, checkpointing=False)
    monkeypatch.delenv(MAX_BATCH_TOKENS_ENV)
    with pytest.raises(ValueError, match="max_batch_tokens must be"):
        resolve_token_budget(0, config, cpu, checkpointing=False)
    derived = resolve_token_budget(None, config, cpu, checkpointing=False)
    assert 256 <= derived.tokens <= 16384
    assert "derived" in derived.setting
    monkeypatch.setenv(CHECKPOINTING_ENV, "1")
    assert resolve_checkpointing(None)
    assert not resolve_checkpointing(False)  # the argument wins
    monkeypatch.setenv(CHECKPOINTING_ENV, "yes")
    with pytest.raises(ValueError, match=CHECKPOINTING_ENV):
        resolve_checkpointing(None)
    monkeypatch.delenv(CHECKPOINTING_ENV)
    assert not resolve_checkpointing(None)
    # Checkpointing keeps less per token, so the derived budget is no smaller.
    per_token = activation_bytes_per_token(config, torch.float32, checkpointing=False)
    assert activation_bytes_per_token(config, torch.float32, checkpointing=True) < per_token / 2


def test_chunked_logprobs_equal_the_full_softmax() -> None:
    gen = torch.Generator().manual_seed(0)
    unembed = nn.Linear(16, 50, bias=False)
    hidden = torch.randn(23, 16, generator=gen, requires_grad=True)
    targets = torch.randint(0, 50, (23, 3), generator=gen)
    chunked = chunked_target_logprobs(unembed, hidden, targets, chunk_tokens=4)
    (chunked * torch.arange(3.0)).sum().backward()
    grads = (hidden.grad.clone(), unembed.weight.grad.clone())
    hidden.grad, unembed.weight.grad = None, None
    full = torch.log_softmax(unembed(hidden), dim=-1).gather(-1, targets)
    (full * torch.arange(3.0)).sum().backward()
    torch.testing.assert_close(chunked, full)
    torch.testing.assert_close(grads[0], hidden.grad)
    torch.testing.assert_close(grads[1], unembed.weight.grad)


@pytest.mark.parametrize("lora", [False, True])
def test_no_batch_wide_logits_are_materialised(
    pair: tuple[LocalTrainingClient, LocalTrainingClient], loader: ModelLoader, lora: bool
) -> None:
    """Every tensor over the vocabulary holds at most one chunk of tokens, in the forward and
    the backward pass (LoRA: the adapter on the unembedding is applied chunk by chunk too)."""
    client = _client(loader, TrainingMemory(), LoraShape(rank=4)) if lora else pair[1]
    forward: TrainingForward = client._forward
    old = forward.chunk_tokens
    forward.chunk_tokens = 8
    data = _rl_data(7, "cross_entropy")
    try:
        assert forward.split_head
        # On this thread: dispatch modes and saved-tensor hooks are per thread.
        hidden = int(client._model.config.hidden_size)
        with LargestWithLastDim(client._vocab_size, (hidden, client._vocab_size)) as seen:
            client._builtin(data, "cross_entropy", None, backward=True)
        assert 0 < seen.largest <= 8 * client._vocab_size
    finally:
        forward.chunk_tokens = old
        if lora:
            client.close()


def test_activation_checkpointing_equals_the_plain_backward_and_saves_memory(
    loader: ModelLoader, pair: tuple[LocalTrainingClient, LocalTrainingClient]
) -> None:
    checkpointed = _client(loader, TrainingMemory(max_batch_tokens=1 << 30, activation_checkpointing=True))
    try:
        assert checkpointed.activation_checkpointing
        assert not checkpointed._forward.share_prefixes
        data = _rl_data(8, "importance_sampling")
        _compare((checkpointed, pair[1]), lambda c: c.forward_backward(data, "importance_sampling").result())
        peaks = []
        for client in (checkpointed, pair[1]):
            saved = SavedBytes(client._model)
            with saved.hooks():
                client._builtin(data, "importance_sampling", None, backward=True)
            peaks.append(saved.peak)
        assert peaks[0] < 0.5 * peaks[1], peaks
    finally:
        checkpointed.close()


def test_peak_activation_memory_is_flat_beyond_the_budget(loader: ModelLoader) -> None:
    """Saved-for-backward bytes grow with the request until it fills the budget, then stay."""
    budget = 4 * 16
    split = _client(loader, TrainingMemory(max_batch_tokens=budget))
    whole = _client(loader, TrainingMemory(max_batch_tokens=1 << 30))
    rng = np.random.default_rng(9)

    def peak(client: LocalTrainingClient, rows: int) -> int:
        data = [
            tinker.Datum(
                model_input=tinker.ModelInput.from_ints(random_tokens(rng, 16)),
                loss_fn_inputs={"target_tokens": random_tokens(rng, 16), "weights": [1.0] * 16},
            )
            for _ in range(rows)
        ]
        saved = SavedBytes(client._model)
        with saved.hooks():  # on this thread, as the hooks are per thread
            client._builtin(data, "cross_entropy", None, backward=True)
        return saved.peak

    try:
        split_peaks = [peak(split, rows) for rows in (4, 8, 16)]
        whole_peaks = [peak(whole, rows) for rows in (4, 16)]
    finally:
        split.close()
        whole.close()
    assert split_peaks[0] == split_peaks[1] == split_peaks[2]
    assert whole_peaks[1] > 3 * whole_peaks[0]
    # The estimate the derived budget uses is above the measurement, and not far above.
    per_token = activation_bytes_per_token(split._model.config, torch.float32, checkpointing=False)
    measured = split_peaks[0] / budget
    assert measured <= per_token <= 2 * measured


def _softcapped_model() -> nn.Module:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        vocab_size=264,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
        final_logit_softcapping=5.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Gemma2ForCausalLM(config).eval()


@pytest.mark.parametrize("kind", ["llama", "softcapped"])
def test_target_logprobs_equal_the_models_own_logits(tiny_dir: Path, kind: str) -> None:
    """A Llama-style model is unembedded chunk by chunk; one that soft-caps its logits (Gemma 2)
    is detected and uses its own logits. Both equal log_softmax of the model's logits."""
    model = reference_model(tiny_dir) if kind == "llama" else _softcapped_model()
    forward = TrainingForward(model, activation_checkpointing=False)
    assert forward.split_head == (kind == "llama")
    forward.chunk_tokens = 5
    data = _rl_data(10, "cross_entropy")[:4]
    batch = pad_batch(
        check_data(data, None, vocab_size=264, max_length=128), None, {}, device=torch.device("cpu")
    )
    with torch.no_grad():
        lp = forward.target_logprobs(batch)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        expected = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch.targets)
    real = batch.mask.bool()
    torch.testing.assert_close(lp[real], expected[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("loss_name", ["cross_entropy", "importance_sampling", "ppo"])
def test_tokens_without_gradient_skip_the_backward_pass(tiny_dir: Path, loss_name: str) -> None:
    """Where a loss's weights (or advantages) are zero, the token's logprob is computed without a
    graph: the logprobs and the gradients are those of the full backward pass, and the
    unembedding is run with gradients on fewer rows."""
    from tempering.local.losses import get_loss, resolve_config

    model = reference_model(tiny_dir)
    forward = TrainingForward(model, activation_checkpointing=False)
    forward.chunk_tokens = 5
    data = _rl_data(11, loss_name)
    key = "weights" if loss_name == "cross_entropy" else "advantages"
    for datum in data:  # the prompt-like first half of every datum carries no gradient
        values = np.asarray(datum.loss_fn_inputs[key].to_numpy()).copy()
        values[: len(values) // 2] = 0.0
        datum.loss_fn_inputs[key] = tinker.TensorData.from_numpy(values)
    loss = get_loss(loss_name)
    config = resolve_config(loss, None)
    batch = pad_batch(
        check_data(data, loss, vocab_size=264, max_length=128), loss, config, device=torch.device("cpu")
    )
    assert batch.gradient is not None
    assert 0 < int(batch.gradient.sum()) < int(batch.mask[..., 0].sum())
    rows_with_grad: list[int] = []
    unembed = forward._unembed
    hook = unembed.register_forward_hook(
        lambda _m, args, _out: rows_with_grad.append(args[0].shape[0]) if torch.is_grad_enabled() else None
    )
    results: list[tuple[torch.Tensor, list[torch.Tensor], int]] = []
    try:
        for positions in (None, batch.gradient):
            model.zero_grad()
            rows_with_grad.clear()
            lp = forward.target_logprobs(batch, positions)
            (loss.objective(lp, batch.inputs, config) * batch.mask).sum().backward()
            grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
            results.append((lp.detach(), grads, sum(rows_with_grad)))
    finally:
        hook.remove()
    (lp_full, grads_full, rows_full), (lp_split, grads_split, rows_split) = results
    real = batch.mask.bool()
    torch.testing.assert_close(lp_split[real], lp_full[real], rtol=0, atol=1e-6)
    assert len(grads_split) == len(grads_full) > 0
    for g_split, g_full in zip(grads_split, grads_full, strict=True):
        # The same sums in another order: float32 rounding (the largest seen, 4e-6, is on an
        # embedding row the prompt tokens and the answers both reach).
        torch.testing.assert_close(g_split, g_full, rtol=1e-4, atol=1e-5 * float(g_full.abs().max()) + 1e-6)
    # Each unembedded row with a graph is also rebuilt in the backward pass (checkpointed chunks):
    # the split path does that for the rows with a gradient only.
    needed, real_positions = int(batch.gradient.sum()), int(batch.mask[..., 0].sum())
    assert rows_split * real_positions == rows_full * needed
    assert rows_split < rows_full
