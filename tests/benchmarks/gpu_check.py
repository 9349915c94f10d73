"""The GPU check: the local engine's sampling and training throughput, peak memory and
sampler/trainer logprob gap at real model sizes, beside transformers' ``generate``.

Run (``make gpu-check`` runs the first)::

    PYTHONPATH=python:protocols python tests/benchmarks/gpu_check.py --out gpu-check.json
    PYTHONPATH=python:protocols python tests/benchmarks/gpu_check.py --out gpu-check.json \\
        --smollm2 /path/to/SmolLM2-135M-Instruct
    # on a CPU, small sizes (what the test runs):
    PYTHONPATH=python:protocols python tests/benchmarks/gpu_check.py --device cpu --quick \\
        --model tempering/tiny --out /tmp/check.json

Models: ``qwen3-0.6b-random`` (default: Qwen3-0.6B's shape, hidden 1024, 28 layers, 16 heads,
8 KV heads, head_dim 128, intermediate 3072, vocabulary 151,936, tied embeddings; random
weights, built and saved to a temporary directory), ``qwen3-mini-random`` (the same architecture,
tiny), ``tempering/tiny`` or any Hugging Face model directory (``--model``, repeatable), and the
135M SmolLM2 with ``--smollm2 DIR``.

For each model: sampling tokens/s through ``LocalSamplingClient`` and through transformers'
``generate`` side by side (``--batches``, default 64 and 256 prompts; 64 new tokens at T=1),
training tokens/s of LoRA rank 32 ``forward_backward`` + ``optim_step`` (64 × 256 tokens) with
its model-FLOPs utilisation against the measured matmul peak, peak GPU memory of each phase,
and the sampler/trainer logprob gap in float32 and bfloat16. What each figure means:
``tests/benchmarks/engine_scale.py``. It prints a table and writes everything to ``--out``
(rewritten after every phase, so a run cut short keeps what it measured); a phase that fails is
recorded with its error and the rest still run.

Needs (nothing is downloaded): Python >= 3.11; torch, transformers (>= 5), peft, safetensors,
tokenizers, numpy (the local engine); tinker and its dependencies (anyio, click, distro, httpx,
orjson, protobuf, pydantic, pyqwest, rich, sniffio, typing-extensions, zstandard) and attrs
(imported by ``tempering``'s package); tempering's compiled extension
``python/tempering/_core.abi3.so`` in place (an abi3 build from any machine of the same platform);
``PYTHONPATH=python:protocols`` from the repository root (or tempering installed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_scale as es

from tempering.local.engine_thread import run_on_engine_thread

QWEN3_MODELS = {"qwen3-0.6b-random": es.QWEN3_0_6B, "qwen3-mini-random": es.QWEN3_MINI}


@dataclass(frozen=True)
class Sizes:
    batches: tuple[int, ...]
    prompt_tokens: int
    new_tokens: int
    train_batch: int
    train_seq_len: int
    gap_prompts: int
    gap_new_tokens: int
    rounds: int
    matmul_n: int


FULL = Sizes((64, 256), 32, 64, 64, 256, 16, 64, 3, 8192)
QUICK = Sizes((4, 8), 8, 8, 4, 16, 2, 8, 1, 128)
CPU_MATMUL_N = 2048


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON results")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument(
        "--dtype",
        choices=sorted(es.DTYPES),
        default=None,
        help="dtype of the throughput phases (default bfloat16 on CUDA, float32 on the CPU)",
    )
    parser.add_argument(
        "--model",
        action="append",
        default=None,
        help="a model to measure (repeatable): qwen3-0.6b-random, qwen3-mini-random, tempering/tiny "
        "or a Hugging Face model directory (default: qwen3-0.6b-random)",
    )
    parser.add_argument("--smollm2", type=Path, default=None, help="a directory of SmolLM2-135M(-Instruct)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a test on the CPU")
    parser.add_argument("--batches", type=int, nargs="+", default=None, help="sampling batch sizes")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per measurement")
    parser.add_argument("--train-batch", type=int, default=None, help="training sequences per step")
    parser.add_argument("--train-seq-len", type=int, default=None, help="tokens per training sequence")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["generate", "training", "gap"], help="phases to leave out"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: --device cuda, but torch sees no CUDA device")
    dtype_name: str = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    sizes = QUICK if args.quick else FULL
    if args.batches:
        sizes = dataclasses.replace(sizes, batches=tuple(args.batches))
    if args.rounds:
        sizes = dataclasses.replace(sizes, rounds=args.rounds)
    if args.train_batch:
        sizes = dataclasses.replace(sizes, train_batch=args.train_batch)
    if args.train_seq_len:
        sizes = dataclasses.replace(sizes, train_seq_len=args.train_seq_len)
    if args.threads:
        torch.set_num_threads(args.threads)
    models: list[tuple[str, str]] = [(m, m) for m in (args.model or ["qwen3-0.6b-random"])]
    if args.smollm2 is not None:
        if not (args.smollm2 / "config.json").is_file():
            raise SystemExit(f"gpu_check: --smollm2 {args.smollm2}: no config.json there")
        models.append(("smollm2-135m", str(args.smollm2)))
    for _, spec in models:
        if (
            spec not in QWEN3_MODELS
            and spec != "tempering/tiny"
            and not (Path(spec) / "config.json").is_file()
        ):
            raise SystemExit(
                f"gpu_check: --model {spec!r} is none of {[*QWEN3_MODELS, 'tempering/tiny']} "
                "and not a directory with a config.json"
            )

    from transformers.utils import logging as hf_logging

    from tempering.local import ServiceClient
    from tempering.local.model import resolve_model_dir

    hf_logging.disable_progress_bar()

    out_path: Path = args.out
    matmul_n = sizes.matmul_n if device.type == "cuda" or args.quick else CPU_MATMUL_N
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv) if argv is None else "gpu_check.py " + " ".join(argv),
        "machine": es.machine_info(device),
        "dtype": dtype_name,
        "sizes": sizes.__dict__ | {"batches": list(sizes.batches)},
        # On the engine's thread, as everything here that runs torch: one OpenMP pool on a CPU
        # (tempering/local/engine_thread.py).
        "matmul_peak_flops": {
            name: run_on_engine_thread(lambda dt=dt: es.matmul_peak(device, dt, matmul_n)).result()
            for name, dt in es.DTYPES.items()
        },
        "matmul_n": matmul_n,
        "models": [],
    }
    peak = results["matmul_peak_flops"][dtype_name]
    write(out_path, results)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch_dir:
        scratch = Path(scratch_dir)
        service = ServiceClient(root=scratch / "home", device=device, dtype=dtype_name)
        for label, spec in models:
            entry: dict[str, Any] = {"name": label}
            results["models"].append(entry)
            try:
                model = resolve_model(spec, scratch)
                entry["model"] = model
                model_dir = resolve_model_dir(model, service.root)
                shape = es.ModelShape.of_dir(model_dir)
            except Exception as exc:  # a model that cannot be built or read: the next one still runs
                traceback.print_exc()
                entry["error"] = f"{type(exc).__name__}: {exc}"
                write(out_path, results)
                continue
            entry["shape"] = shape.__dict__
            write(out_path, results)
            run_model(
                entry,
                model,
                model_dir,
                shape,
                service,
                sizes,
                device,
                dtype_name,
                peak,
                args.skip,
                scratch,
                save=lambda: write(out_path, results),
            )
            write(out_path, results)
        service.close()
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write(out_path, results)
    print_table(results)
    return results


def resolve_model(spec: str, scratch: Path) -> str:
    """The ``base_model`` string for ``spec``: a built random Qwen3's directory, or as given."""
    if spec in QWEN3_MODELS:
        return str(es.build_qwen3(scratch / spec, QWEN3_MODELS[spec]))
    return spec


def run_model(
    entry: dict[str, Any],
    model: str,
    model_dir: Path,
    shape: es.ModelShape,
    service: Any,
    sizes: Sizes,
    device: torch.device,
    dtype_name: str,
    peak: float,
    skip: list[str],
    scratch: Path,
    *,
    save: Callable[[], None],
) -> None:
    """Measure ``model`` into ``entry``, calling ``save`` after every phase."""
    from tempering.local import ServiceClient

    dtype = es.DTYPES[dtype_name]
    entry["sampling"] = []
    for batch in sizes.batches:
        prompts = es.random_prompts(batch, sizes.prompt_tokens, shape.vocab, seed=batch)
        flops = shape.decode_flops(sizes.prompt_tokens, sizes.new_tokens)
        row: dict[str, Any] = {
            "batch": batch,
            "prompt_tokens": sizes.prompt_tokens,
            "new_tokens": sizes.new_tokens,
            "decode_flops_per_token": flops,
        }
        entry["sampling"].append(row)

        def engine(prompts: list[list[int]] = prompts) -> dict[str, Any]:
            sampler = es.engine_sampler(service, model)
            try:
                return es.time_rounds(
                    lambda: es.sample_engine(sampler, prompts, sizes.new_tokens), sizes.rounds
                ).as_dict()
            finally:
                sampler.close()

        row["engine"] = phase(f"{model_dir.name}: engine sampling {batch}", engine, device)
        save()
        if "generate" not in skip:

            def generate(prompts: list[list[int]] = prompts) -> dict[str, Any]:
                hf = es.load_hf(model_dir, device, dtype)
                try:
                    return es.time_rounds(
                        lambda: es.sample_generate(hf, prompts, sizes.new_tokens), sizes.rounds
                    ).as_dict()
                finally:
                    del hf

            row["generate"] = phase(
                f"{model_dir.name}: generate {batch}",
                lambda g=generate: run_on_engine_thread(g).result(),
                device,
            )
            save()
        for side in ("engine", "generate"):
            tps = row.get(side, {}).get("tokens_per_s")
            if tps is not None:
                row[side]["fraction_of_peak"] = tps * flops / peak
        e, g = row["engine"].get("tokens_per_s"), row.get("generate", {}).get("tokens_per_s")
        row["engine_over_generate"] = e / g if e is not None and g is not None else None

    if "training" not in skip:
        rank = 32
        flops = shape.lora_train_flops(sizes.train_seq_len, rank)

        def training() -> dict[str, Any]:
            client = service.create_lora_training_client(model, rank=rank).result()
            try:
                data = es.training_data(sizes.train_batch, sizes.train_seq_len, shape.vocab)
                return es.time_rounds(lambda: es.train_step(client, data), sizes.rounds).as_dict()
            finally:
                client.close()

        result = phase(f"{model_dir.name}: training", training, device)
        result.update(
            batch=sizes.train_batch, seq_len=sizes.train_seq_len, lora_rank=rank, flops_per_token=flops
        )
        if "tokens_per_s" in result:
            result["mfu"] = result["tokens_per_s"] * flops / peak
        entry["training"] = result
        save()

    if "gap" not in skip:
        entry["logprob_gap"] = {}
        prompts = es.random_prompts(sizes.gap_prompts, sizes.prompt_tokens, shape.vocab, seed=7)
        for gap_dtype in es.DTYPES:

            def gap(gap_dtype: str = gap_dtype) -> dict[str, Any]:
                gap_service = ServiceClient(root=scratch / "home", device=device, dtype=gap_dtype)
                try:
                    return dict(
                        es.logprob_gap(
                            gap_service,
                            model,
                            prompts=prompts,
                            new_tokens=sizes.gap_new_tokens,
                            vocab=shape.vocab,
                        )
                    )
                finally:
                    gap_service.close()

            entry["logprob_gap"][gap_dtype] = phase(f"{model_dir.name}: gap {gap_dtype}", gap, device)
            save()


def phase(name: str, run: Callable[[], dict[str, Any]], device: torch.device) -> dict[str, Any]:
    """Run one measurement with its own peak-memory count; a failure is recorded, not raised.
    Says on stderr when it starts and ends (a long run shows its progress)."""
    es.reset_peak(device)
    start = time.perf_counter()
    print(f"[gpu-check] {name} ...", file=sys.stderr, flush=True)
    try:
        result = run()
    except Exception as exc:
        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {exc}"}
    result.update(es.peak_memory(device))
    es.reset_peak(device)
    outcome = "failed" if "error" in result else "done"
    print(
        f"[gpu-check] {name}: {outcome} in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True
    )
    return result


def write(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str) + "\n")
    tmp.replace(path)


def _fmt(value: float | None, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{unit}"


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f} GiB"


def print_table(results: dict[str, Any]) -> None:
    machine = results["machine"]
    print(
        f"\n{machine.get('gpu') or machine['cpu']} ({machine['device']}), torch {machine['torch']}, "
        f"transformers {machine['transformers']}, dtype {results['dtype']}"
    )
    for name, flops in results["matmul_peak_flops"].items():
        print(f"matmul peak {name}: {flops / 1e12:.2f} TFLOP/s (n={results['matmul_n']})")
    for entry in results["models"]:
        if "error" in entry:
            print(f"\n== {entry['name']}: error: {entry['error']}")
            continue
        shape = entry.get("shape", {})
        print(f"\n== {entry['name']} ({shape.get('params', 0) / 1e6:.2f}M parameters)")
        print(
            f"{'sampling':<28}{'engine tok/s':>14}{'generate tok/s':>16}{'ratio':>8}{'eng % peak':>12}"
            f"{'eng peak mem':>14}{'gen peak mem':>14}"
        )
        for row in entry.get("sampling", []):
            e, g = row.get("engine", {}), row.get("generate", {})
            frac = e.get("fraction_of_peak")
            print(
                f"{row['batch']} x {row['new_tokens']} (prompt {row['prompt_tokens']})".ljust(28)
                + f"{_fmt(e.get('tokens_per_s')):>14}{_fmt(g.get('tokens_per_s')):>16}"
                + f"{_fmt(row.get('engine_over_generate'), 'x', 2):>8}"
                + f"{_fmt(None if frac is None else 100 * frac, '%', 1):>12}"
                + f"{_gib(e.get('peak_gpu_bytes')):>14}{_gib(g.get('peak_gpu_bytes')):>14}"
            )
            for side in (e, g):
                if "error" in side:
                    print(f"  error: {side['error']}")
        t = entry.get("training")
        if t is not None:
            mfu = t.get("mfu")
            print(
                f"training LoRA r{t['lora_rank']} {t['batch']} x {t['seq_len']}: "
                f"{_fmt(t.get('tokens_per_s'))} tok/s, "
                f"MFU {_fmt(None if mfu is None else 100 * mfu, '%', 1)}, "
                f"peak {_gib(t.get('peak_gpu_bytes'))}" + (f"  error: {t['error']}" if "error" in t else "")
            )
        for dt, gap in entry.get("logprob_gap", {}).items():
            if "error" in gap:
                print(f"logprob gap {dt}: error: {gap['error']}")
            else:
                print(
                    f"logprob gap {dt}: max {gap['max_abs']:.2e}, "
                    f"mean {gap['mean_abs']:.2e} ({gap['tokens']} tokens)"
                )
    print()


if __name__ == "__main__":
    main()
