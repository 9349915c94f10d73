"""The compiled decode step (:mod:`tempering.local.compiled_decode`) against the static
decoder's module path: the same logits, step by step, for a LoRA model with its adapter
unmerged and for a Qwen3-shaped model (q/k norms, grouped-query attention), through finished
rows (the gathered, non-prefix slots), rows joining and cache growth; when it is chosen; and the
module path when compilation fails."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tinker
import torch
from local_helpers import qwen3_test_model, sft_datum
from torch import nn
from torch._inductor.exc import InductorError

import tempering.local.compiled_decode as cd
from tempering.local import LocalTrainingClient, ServiceClient
from tempering.local.fastdecode import StaticKV, prefill_batch
from tempering.local.tiny import TINY_MODEL


@pytest.fixture(scope="module")
def lora_model(service: ServiceClient) -> Iterator[nn.Module]:
    """A snapshot of a LoRA client after a few steps (a non-zero adapter, left unmerged)."""
    client: LocalTrainingClient = service.create_lora_training_client(TINY_MODEL, rank=4).result()
    rng = np.random.default_rng(3)
    for _ in range(3):
        client.forward_backward([sft_datum(list(rng.integers(32, 127, size=20)))], "cross_entropy")
        client.optim_step(tinker.AdamParams(learning_rate=2e-2))
    yield client.snapshot().model
    client.close()


def _decode(
    model: nn.Module, compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[torch.Tensor], bool]:
    """Logits of a scripted decode: 3 prompts × 2 rows, rows dropped in the middle (a gap, so
    the slots are gathered), a request joining, and the cache growing past its first capacity."""
    monkeypatch.setenv(cd.COMPILE_ENV, "1" if compiled else "0")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (5, 12, 8)]
    with torch.no_grad():
        rows = torch.tensor([0, 0, 1, 1, 2, 2])
        kv = StaticKV(model, prefill_batch(model, prompts, set()), rows, reserve=4)
        used = kv.compiled is not None
        logits: list[torch.Tensor] = []
        tokens = torch.randint(3, 250, (6,), generator=gen)
        for step in range(14):
            if step == 3:  # rows 1 and 3 finish: the active rows are no longer a prefix of the slots
                kv.keep(torch.tensor([0, 2, 4, 5]))
                tokens = tokens[[0, 2, 4, 5]]
            if step == 6:  # a request joins the running batch
                joining = [torch.randint(3, 250, (9,), generator=gen).tolist()]
                kv.add(prefill_batch(model, joining, set()), torch.tensor([0, 0]), reserve=4)
                tokens = torch.cat([tokens, torch.randint(3, 250, (2,), generator=gen)])
            out = kv.step(tokens)
            logits.append(out)
            tokens = out.argmax(dim=-1)
        return logits, used and kv.compiled is not None


@pytest.mark.parametrize("kind", ["lora", "qwen3"])
def test_the_compiled_step_computes_what_the_module_path_does(
    kind: str, lora_model: nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = lora_model if kind == "lora" else qwen3_test_model(300)
    if kind == "lora":
        assert any("lora_" in name for name, _ in model.named_parameters())
    compiled, used = _decode(model, True, monkeypatch)
    assert used, "the compiled path was not taken"
    plain, _ = _decode(model, False, monkeypatch)
    for step, (a, b) in enumerate(zip(compiled, plain, strict=True)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2e-5, rtol=0, err_msg=f"step {step}")


def test_compiling_is_chosen_for_real_sized_half_precision_models_on_the_cpu(
    lora_model: nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = torch.device("cpu")
    monkeypatch.delenv(cd.COMPILE_ENV, raising=False)
    assert not cd.compile_wanted(lora_model, cpu)  # the tiny model: below the size where it pays
    monkeypatch.setattr(cd, "AUTO_MIN_PARAMETERS", 1000)
    bf16 = nn.Linear(64, 64).to(torch.bfloat16)
    assert cd.compile_wanted(bf16, cpu)
    assert not cd.compile_wanted(nn.Linear(64, 64), cpu)  # float32: not worth compiling
    assert not cd.compile_wanted(bf16, torch.device("meta"))  # auto: the CPU only
    monkeypatch.setenv(cd.COMPILE_ENV, "1")
    assert cd.compile_wanted(lora_model, cpu)
    monkeypatch.setenv(cd.COMPILE_ENV, "0")
    assert not cd.compile_wanted(bf16, cpu)
    monkeypatch.setenv(cd.COMPILE_ENV, "yes")
    with pytest.raises(ValueError, match="TEMPERING_COMPILE_DECODE='yes': expected 1, 0 or auto"):
        cd.compile_wanted(lora_model, cpu)


def test_layers_of_an_unknown_kind_keep_the_module_path(monkeypatch: pytest.MonkeyPatch) -> None:
    model = qwen3_test_model(300)
    setattr(model.config, "hidden_act", "gelu")  # noqa: B010  # another activation than the one the compiled layer computes
    monkeypatch.setenv(cd.COMPILE_ENV, "1")
    prompts = [[5, 6, 7]]
    kv = StaticKV(model, prefill_batch(model, prompts, set()), torch.tensor([0]), reserve=2)
    assert kv.compiled is None


def test_a_failed_compilation_warns_once_and_decodes_with_the_modules(
    lora_model: nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain, _ = _decode(lora_model, False, monkeypatch)

    def broken(fn: object, **kwargs: object) -> object:
        def run(*args: object) -> object:
            raise InductorError(RuntimeError("no C++ compiler"), None)

        return run

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(cd, "_failed", [])
    cd._compiled.cache_clear()  # pyright: ignore[reportPrivateUsage]
    try:
        with pytest.warns(RuntimeWarning, match="compiling the decode step failed .*no C\\+\\+ compiler"):
            fallback, used = _decode(lora_model, True, monkeypatch)
        assert not used
        assert cd._failed  # pyright: ignore[reportPrivateUsage]
        # Later decoders do not try again in this process.
        assert not cd.compile_wanted(lora_model, torch.device("cpu"))
    finally:
        cd._compiled.cache_clear()  # pyright: ignore[reportPrivateUsage]
    for a, b in zip(fallback, plain, strict=True):
        assert torch.equal(a, b)
