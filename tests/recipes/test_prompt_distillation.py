"""Prompt distillation: the student's datums never hold the instructions the teacher read; with
top-K targets the teacher's rows are the ones it gave reading the instructions; the recipe runs at
a tiny budget and its student's training loss falls. Real-model figures:
docs/recipes/prompt-distillation.md."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from tempering.backend import load_tokenizer
from tempering.local import ServiceClient
from tempering.recipes import load_recipe
from tempering.recipes.prompt_distillation import PromptDistillationRecipe
from tempering.recipes.stages import SFTStage
from tempering.renderers import get_renderer
from tempering.sft.prompt_distill import prompt_distill_datums, query_of, teacher_answers, with_instructions
from tempering.sft.topk_distill import teacher_topk
from tempering_protocols import Message

INSTRUCTIONS = "Always answer in capital letters, with one word."


def _convo() -> list[Message]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "blue"},
    ]


def test_query_of_drops_system_messages_and_the_answer() -> None:
    query, reference = query_of(_convo())
    assert query == [{"role": "user", "content": "Name a colour."}]
    assert reference == "blue"
    with pytest.raises(ValueError, match="end with an assistant answer"):
        query_of([{"role": "user", "content": "hi"}])


@pytest.mark.timeout(120)
def test_student_datums_never_hold_the_instructions(service: ServiceClient) -> None:
    renderer = get_renderer("role_colon", load_tokenizer("tempering/tiny"))
    client = service.create_lora_training_client("tempering/tiny", rank=4, seed=0).result()
    teacher = client.save_weights_and_get_sampling_client("pd-teacher")
    query, _ = query_of(_convo())
    answers = asyncio.run(teacher_answers(teacher, renderer, [query], INSTRUCTIONS, max_tokens=6))
    answers = [answers[0] or "x"]
    (plain,) = asyncio.run(prompt_distill_datums(renderer, [query], answers, INSTRUCTIONS))
    (soft,) = asyncio.run(
        prompt_distill_datums(renderer, [query], answers, INSTRUCTIONS, targets="topk", teacher=teacher, k=3)
    )
    text = renderer.decode(plain.model_input.to_ints())
    assert "capital letters" not in text
    assert "Name a colour." in text
    assert soft.model_input.to_ints() == plain.model_input.to_ints()
    # the soft targets are the teacher's rows *with* the instructions: its most likely token
    # where the first answer token is predicted
    seen = renderer.build_supervised_example(
        [*with_instructions(query, INSTRUCTIONS), {"role": "assistant", "content": answers[0]}]
    )
    full = seen.model_input.to_ints()
    ids, _ = asyncio.run(teacher_topk(teacher, full, 3))
    first_t = int(np.flatnonzero(np.asarray(seen.weights) > 0)[0])
    weights = plain.loss_fn_inputs["weights"].to_numpy()
    first_s = int(np.flatnonzero(weights > 0)[0])
    soft_w = soft.loss_fn_inputs["weights"].to_numpy()
    row = int(np.flatnonzero(soft_w.sum(axis=1) > 0)[0])
    np.testing.assert_array_equal(soft.loss_fn_inputs["target_tokens"].to_numpy()[row], ids[first_t - 1])
    assert first_s == row
    with pytest.raises(ValueError, match="needs the teacher"):
        asyncio.run(prompt_distill_datums(renderer, [query], answers, INSTRUCTIONS, targets="topk"))


@pytest.mark.timeout(300)
def test_prompt_distillation_tiny_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPERING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TEMPERING_NUM_THREADS", "1")
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    out = tmp_path / "run"
    recipe = PromptDistillationRecipe(
        out=str(out), n_train=32, n_test=8, student=SFTStage(12, 16, schedule="linear"), max_tokens=6,
        targets="topk", k=4, progress=False,
    )  # fmt: skip
    result = asyncio.run(recipe())
    f = result.figures
    for key in ("agreement_before", "agreement_after", "exact_match_teacher", "exact_match_after"):
        assert 0.0 <= f[key] <= 1.0
    rows = [json.loads(line) for line in (out / "data" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 32
    assert all(m["role"] != "system" for row in rows for m in row["messages"])
    metrics = [json.loads(line) for line in (out / "student" / "metrics.jsonl").read_text().splitlines()]
    assert np.mean([m["loss"] for m in metrics[-3:]]) < np.mean([m["loss"] for m in metrics[:3]])
    assert load_recipe("prompt-distillation") is PromptDistillationRecipe
    with pytest.raises(ValueError, match=r"instructions \(--instructions\) must not be empty"):
        PromptDistillationRecipe(instructions=" ")
