"""The real model: SmolLM2-135M-Instruct, pulled from the package registry and converted once
(``tempering models pull smollm2-135m-instruct``; ``make test`` pulls it before the tests).

Loaded once per module (about 540 MB in float32). Skipped only when the model is not in the
cache and cannot be pulled; with ``TEMPERING_REQUIRE_REAL_MODEL=1`` (set by ``make test``) that
is a failure instead."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import tinker
from local_helpers import next_token_logprobs, reference_model, sft_datum
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from tempering.backend import load_tokenizer
from tempering.local import LocalTrainingClient, ServiceClient
from tempering.local.checkpoints import CheckpointStore, default_root
from tempering.local.errors import ModelCacheError
from tempering.local.export import export_checkpoint
from tempering.local.model import resolve_model_dir
from tempering.local.model_cache import verify
from tempering.model_info import PACKAGED_MODELS, get_lr, recommended_renderer
from tempering.renderers import get_renderer
from tempering.renderers.smollm2 import DEFAULT_SYSTEM_PROMPT
from tempering_protocols import Message, TrainOnWhat

HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"
SHORT = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def model_dir() -> Path:
    try:
        return resolve_model_dir(HUB, default_root())
    except ModelCacheError as exc:
        if os.environ.get("TEMPERING_REQUIRE_REAL_MODEL") == "1":
            pytest.fail(f"the real model must be present here (make test pulls it): {exc}")
        pytest.skip(f"{HUB} is not in the model cache and cannot be pulled here: {exc}")


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_dir)


def test_resolves_offline_by_hub_name(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # no registry either
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    root = default_root()
    assert resolve_model_dir(HUB, root) == model_dir == root / "models" / SHORT
    assert resolve_model_dir(SHORT, root) == model_dir
    manifest = verify(model_dir)
    assert manifest["hub_name"] == HUB
    assert manifest["gguf_sha256"] == PACKAGED_MODELS[SHORT].gguf_sha256
    assert "Q4_1" in manifest["quantization"]  # type: ignore[operator]
    tok = load_tokenizer(HUB)  # the backend's tokenizer resolves the same way, offline
    assert tok.decode(tok.encode("What is 12 + 7?", add_special_tokens=False)) == "What is 12 + 7?"
    assert recommended_renderer(HUB) == "smollm2"
    assert get_lr(HUB) == pytest.approx(5e-4 * (2000 / 576) ** 0.781)


def test_pull_when_present_returns_the_copy(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tempering.cli import main

    assert main(["models", "pull", SHORT]) == 0  # what `make models` runs: checks, converts nothing
    assert capsys.readouterr().out.strip() == str(model_dir)
    assert main(["models", "list"]) == 0
    assert f"[{HUB}]" in capsys.readouterr().out


CORPUS: list[list[Message]] = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    [
        {"role": "system", "content": "You answer with a number only."},
        {"role": "user", "content": "What is 17 + 25?"},
        {"role": "assistant", "content": "42"},
    ],
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one, with  spaces\nand a newline?  ünïcödé 日本 "},
        {"role": "assistant", "content": "Green!\n\nIt is the colour of grass."},
    ],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "1234567 * 89 = ?"},
    ],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
]


@pytest.mark.parametrize("index", range(len(CORPUS)))
def test_renderer_is_token_identical_to_the_chat_template(
    tokenizer: PreTrainedTokenizerBase, index: int
) -> None:
    messages = CORPUS[index]
    renderer = get_renderer("smollm2", tokenizer)

    def template(msgs: list[Message], generation: bool) -> list[int]:
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation)
        assert isinstance(text, str)
        return list(tokenizer.encode(text, add_special_tokens=False))

    assert renderer.build_generation_prompt(messages).to_ints() == template(messages, True)
    if messages[-1]["role"] != "assistant":
        return
    # The template ends every message with "<|im_end|>\n"; a trained turn ends at <|im_end|>.
    full = template(messages, False)
    newline = tokenizer.encode("\n", add_special_tokens=False)
    assert full[-len(newline) :] == newline
    example = renderer.build_supervised_example(messages, TrainOnWhat.LAST_ASSISTANT_MESSAGE)
    assert example.model_input.to_ints() == full[: -len(newline)]
    tokens = example.model_input.to_ints()
    trained = [t for t, w in zip(tokens, example.weights, strict=True) if w]
    assert tokenizer.decode(trained) == f"{messages[-1]['content']}<|im_end|>"
    # all_tokens trains everything but the default system prompt (the rendering's prefix, which
    # is not a message of the conversation).
    everything = renderer.build_supervised_example(messages, TrainOnWhat.ALL_TOKENS).weights
    prefix = renderer.render(messages, generation=False).prefix
    n = sum(len(p) for p in prefix if isinstance(p, tuple))
    assert not everything[:n].any()
    assert everything[n:].all()
    expected = (
        "" if messages[0]["role"] == "system" else f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>"
    )
    assert tokenizer.decode(tokens[:n]) == expected


@pytest.fixture(scope="module")
def trainer(service: ServiceClient, model_dir: Path) -> LocalTrainingClient:
    return service.create_lora_training_client(str(model_dir), rank=8, seed=0).result()


def test_leading_whitespace_is_where_the_template_tokenizes_differently(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """The one documented difference (docs/renderers.md, smollm2): the template tokenizes
    ``user\n`` and the content as one string, so content that starts with whitespace merges
    with the header's newline; the renderer tokenizes them apart (as every renderer does, so a
    turn trains as it is sampled). The text is the same."""
    messages: list[Message] = [{"role": "user", "content": "  two leading spaces"}]
    renderer = get_renderer("smollm2", tokenizer)
    ours = renderer.build_generation_prompt(messages).to_ints()
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert isinstance(text, str)
    theirs = list(tokenizer.encode(text, add_special_tokens=False))
    assert ours != theirs
    assert tokenizer.decode(ours) == tokenizer.decode(theirs) == text


def _datum(tokenizer: PreTrainedTokenizerBase, messages: list[Message]) -> tinker.Datum:
    renderer = get_renderer("smollm2", tokenizer)
    example = renderer.build_supervised_example(messages, TrainOnWhat.LAST_ASSISTANT_MESSAGE)
    return sft_datum(example.model_input.to_ints(), example.weights.tolist()[1:])


def _loss(client: LocalTrainingClient, data: list[tinker.Datum]) -> float:
    out = client.forward(data, "cross_entropy").result()
    total = 0.0
    weight = 0.0
    for o, d in zip(out.loss_fn_outputs, data, strict=True):
        w = d.loss_fn_inputs["weights"].to_numpy()
        total -= float((o["logprobs"].to_numpy() * w).sum())
        weight += float(w.sum())
    return total / weight


def test_one_sft_step_lowers_the_loss(
    trainer: LocalTrainingClient, tokenizer: PreTrainedTokenizerBase
) -> None:
    data = [_datum(tokenizer, c) for c in CORPUS[1:4]]
    before = _loss(trainer, data)
    trainer.forward_backward(data, "cross_entropy").result()
    trainer.optim_step(tinker.AdamParams(learning_rate=get_lr(HUB))).result()
    after = _loss(trainer, data)
    assert after < before - 0.05, (before, after)


def test_a_sample_decodes_to_text_and_its_logprobs_match_the_trainer(
    trainer: LocalTrainingClient, tokenizer: PreTrainedTokenizerBase
) -> None:
    renderer = get_renderer("smollm2", tokenizer)
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "What is the capital of France?"}])
    sampler = trainer.save_weights_and_get_sampling_client("real-model-sampler")
    greedy = sampler.sample(prompt, 1, tinker.SamplingParams(max_tokens=12, temperature=0.0, seed=0)).result()
    message, _ = renderer.parse_response(greedy.sequences[0].tokens)
    text = message["content"]
    assert isinstance(text, str)
    assert sum(c.isalpha() for c in text) >= 5, text
    params = tinker.SamplingParams(max_tokens=8, temperature=1.0, seed=1, stop=[])
    response = sampler.sample(prompt, 2, params).result()
    prompt_ids = prompt.to_ints()
    data = [
        sft_datum(prompt_ids + seq.tokens, [0.0] * (len(prompt_ids) - 1) + [1.0] * len(seq.tokens))
        for seq in response.sequences
    ]
    out = trainer.forward(data, "cross_entropy").result()
    for seq, o in zip(response.sequences, out.loss_fn_outputs, strict=True):
        assert seq.logprobs is not None
        np.testing.assert_allclose(
            seq.logprobs, o["logprobs"].to_numpy()[len(prompt_ids) - 1 :], atol=1e-4, rtol=0
        )


def test_export_round_trips_through_transformers(
    trainer: LocalTrainingClient, local_root: Path, tmp_path: Path
) -> None:
    tokens = [1, 9690, 198, 504, 314, 253, 5356, 30, 2, 198, 1, 520, 9531, 198, 33]
    path = trainer.save_state("real-model-export").result().path
    sampler = trainer.save_weights_and_get_sampling_client("real-model-export-sampler")
    engine = sampler.compute_logprobs(tinker.ModelInput.from_ints(tokens)).result()
    out = export_checkpoint(path, tmp_path / "model", store=CheckpointStore(local_root))
    model = reference_model(out.out_dir)
    np.testing.assert_allclose(
        next_token_logprobs(model, tokens), [float(x) for x in engine[1:] if x is not None], atol=1e-4
    )
    exported = AutoTokenizer.from_pretrained(out.out_dir)
    assert exported.decode(exported.encode("What is 12 + 7?", add_special_tokens=False)) == "What is 12 + 7?"
