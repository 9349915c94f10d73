"""Fixtures for the renderer tests: in-memory byte-level tokenizers, one renderer per format."""

from __future__ import annotations

import pytest
from renderer_tokenizers import LLAMA3_TEMPLATE, make_tokenizer
from transformers import PreTrainedTokenizerFast

from tempering.renderers import RENDERERS, BaseRenderer, get_renderer


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE with every format's special tokens and a ChatML chat template."""
    return make_tokenizer()


@pytest.fixture(scope="session")
def llama_template_tokenizer() -> PreTrainedTokenizerFast:
    """The same vocabulary with a Llama 3 chat template (for the hf_template renderer)."""
    return make_tokenizer(LLAMA3_TEMPLATE, eos_token="<|eot_id|>")


@pytest.fixture(scope="session")
def renderers(tokenizer: PreTrainedTokenizerFast) -> dict[str, BaseRenderer]:
    return {name: get_renderer(name, tokenizer) for name in RENDERERS}


@pytest.fixture(params=sorted(RENDERERS))
def renderer(request: pytest.FixtureRequest, renderers: dict[str, BaseRenderer]) -> BaseRenderer:
    return renderers[request.param]
