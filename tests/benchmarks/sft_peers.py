"""One side of the SFT peer benchmark (tests/benchmarks/test_bench_sft_peers.py), run in its own
process so that each side's peak RSS and thread pool are its own:

    python tests/benchmarks/sft_peers.py tempering '<json settings>'
    python tests/benchmarks/sft_peers.py trl '<json settings>'

Both train a LoRA adapter of rank ``lora_rank`` (alpha :data:`tempering.local.model.LORA_ALPHA`,
no dropout) on the same layers of ``base_model`` (tempering's choice,
:func:`tempering.local.model.lora_targets`: every attention and MLP projection and, with
``train_unembed``, the unembedding), in float32 on the CPU with ``threads`` torch threads,
``steps`` steps of ``batch_size`` conversations from the chat file ``data`` (the demo's arithmetic
problems), loss on the assistant's answer only, Adam (β2 0.98, no weight decay, no gradient
clipping) at ``lr`` after ``lr_warmup`` warmup steps, no gradient checkpointing, no packing, no
truncation.

- tempering: :func:`tempering.recipes.stages.sft_stage` (what ``tempering demo``'s SFT stage
  runs); a step's time is the loop's ``time/step`` (everything, batch building included).
- TRL: ``SFTTrainer`` with a PEFT ``LoraConfig`` of the same shape, on the same conversations as
  prompt-completion rows (``completion_only_loss``), each tokenized with the model's chat
  template; a step's time runs from ``on_step_begin`` to ``on_step_end`` (the batch's collation
  is outside it).

Tokens are those of the sequences each step trains on (prompt and answer, padding excluded).
The first ``warmup`` steps are not timed. Prints one JSON line on stdout: ``step_s`` (mean over
the timed steps), ``tokens_per_s`` (their tokens over their time), ``tokens_per_seq`` (mean
over every step), ``step_s_all`` (every step), ``peak_rss_mb`` (this process's ``VmHWM``) and
``loss_first``/``loss_last`` (the training loss at the first and last step); the same JSON goes
to ``<out>/<side>.json``, kept should the run be cut short.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmHWM in /proc/self/status")


def _figures(
    s: dict[str, Any], step_s: list[float], tokens: list[int], losses: list[float]
) -> dict[str, Any]:
    if len(step_s) != s["steps"] or len(tokens) != s["steps"]:
        raise AssertionError(
            f"{len(step_s)} step times and {len(tokens)} token counts for {s['steps']} steps"
        )
    timed = slice(s["warmup"], None)
    return {
        "step_s": sum(step_s[timed]) / len(step_s[timed]),
        "tokens_per_s": sum(tokens[timed]) / sum(step_s[timed]),
        "tokens_per_seq": sum(tokens) / (s["steps"] * s["batch_size"]),
        "step_s_all": step_s,
        "peak_rss_mb": _peak_rss_mb(),
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }


async def run_tempering(s: dict[str, Any]) -> dict[str, Any]:
    import torch

    from tempering.backend import ModelConfig
    from tempering.local import ServiceClient
    from tempering.recipes.stages import RecipeSession, SFTStage, sft_stage

    torch.set_num_threads(s["threads"])
    service = ServiceClient(num_threads=s["threads"], device="cpu")
    train_unembed = bool(s["train_unembed"])

    class _Lora(ModelConfig):  # the LoRA's layers as the TRL side gets them
        async def create_training_client(self, service: Any) -> Any:
            return await service.create_lora_training_client(
                self.base_model, rank=self.lora_rank, seed=self.seed, train_unembed=train_unembed
            )

    try:
        session = RecipeSession("bench-sft-peers", Path(s["out"]), service, None, progress=False)
        stage = SFTStage(s["steps"], s["batch_size"], s["lr"], max_warmup_steps=s["lr_warmup"])
        sft = await sft_stage(
            session, "sft", stage, model=_Lora(base_model=s["base_model"], lora_rank=s["lora_rank"], seed=0),
            train_path=s["data"], seed=s["seed"],
        )  # fmt: skip
    finally:
        service.close()
    lines = list(sft.metrics)
    # ``tokens`` counts each datum's model input, its sequence less the last token
    tokens = [int(line["tokens"]) + s["batch_size"] for line in lines]
    return _figures(
        s, [float(line["time/step"]) for line in lines], tokens, [float(line["loss"]) for line in lines]
    )


def run_trl(s: dict[str, Any]) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from tempering.local.checkpoints import CheckpointStore
    from tempering.local.model import LORA_ALPHA, lora_targets, resolve_model_dir

    torch.set_num_threads(s["threads"])
    rows = [json.loads(line)["messages"] for line in Path(s["data"]).read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list([{"prompt": m[:-1], "completion": m[-1:]} for m in rows])
    model_dir = resolve_model_dir(s["base_model"], CheckpointStore().root)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    targets = lora_targets(model, train_mlp=True, train_attn=True, train_unembed=bool(s["train_unembed"]))
    lora = LoraConfig(
        r=s["lora_rank"], lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=list(targets), bias="none",
        task_type="CAUSAL_LM",
    )  # fmt: skip
    config = SFTConfig(
        output_dir=str(Path(s["out"]) / "trl"), max_steps=s["steps"], learning_rate=s["lr"],
        lr_scheduler_type="constant_with_warmup", warmup_steps=s["lr_warmup"], adam_beta1=0.9,
        adam_beta2=0.98, adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=0.0,
        per_device_train_batch_size=s["batch_size"], gradient_accumulation_steps=1, max_length=None,
        packing=False, padding_free=False, completion_only_loss=True, gradient_checkpointing=False,
        bf16=False, fp16=False, use_cpu=True, seed=s["seed"], report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    step_s: list[float] = []
    tokens: list[int] = []

    class _Clock(TrainerCallback):
        t = 0.0

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.t = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            step_s.append(time.perf_counter() - self.t)

    class _Counting(SFTTrainer):
        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            tokens.append(int(inputs["attention_mask"].sum()))
            return super().training_step(model, inputs, num_items_in_batch)

    trainer = _Counting(
        model=model, args=config, train_dataset=dataset, processing_class=tokenizer, peft_config=lora,
        callbacks=[_Clock()],
    )  # fmt: skip
    trainer.train()
    losses = [float(entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]
    return _figures(s, step_s, tokens, losses)


def main(argv: list[str]) -> int:
    side, settings = argv[1], json.loads(argv[2])
    if side not in ("tempering", "trl"):
        raise SystemExit(f"sft_peers.py: the side is {side!r}; use tempering or trl")
    result = asyncio.run(run_tempering(settings)) if side == "tempering" else run_trl(settings)
    out = Path(settings["out"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{side}.json").write_text(json.dumps(result))  # kept should the run be cut short
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
