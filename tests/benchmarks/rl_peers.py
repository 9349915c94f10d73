"""One side of the RL peer benchmark (tests/benchmarks/test_bench_rl_peers.py), run in its own
process so that each side's peak RSS is its own:

    python tests/benchmarks/rl_peers.py tempering '<json settings>'
    python tests/benchmarks/rl_peers.py trl '<json settings>'

Both train the demo's RL stage from the same SFT checkpoint on ``ArithmeticProblems``' training
split: ``prompts`` problems × ``generations`` samples a step, ``steps`` steps, Adam (β2 0.98, no
weight decay) at ``lr`` decaying linearly to 0, at most ``max_tokens`` tokens at T=1, no KL term
(β=0), one torch thread, no gradient checkpointing, no gradient clipping, advantages normalised
by the group's standard deviation; ``threads`` torch threads. The model: ``base_model`` with a
LoRA adapter of rank ``lora_rank`` (the SFT checkpoint's adapter: same rank, alpha and target
modules on both sides), or full fine-tuning with ``lora_rank`` 0 (the tiny demo's SFT
checkpoint is a full fine-tune).

- tempering: :func:`tempering.recipes.stages.rl_stage` (what ``tempering demo`` runs), with
  ``init_state`` the SFT checkpoint's state path; importance-sampling loss summed over tokens.
- TRL: ``GRPOTrainer`` on the SFT checkpoint exported by
  :func:`tempering.local.export.export_checkpoint`: a Hugging Face model directory (full
  fine-tuning, ``hf_model``), or a PEFT adapter (``hf_adapter``) loaded trainable onto the base
  model's directory (``hf_model``); the same prompts, rendered by the same
  chat renderer into text that tokenizes back to the same ids (checked), and the same grader
  (:func:`tempering.envs.problem.exact_match`). ``loss_type="dr_grpo"`` (a sum over tokens
  divided by a constant, the nearest to tempering's sum; Adam is insensitive to the constant),
  one optimizer step per generation batch (``num_iterations=1``: on-policy, as tempering), fp32.

Prints one JSON line on stdout: ``wall_s`` (the whole stage: model load, training, final save;
TRL's merges its adapter), ``train_s`` (the steps alone), ``step_s`` (per step),
``samples_per_s``, ``peak_rss_mb`` (this process's ``VmHWM``) and ``model`` (the trained weights:
a tempering sampler path, or a Hugging Face directory with any adapter merged); the same JSON goes to
``<out>/<side>.json``, kept should the run be cut short."""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any


def _peak_rss_mb() -> float:
    """This process's peak resident set (``VmHWM``; ``ru_maxrss`` would carry the parent's peak
    across ``exec``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _task(s: dict[str, Any]) -> Any:
    from tempering.envs.arithmetic import ArithmeticProblems

    return ArithmeticProblems(
        base_model=s["base_model"], seed=s["seed"], n_test=s["n_test"], batch_size=s["prompts"],
        group_size=s["generations"], test_group_size=0,
    )  # fmt: skip


async def run_tempering(s: dict[str, Any]) -> dict[str, Any]:
    import torch

    from tempering.backend import ModelConfig
    from tempering.local import ServiceClient
    from tempering.recipes.stages import RecipeSession, RLStage, rl_stage

    torch.set_num_threads(s["threads"])
    t0 = time.perf_counter()
    service = ServiceClient(num_threads=s["threads"], device="cpu")
    out = Path(s["out"])
    session = RecipeSession("tempering", out, service, None, False)
    rl = await rl_stage(
        session, "rl", RLStage(s["steps"], s["lr"], lr_schedule="linear"), dataset=_task(s),
        model=ModelConfig(base_model=s["base_model"], lora_rank=s["lora_rank"], init_state=s["init_state"]),
        max_tokens=s["max_tokens"], normalize_advantages=True, log_trajectories=False, seed=s["seed"],
    )  # fmt: skip
    wall = time.perf_counter() - t0
    train_s = sum(float(line["time/step"]) for line in rl.metrics)
    service.close()
    assert rl.final.sampler_path is not None
    return _figures(s, wall, train_s, rl.final.sampler_path)


def _figures(s: dict[str, Any], wall: float, train_s: float, model: str) -> dict[str, Any]:
    samples = s["steps"] * s["prompts"] * s["generations"]
    return {
        "wall_s": wall,
        "train_s": train_s,
        "step_s": train_s / s["steps"],
        "samples_per_s": samples / train_s,
        "peak_rss_mb": _peak_rss_mb(),
        "model": model,
    }


def _trl_dataset(s: dict[str, Any]) -> Any:
    """The training problems as TRL rows: ``prompt`` (the chat renderer's generation prompt as
    text) and ``answer``; in the order tempering's dataset draws them, so both sides see the
    same problems at each step."""
    from datasets import Dataset

    from tempering.backend import load_renderer, load_tokenizer
    from tempering.envs.arithmetic import split_problems

    tokenizer = load_tokenizer(s["base_model"])
    renderer = load_renderer(s["base_model"], None)
    train, _ = split_problems(seed=s["seed"], n_test=s["n_test"])
    train_ds, _ = asyncio.run(_task(s)())
    rows: list[dict[str, str]] = []
    by_question = {p.question: p for p in train}
    assert train_ds is not None
    for i in range(s["steps"]):
        for builder in train_ds.get_batch(i):
            problem = by_question[builder.problem.question]  # type: ignore[attr-defined]
            ids = renderer.build_generation_prompt([{"role": "user", "content": problem.question}]).to_ints()
            text = tokenizer.decode(ids)
            if tokenizer(text).input_ids != ids:  # as TRL tokenizes it
                raise AssertionError(f"prompt {text!r} does not tokenize back to the renderer's ids")
            rows.append({"prompt": text, "answer": problem.answer})
    return Dataset.from_list(rows)


def _reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    from tempering.envs.problem import exact_match

    return [exact_match(c, a) for c, a in zip(completions, answer, strict=True)]


def run_trl(s: dict[str, Any]) -> dict[str, Any]:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tempering.local.model import hf_model, inference_copy

    torch.set_num_threads(s["threads"])
    dataset = _trl_dataset(s)  # data preparation is not timed (tempering's is inside its loop)
    t0 = time.perf_counter()
    model: Any = AutoModelForCausalLM.from_pretrained(s["hf_model"], dtype=torch.float32)
    if s.get("hf_adapter"):  # the SFT checkpoint's LoRA adapter, trained further
        model = PeftModel.from_pretrained(model, s["hf_adapter"], is_trainable=True)
    tokenizer = AutoTokenizer.from_pretrained(s["hf_model"])
    batch = s["prompts"] * s["generations"]
    config = GRPOConfig(
        output_dir=str(Path(s["out"]) / "trl"), max_steps=s["steps"], learning_rate=s["lr"],
        lr_scheduler_type="linear", warmup_steps=0, adam_beta1=0.9, adam_beta2=0.98, adam_epsilon=1e-8,
        weight_decay=0.0, max_grad_norm=0.0, per_device_train_batch_size=batch,
        gradient_accumulation_steps=1, num_generations=s["generations"], num_iterations=1,
        max_completion_length=s["max_tokens"], temperature=1.0, top_p=1.0, top_k=0, beta=0.0,
        scale_rewards="group", loss_type="dr_grpo", shuffle_dataset=False, gradient_checkpointing=False,
        bf16=False, fp16=False, use_cpu=True, seed=s["seed"], report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, dataloader_num_workers=0, log_completions=False,
    )  # fmt: skip
    step_times: list[float] = []

    class _Clock(TrainerCallback):
        t = 0.0

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.t = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            step_times.append(time.perf_counter() - self.t)

    trainer = GRPOTrainer(
        model=model, reward_funcs=_reward, args=config, train_dataset=dataset, processing_class=tokenizer,
        callbacks=[_Clock()],
    )  # fmt: skip
    trainer.train()
    out = str(Path(s["out"]) / "trl-final")
    hf_model(inference_copy(trainer.model)).save_pretrained(out)  # any adapter merged
    tokenizer.save_pretrained(out)
    wall = time.perf_counter() - t0
    return _figures(s, wall, sum(step_times), out)


def main(argv: list[str]) -> int:
    side, settings = argv[1], json.loads(argv[2])
    result = asyncio.run(run_tempering(settings)) if side == "tempering" else run_trl(settings)
    out = Path(settings["out"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{side}.json").write_text(json.dumps(result))  # kept should the run be cut short
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
