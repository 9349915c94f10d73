"""The benchmark evaluator and the chat-file NLL evaluator, on the local engine's tiny model.

The grading path is also checked with a scripted sampler whose replies are known (correct for
some items, wrong or answerless for others), so the figures have expected values; the NLL from
``compute_logprobs`` is checked against the training client's ``forward`` cross-entropy of
the same conversations (two independent paths through the engine).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tinker
from tinker import types as ttypes

from tempering import assets
from tempering.backend import load_tokenizer
from tempering.data import load_chat
from tempering.data.datums import datum_from_example
from tempering.evals.benchmarks import get_benchmark, load_items
from tempering.evals.math_bench import BenchmarkEvaluator
from tempering.evals.nll import ChatNLLEvaluator
from tempering.evals.stats import item_seed, wilson_interval
from tempering.grading import MathGrader
from tempering.local import ServiceClient
from tempering.renderers import get_renderer
from tempering_protocols import TrainOnWhat

FIXTURES = Path(__file__).parent / "fixtures"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def renderer() -> Any:
    return get_renderer("chatml", load_tokenizer("tempering/tiny"))


def _evaluator(renderer: Any, **kwargs: Any) -> BenchmarkEvaluator:
    bench = get_benchmark("gsm8k")
    return BenchmarkEvaluator(
        bench, load_items(bench, FIXTURES / "gsm8k.jsonl", limit=3), renderer, grader=MathGrader(), **kwargs
    )


def test_every_item_and_sample_draws_its_own_seed_on_the_local_engine(
    service: ServiceClient, renderer: Any
) -> None:
    sampler = service.create_sampling_client(base_model="tempering/tiny").result()
    evaluator = _evaluator(renderer, num_samples=3, temperature=1.0, max_tokens=8, seed=5)
    first = asyncio.run(evaluator.run(sampler))
    again = asyncio.run(evaluator.run(sampler))
    other = asyncio.run(
        _evaluator(renderer, num_samples=3, temperature=1.0, max_tokens=8, seed=6).run(sampler)
    )
    seeds = [s.seed for i in first.items for s in i.samples]
    assert seeds == [item_seed(5, "gsm8k", i, s) for i in range(3) for s in range(3)]
    texts = [s.text for i in first.items for s in i.samples]
    assert len(set(texts)) == len(texts), "samples of one item, and items, must not share a stream"
    assert texts == [s.text for i in again.items for s in i.samples], "a rerun repeats its samples"
    assert texts != [s.text for i in other.items for s in i.samples]
    assert all(s.tokens > 0 for i in first.items for s in i.samples)
    metrics = asyncio.run(evaluator(sampler))
    assert metrics["gsm8k/pass@1"] == first.pass_at_1
    assert set(metrics) >= {"gsm8k/pass@1_ci_low", "gsm8k/pass@1_ci_high", "gsm8k/no_answer"}
    assert len(evaluator.results) == 3


class ScriptedSampler:
    """Replies with a fixed text per prompt (chosen by a substring of the prompt's text)."""

    def __init__(self, renderer: Any, tokenizer: Any, replies: dict[str, list[str]]) -> None:
        self.renderer, self.tokenizer, self.replies = renderer, tokenizer, replies
        self.asked: dict[str, int] = {}

    async def sample(self, prompt: tinker.ModelInput, n: int, params: tinker.SamplingParams) -> Any:
        text = self.tokenizer.decode(prompt.to_ints())
        (key,) = [k for k in self.replies if k in text]
        k = self.asked.get(key, 0)
        self.asked[key] = k + n
        seqs = []
        for reply in self.replies[key][k : k + n]:
            tokens = [
                *self.tokenizer.encode(reply, add_special_tokens=False),
                *self.renderer.get_stop_sequences(),
            ]
            seqs.append(
                ttypes.SampledSequence(stop_reason="stop", sequence_id="s", tokens_np=np.array(tokens))
            )
        return ttypes.SampleResponse(sequences=seqs)


def test_pass_at_1_and_its_interval_from_graded_replies(renderer: Any) -> None:
    tokenizer = load_tokenizer("tempering/tiny")
    replies = {
        "muffins": ["so \\boxed{6}", "it is 6", "\\boxed{7}", "#### 6"],  # 3 of 4 correct
        "pencils": ["\\boxed{43}", "\\boxed{43.0}", "\\boxed{42}", "no idea"],  # 2 of 4
        "train travels": ["\\boxed{150 miles}", "\\boxed{\\frac{300}{2}}", "150", "\\boxed{15}"],  # 3
    }
    sampler = ScriptedSampler(renderer, tokenizer, replies)
    result = asyncio.run(_evaluator(renderer, num_samples=4).run(sampler))  # type: ignore[arg-type]
    assert [i.accuracy for i in result.items] == [0.75, 0.5, 0.75]
    assert result.pass_at_1 == 8 / 12
    assert (result.ci_low, result.ci_high) == wilson_interval(8, 12)
    # per-pass accuracies: pass 0: 1,1,1; pass 1: 1,1,1; pass 2: 0,0,1; pass 3: 1,0,0
    passes = [1.0, 1.0, 1 / 3, 1 / 3]
    mean = sum(passes) / 4
    assert result.std_over_samples == pytest.approx(math.sqrt(sum((p - mean) ** 2 for p in passes) / 3))
    metrics = result.metrics()
    assert metrics["gsm8k/no_answer"] == 1 / 12  # "no idea"
    assert result.to_json()["metrics"]["pass@1"] == 8 / 12


def test_chat_nll_matches_the_training_clients_cross_entropy(service: ServiceClient, renderer: Any) -> None:
    tokenizer = load_tokenizer("tempering/tiny")
    conversations = load_chat(assets.path("arithmetic_chat_test.jsonl")).items[:6]
    sampler = service.create_sampling_client(base_model="tempering/tiny").result()
    evaluator = ChatNLLEvaluator(conversations, renderer, tokenizer, name="held_out")
    result = asyncio.run(evaluator.run(sampler))
    # The same weights through the trainer: a fresh LoRA adapter is zero, so it is the base model.
    trainer = service.create_lora_training_client("tempering/tiny", rank=4, seed=0).result()
    examples = [
        renderer.build_supervised_example(c, TrainOnWhat.ALL_ASSISTANT_MESSAGES) for c in conversations
    ]
    datums = [datum_from_example(e) for e in examples]
    out = trainer.forward(datums, "cross_entropy").result()
    weight = sum(float(e.weights.sum()) for e in examples)
    assert result.tokens == int(weight)
    assert result.nll == pytest.approx(out.metrics["loss:sum"] / weight, rel=1e-4)
    # bytes: the reply text of each conversation plus the end-of-turn marker the renderer trains on
    replies = sum(len(c[-1]["content"].encode()) for c in conversations)
    assert replies < result.bytes < replies + 20 * len(conversations)
    assert result.bits_per_byte == pytest.approx(result.nll_nats / math.log(2) / result.bytes)
    assert evaluator.results == [result]
    assert set(result.metrics()) == {
        f"held_out/{k}" for k in ("nll", "bits_per_byte", "perplexity", "tokens", "bytes")
    }
