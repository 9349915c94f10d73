"""Fixtures for the env tests: the tiny model's byte-level tokenizer and a ChatML renderer."""

from __future__ import annotations

import pytest

from tempering.local.tiny import build_tiny_tokenizer
from tempering.renderers import BaseRenderer, get_renderer


@pytest.fixture(scope="session")
def renderer() -> BaseRenderer:
    return get_renderer("chatml", build_tiny_tokenizer())
