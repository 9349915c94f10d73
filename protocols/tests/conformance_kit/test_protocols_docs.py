"""The documentation's examples run and cannot go stale.

- docs/protocols.md shows ``example_env.py`` verbatim, and the example passes the kit;
- its rule table is ``RULES``, row for row;
- every python block in it compiles;
- the README's "Writing an environment" blocks run, and ``ReverseGroup`` passes the kit.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from tempering_protocols.testing import (
    RULES,
    check_env_group_builder,
    check_rl_dataset_builder,
    check_token_completer,
)

from . import example_env

REPO = Path(__file__).parents[3]
DOCS = REPO / "docs" / "protocols.md"
README = REPO / "README.md"
EXAMPLE_MARKER = "<!-- example: protocols/tests/conformance_kit/example_env.py -->"


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", markdown, flags=re.DOTALL | re.MULTILINE)


def test_example_passes_the_kit() -> None:
    group = check_env_group_builder(example_env.GuessGroup(secret=7), actions=example_env.bisect_actions)
    assert group.get_total_rewards()[0] >= 1.0
    check_rl_dataset_builder(example_env.GuessDatasetBuilder())
    check_token_completer(example_env.UniformGuesser())


def test_docs_show_the_example_module_verbatim() -> None:
    docs = DOCS.read_text()
    assert docs.count(EXAMPLE_MARKER) == 1
    after_marker = docs.split(EXAMPLE_MARKER, 1)[1]
    block = python_blocks(after_marker)[0]
    assert after_marker.startswith("\n```python\n"), "the example block must follow the marker"
    assert block == Path(example_env.__file__).read_text()


def test_docs_check_snippet_runs_against_the_example() -> None:
    docs = DOCS.read_text()
    after_example = docs.split(EXAMPLE_MARKER, 1)[1]
    snippet = python_blocks(after_example)[1]
    assert "check_env_group_builder(GuessGroup" in snippet
    exec(compile(snippet, "docs/protocols.md", "exec"), dict(vars(example_env)))


def test_docs_rule_table_is_the_rules() -> None:
    rows = re.findall(r"^\| `([a-z-]+/[a-z-]+)` \| (.*) \|$", DOCS.read_text(), flags=re.MULTILINE)
    assert rows == [(rule, text.replace("|", "\\|")) for rule, text in RULES.items()]


def test_docs_python_blocks_compile() -> None:
    blocks = python_blocks(DOCS.read_text())
    assert len(blocks) >= 8
    for block in blocks:
        compile(block, "docs/protocols.md", "exec")


@pytest.fixture
def readme_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The README's "Writing an environment" code, run as a module (so its classes pickle)."""
    section = README.read_text().split("## Writing an environment", 1)[1].split("\n## ", 1)[0]
    blocks = python_blocks(section)
    assert len(blocks) == 2, "expected the env block and the check block"
    module = types.ModuleType("readme_writing_an_environment")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for block in blocks:  # the second block runs the kit
        exec(compile(block, "README.md", "exec"), module.__dict__)
    return module


def test_readme_example_passes_the_kit(readme_module: types.ModuleType) -> None:
    make_group = readme_module.ReverseGroup
    group = check_env_group_builder(make_group(prompt=(5, 6, 7), group_size=2))
    assert group.get_total_rewards() == [0.0, 0.0]
