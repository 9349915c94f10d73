"""The reference cookbook's own ``math_rl`` recipe, unchanged, against ``tempering serve``:
the server's resident memory over the whole run (issue 25's "done when").

tinker-cookbook 0.6.1's ``tinker_cookbook.recipes.math_rl.train`` runs in a subprocess exactly as
its README says (``python -m tinker_cookbook.recipes.math_rl.train key=value ...``), pointed at a
``tempering serve`` started here (``base_url``, ``TINKER_API_KEY``); only its command-line
configuration is chosen (the model, the renderer, a batch this 2-core machine can run, and
``loss_fn=importance_sampling``: the recipe's default ``stable_reinforce`` samples with
``record_stability_info``, which the server refuses by name because that loss's objective is not
published). The
server's ``VmRSS`` is read every ``--poll`` seconds; the recipe's own ``metrics.jsonl`` gives the
per-step rewards. The figure of merit is the growth of the server's memory from the end of the
warm-up steps to the last step, in model copies (the model's safetensors size).

The cookbook's tokenizer loader calls ``AutoTokenizer.from_pretrained(model_name)``, so offline
``model_name`` is the converted model's directory (``tempering models pull`` writes it); with hub
access the hub name works the same way.

Run (on demand; minutes per step on a busy 2-core machine)::

    python tests/benchmarks/cookbook_math_rl_serve.py \
        --model ~/.cache/tempering/models/smollm2-135m-instruct --steps 100

Prints a summary line of JSON and writes ``<out>/memory.jsonl`` (one line per poll) and
``<out>/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tempering.serve.testing import API_KEY, ServerProcess


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def steps_done(metrics: Path) -> list[dict[str, float]]:
    if not metrics.exists():
        return []
    rows: list[dict[str, float]] = []
    for line in metrics.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # the line being written
            break
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a local HF model directory")
    parser.add_argument("--steps", type=int, default=100, help="the recipe's steps to run")
    parser.add_argument("--warmup", type=int, default=10, help="steps before the baseline RSS")
    parser.add_argument("--groups-per-batch", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--renderer", default="role_colon")
    parser.add_argument(
        "--loss-fn",
        default="importance_sampling",
        help="the recipe's loss_fn; its default, stable_reinforce, needs record_stability_info, "
        "which tempering serve refuses (a 400) until it is implemented",
    )
    parser.add_argument("--poll", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    model_dir = Path(args.model).expanduser().resolve()
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    out = args.out or Path(tempfile.mkdtemp(prefix="cookbook-math-rl-"))
    out.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(out / "server-data", out / "home").start()
    assert server.pid is not None
    log_path = out / "recipe"
    # The recipe's CLI has no step cap: it is stopped once the wanted steps are in its metrics.
    command = [
        sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train",
        f"model_name={model_dir}", f"renderer_name={args.renderer}", "env=arithmetic",
        f"groups_per_batch={args.groups_per_batch}", f"group_size={args.group_size}",
        f"learning_rate={args.learning_rate}", f"log_path={log_path}", f"base_url={server.url}",
        "behavior_if_log_dir_exists=delete", "eval_every=0", "save_every=0", "lora_rank=32",
        f"loss_fn={args.loss_fn}",
    ]  # fmt: skip
    env = {**os.environ, "TINKER_API_KEY": API_KEY, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    started = time.monotonic()
    with open(out / "recipe.log", "w") as recipe_log:
        recipe = subprocess.Popen(command, env=env, stdout=recipe_log, stderr=subprocess.STDOUT)
    readings: list[tuple[int, float]] = []  # (steps done, rss MB)
    try:
        with open(out / "memory.jsonl", "w") as mem:
            while recipe.poll() is None:
                done = len(steps_done(log_path / "metrics.jsonl"))
                rss = rss_bytes(server.pid) / 2**20
                readings.append((done, rss))
                t = round(time.monotonic() - started, 1)
                mem.write(json.dumps({"t": t, "steps": done, "rss_mb": rss}) + "\n")
                mem.flush()
                if done >= args.steps:
                    recipe.terminate()
                    break
                time.sleep(args.poll)
        recipe.wait(60)
    finally:
        if recipe.poll() is None:
            recipe.kill()
        server.stop()
    rows = steps_done(log_path / "metrics.jsonl")
    if len(rows) < args.steps:
        print(f"the recipe stopped after {len(rows)} steps; see {out / 'recipe.log'}", file=sys.stderr)
        return 1
    base = [rss for done, rss in readings if done == args.warmup]
    last = [rss for done, rss in readings if done >= args.steps - 1]
    baseline, final = base[-1], last[-1]
    peak = max(rss for _, rss in readings)

    first, end = rows[: args.warmup], rows[-args.warmup :]
    keys = [k for k in rows[0] if k.startswith("env/all/") and not k.endswith(("/max", "/min"))]
    summary = {
        "steps": len(rows),
        "wall_s": round(time.monotonic() - started, 1),
        "model_mb": round(weights / 2**20, 1),
        "rss_after_warmup_mb": round(baseline, 1),
        "rss_last_mb": round(final, 1),
        "rss_peak_mb": round(peak, 1),
        "growth_model_copies": round((final - baseline) / (weights / 2**20), 3),
        "first_steps_mean": {k: sum(r.get(k, 0.0) for r in first) / len(first) for k in keys},
        "last_steps_mean": {k: sum(r.get(k, 0.0) for r in end) / len(end) for k in keys},
        "command": " ".join(command),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
