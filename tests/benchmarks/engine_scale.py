"""Measurements of the local engine at real model sizes, shared by the GPU check
(``tests/benchmarks/gpu_check.py``, ``make gpu-check``) and the CPU decoding benchmark
(``tests/benchmarks/test_bench_decode.py``, ``make bench``).

What is measured, and how:

- **Matmul peak** (:func:`matmul_peak`): the best FLOP rate of a plain ``n × n`` matrix product
  in one dtype, timed over several rounds. Every fraction of peak below is against this measured
  figure, not a vendor's datasheet.
- **Decoding** (:func:`sample_engine`, :func:`sample_generate`): ``batch`` random prompts of
  ``prompt_tokens`` tokens, ``new_tokens`` new tokens each at temperature 1 from the full
  distribution, no stop. The engine gets one ``sample(prompt, 1, params)`` request per prompt,
  all submitted at once (as an RL step submits its groups); transformers gets one
  ``model.generate(do_sample=True, top_k=0)`` call on the whole batch (same length prompts, so
  no padding). Tokens/s counts new tokens only.
- **Training** (:func:`train_engine`): ``forward_backward`` (cross-entropy) plus ``optim_step``
  on ``batch`` random sequences of ``seq_len`` tokens, one step at a time.
- **Model FLOPs** (:class:`ModelShape`): a forward pass costs, per token, 2 × the non-embedding
  parameters (every matrix product) + 2 × hidden × vocabulary (the unembedding's product, tied
  or not) + 4 × layers × heads × head_dim × context (attention's two products). Decoding counts
  the decoded tokens only, at their mean context (prompt + new / 2); the prompts' prefill is
  not counted, so its fraction of peak is a lower bound. LoRA training counts the forward, the
  backward to the inputs (as much again; the frozen base needs no weight gradients, so this is
  2 × forward, not the 3 × of full training) and 6 × the adapter's parameters; attention at the
  mean causal context (seq_len + 1) / 2, its backward twice its forward.
- **Sampler/trainer logprob gap** (:func:`logprob_gap`): a LoRA training client takes one
  optimizer step (so its adapter is no longer zero), its sampler samples at temperature 1, and
  ``forward`` recomputes the logprobs of the same tokens; the gap is ``|sampled - forward|``
  over all sampled tokens (max and mean). It is what RL's ``kl/sample_train`` sees.

Peak GPU memory is ``torch.cuda.max_memory_allocated`` over a phase, reset before it; each phase
loads its own model, and the previous one's is freed first. On the CPU the process's peak
resident set (``ru_maxrss``, never reset) is reported instead.

Imports of tempering are lazy (inside the functions), so this module can be imported, and its
FLOP arithmetic used, without the engine's dependencies.
"""

from __future__ import annotations

import gc
import math
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from tempering.local import LocalSamplingClient, LocalTrainingClient, ServiceClient

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}

QWEN3_0_6B = {
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "vocab_size": 151_936,
}
"""Qwen3-0.6B's shape (its config on the hub); the weights here are random."""

QWEN3_MINI = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 512,
}
"""A Qwen3 of the same architecture small enough for a test."""


# ---- machine ----------------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int, rounds: int = 5) -> float:
    """The best FLOP rate (FLOP/s) of ``a @ b`` for ``n × n`` matrices of ``dtype`` on ``device``.

    Each round runs enough products to take about 0.2 s (at least one); the best round counts."""
    if n < 1 or rounds < 1:
        raise ValueError(f"matmul_peak: n and rounds must be >= 1, got n={n}, rounds={rounds}")
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    flops = 2.0 * n**3
    with torch.inference_mode():
        a @ b  # warm up (CUDA context, BLAS threads)
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        once = max(time.perf_counter() - start, 1e-9)
        reps = max(1, min(1000, int(0.2 / once)))
        best = math.inf
        for _ in range(rounds):
            synchronize(device)
            start = time.perf_counter()
            for _ in range(reps):
                a @ b
            synchronize(device)
            best = min(best, (time.perf_counter() - start) / reps)
    return flops / best


def machine_info(device: torch.device) -> dict[str, Any]:
    import platform

    import transformers

    info: dict[str, Any] = {
        "device": str(device),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cpu_count": _cpu_count(),
        "cpu": platform.processor() or platform.machine(),
    }
    try:
        import peft

        info["peft"] = peft.__version__
    except ImportError:
        info["peft"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = props.name
        info["gpu_memory_bytes"] = int(props.total_memory)
        info["cuda"] = torch.version.cuda
    return info


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def reset_peak(device: torch.device) -> None:
    """Free what earlier phases left and start counting this phase's peak (CUDA only: on the
    CPU the peak RSS cannot be reset, and a full garbage collection costs about half a second
    with transformers and torch loaded)."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, int | None]:
    """``peak_gpu_bytes`` since :func:`reset_peak` (None off CUDA) and the process's peak RSS."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_bytes = rss if sys.platform == "darwin" else rss * 1024
    gpu = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    return {"peak_gpu_bytes": gpu, "process_max_rss_bytes": int(rss_bytes)}


# ---- model shape and FLOPs ------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP counts need to know about a causal LM (see the module docstring)."""

    layers: int
    hidden: int
    heads: int
    head_dim: int
    vocab: int
    params: int
    non_embedding_params: int
    lora_params_per_rank: int
    """Adapter parameters per unit of rank when every linear layer (and the unembedding) has one."""

    @staticmethod
    def of_dir(model_dir: Path) -> ModelShape:
        """The shape of the model in ``model_dir``, built on the meta device (no weights read)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(model_dir)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return ModelShape.of_model(model)

    @staticmethod
    def of_model(model: torch.nn.Module) -> ModelShape:
        config: Any = getattr(model, "config", None)
        if config is None:
            raise TypeError(f"ModelShape: {type(model).__name__} has no config")
        embed = model.get_input_embeddings()  # type: ignore[operator]
        unembed = model.get_output_embeddings()  # type: ignore[operator]
        seen: set[int] = set()
        total = 0
        for p in model.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
        embedding = {id(p): p.numel() for m in (embed, unembed) if m is not None for p in m.parameters()}
        lora = 0
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                lora += module.in_features + module.out_features
        heads = int(config.num_attention_heads)
        hidden = int(config.hidden_size)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
        return ModelShape(
            layers=int(config.num_hidden_layers),
            hidden=hidden,
            heads=heads,
            head_dim=head_dim,
            vocab=int(config.vocab_size),
            params=total,
            non_embedding_params=total - sum(embedding.values()),
            lora_params_per_rank=lora,
        )

    def forward_flops(self, context: float) -> float:
        """FLOPs of one token's forward pass at ``context`` positions attended to."""
        dense = 2.0 * (self.non_embedding_params + self.hidden * self.vocab)
        return dense + 4.0 * self.layers * self.heads * self.head_dim * context

    def decode_flops(self, prompt_tokens: int, new_tokens: int) -> float:
        """FLOPs per decoded token, at the mean context of the decoded tokens."""
        return self.forward_flops(prompt_tokens + new_tokens / 2)

    def lora_train_flops(self, seq_len: int, rank: int) -> float:
        """FLOPs per trained token of a LoRA step (forward + backward to the inputs + adapter)."""
        context = (seq_len + 1) / 2
        dense = 4.0 * (self.non_embedding_params + self.hidden * self.vocab)
        attention = 3 * 4.0 * self.layers * self.heads * self.head_dim * context
        return dense + attention + 6.0 * rank * self.lora_params_per_rank


# ---- models -----------------------------------------------------------------------------------------


def build_qwen3(directory: Path, shape: dict[str, int], seed: int = 0) -> Path:
    """A Qwen3 causal LM of ``shape`` with random weights (seeded, bfloat16, tied embeddings),
    saved to ``directory`` with the built-in tiny model's byte-level tokenizer (prompts here are
    token ids; the tokenizer only has to load)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tempering.local.tiny import build_tiny_tokenizer

    config = Qwen3Config(
        **shape,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.to(torch.bfloat16)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    build_tiny_tokenizer().save_pretrained(directory)
    del model
    gc.collect()
    return directory


def random_prompts(count: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of ``length`` token ids drawn uniformly from ``[0, vocab)``."""
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab, size=length)] for _ in range(count)]


def load_hf(model_dir: Path, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The model in ``model_dir`` as transformers loads it, in ``dtype`` on ``device``, eval mode."""
    from transformers import AutoModelForCausalLM

    from tempering.local._hf import quiet_progress

    with quiet_progress():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    torch.nn.Module.to(model, device)
    model.eval()
    return model


# ---- timing -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Rounds of one measured call: tokens per round and each round's seconds."""

    tokens: int
    seconds: tuple[float, ...]

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def tokens_per_s(self) -> float:
        """From the median round."""
        return self.tokens / self.median

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "seconds": list(self.seconds),
            "best_s": self.best,
            "median_s": self.median,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_best": self.tokens / self.best,
        }


def time_rounds(run: Callable[[], int], rounds: int, warmup: int = 1) -> Timing:
    """Run ``run`` (which returns the tokens it produced) ``warmup`` times untimed, then
    ``rounds`` times timed. Every timed round must produce the same number of tokens."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    for _ in range(warmup):
        run()
    seconds: list[float] = []
    tokens: int | None = None
    for _ in range(rounds):
        start = time.perf_counter()
        n = run()
        seconds.append(time.perf_counter() - start)
        if tokens is not None and n != tokens:
            raise RuntimeError(f"a round produced {n} tokens, the previous one {tokens}")
        tokens = n
    assert tokens is not None
    return Timing(tokens, tuple(seconds))


# ---- decoding ---------------------------------------------------------------------------------------


def engine_sampler(service: ServiceClient, model: str) -> LocalSamplingClient:
    return service.create_sampling_client(base_model=model).result()


def sample_engine(sampler: LocalSamplingClient, prompts: Sequence[list[int]], new_tokens: int) -> int:
    """One round: one request per prompt, all submitted at once; returns the new tokens."""
    import tinker

    futures = [
        sampler.sample(
            tinker.ModelInput.from_ints(p),
            1,
            tinker.SamplingParams(max_tokens=new_tokens, temperature=1.0, stop=[], seed=i),
        )
        for i, p in enumerate(prompts)
    ]
    tokens = sum(len(s.tokens) for f in futures for s in f.result().sequences)
    if tokens != len(prompts) * new_tokens:
        raise RuntimeError(f"the engine returned {tokens} tokens, expected {len(prompts) * new_tokens}")
    return tokens


def sample_generate(model: torch.nn.Module, prompts: Sequence[list[int]], new_tokens: int) -> int:
    """One round of transformers' ``generate`` on the whole batch (same settings as the engine's
    round); returns the new tokens."""
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    ids = torch.tensor(list(prompts), dtype=torch.long, device=device)
    config = GenerationConfig(
        do_sample=True,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        eos_token_id=None,
        pad_token_id=0,
    )
    with torch.inference_mode():
        out = model.generate(  # type: ignore[operator]
            ids, attention_mask=torch.ones_like(ids), generation_config=config
        )
    tokens = int((out.shape[1] - ids.shape[1]) * out.shape[0])
    out.cpu()
    if tokens != len(prompts) * new_tokens:
        raise RuntimeError(f"generate returned {tokens} tokens, expected {len(prompts) * new_tokens}")
    return tokens


# ---- training ---------------------------------------------------------------------------------------


def training_data(batch: int, seq_len: int, vocab: int, seed: int = 0) -> list[Any]:
    """``batch`` cross-entropy datums of ``seq_len`` random tokens (every target weighted 1)."""
    import tinker

    data: list[tinker.Datum] = []
    for tokens in random_prompts(batch, seq_len + 1, vocab, seed):
        data.append(
            tinker.Datum(
                model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * seq_len},
            )
        )
    return data


def train_step(client: LocalTrainingClient, data: list[Any], learning_rate: float = 1e-4) -> int:
    """One ``forward_backward`` + ``optim_step``; returns the tokens trained on."""
    import tinker

    fwd = client.forward_backward(data, "cross_entropy")
    opt = client.optim_step(tinker.AdamParams(learning_rate=learning_rate))
    loss = fwd.result().metrics["loss:sum"]
    opt.result()
    if not math.isfinite(loss):
        raise RuntimeError(f"training loss is {loss}")
    return sum(len(d.model_input.to_ints()) for d in data)


# ---- sampler / trainer parity -------------------------------------------------------------------


def logprob_gap(
    service: ServiceClient,
    model: str,
    *,
    prompts: Sequence[list[int]],
    new_tokens: int,
    vocab: int,
    rank: int = 32,
) -> dict[str, float | int]:
    """Sampled logprobs against ``forward``'s for the same tokens (see the module docstring)."""
    import tinker

    trainer = service.create_lora_training_client(model, rank=rank).result()
    try:
        train_step(trainer, training_data(len(prompts), len(prompts[0]) + new_tokens, vocab, seed=1), 1e-3)
        sampler = trainer.save_weights_and_get_sampling_client()
        futures = [
            sampler.sample(
                tinker.ModelInput.from_ints(p),
                1,
                tinker.SamplingParams(max_tokens=new_tokens, temperature=1.0, stop=[], seed=100 + i),
            )
            for i, p in enumerate(prompts)
        ]
        sampled = [f.result().sequences[0] for f in futures]
        sampler.close()
        data: list[tinker.Datum] = []
        for p, seq in zip(prompts, sampled, strict=True):
            full = [*p, *seq.tokens]
            weights = [0.0] * (len(p) - 1) + [1.0] * len(seq.tokens)
            data.append(
                tinker.Datum(
                    model_input=tinker.ModelInput.from_ints(full[:-1]),
                    loss_fn_inputs={"target_tokens": full[1:], "weights": weights},
                )
            )
        out = trainer.forward(data, "cross_entropy").result()
    finally:
        trainer.close()
    gaps: list[np.ndarray] = []
    for p, seq, lo in zip(prompts, sampled, out.loss_fn_outputs, strict=True):
        forward_lp = lo["logprobs"].to_numpy()[len(p) - 1 :]
        sampled_lp = np.asarray(seq.logprobs, dtype=np.float64)
        gaps.append(np.abs(sampled_lp - forward_lp.astype(np.float64)))
    gap = np.concatenate(gaps)
    return {"max_abs": float(gap.max()), "mean_abs": float(gap.mean()), "tokens": int(gap.size)}
