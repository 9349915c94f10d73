"""The package's layers (docs/architecture.md), checked over its imports.

Every ``import`` and ``from … import`` in ``python/tempering`` (lazy and ``TYPE_CHECKING`` ones
included: they are dependencies all the same) is parsed with :mod:`ast`. A module may import its
own layer and the layers below it, never one above; ``envs`` may import only the packages in
:data:`ENVS_MAY_IMPORT`; and no module imports itself back through a chain of imports. A new
package must be given a layer here before its imports pass.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "python"

LAYERS: list[tuple[str, frozenset[str]]] = [
    ("CLI and recipes", frozenset({"tempering.cli", "tempering.recipes"})),
    (
        "envs and trainers",
        frozenset(
            {
                "tempering.ad",
                "tempering.envs",
                "tempering.evals",
                "tempering.rl",
                "tempering.sft",
                "tempering.preference",
                "tempering.training",
                "tempering.view",
            }
        ),
    ),
    (
        "backend",
        frozenset(
            {
                "tempering",
                "tempering.backend",
                "tempering.backends",
                "tempering.local",
                "tempering.policy",
                "tempering.serve",
            }
        ),
    ),
    (
        "renderers and data",
        frozenset(
            {
                "tempering.renderers",
                "tempering.data",
                "tempering.assets",
                "tempering.grading",
                "tempering.model_info",
                "tempering.losses",
                "tempering.fs",
                "tempering.tools",
                "tempering.arrays",
            }
        ),
    ),
    ("protocols and core", frozenset({"tempering_protocols", "tempering._core"})),
]
"""Top to bottom. ``tempering`` itself (the package's ``__init__``: ``service_client``) sits
with the backend, so importing any submodule stays light."""

ENVS_MAY_IMPORT = frozenset(
    {
        "tempering.envs",
        "tempering.renderers",
        "tempering.assets",
        "tempering.data",
        "tempering.grading",
        "tempering.tools",
        "tempering.model_info",
        "tempering.backend",
        "tempering_protocols",
        "tempering._core",
    }
)
"""Envs sit below the RL loop: they never import ``rl``, ``training``, ``sft``, ``preference``
or the local engine. (``backend`` for ``load_tokenizer``, ``data`` for the chat-file reader.)"""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file() or name == "tempering._core"


def imports_of(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """The tempering modules that ``source`` (the text of ``module``) imports: for
    ``from a.b import c`` the submodule ``a.b.c`` when there is one, else ``a.b``."""
    out: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if _is_module(sub) else target)
    return {m for m in out if m == "tempering" or m.startswith(("tempering.", "tempering_protocols"))}


def unit_of(module: str) -> str:
    """The package a module belongs to for layering: ``tempering.rl.train`` → ``tempering.rl``."""
    if module.startswith("tempering_protocols"):
        return "tempering_protocols"
    return ".".join(module.split(".")[:2])


def layer_of(unit: str) -> int:
    for index, (_, units) in enumerate(LAYERS):
        if unit in units:
            return index
    raise AssertionError(f"{unit} has no layer: add it to LAYERS in tests/test_layering.py")


def violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Every import in ``graph`` (module → modules it imports) that goes up a layer, or out of
    what ``envs`` may import."""
    out: list[str] = []
    for module, targets in sorted(graph.items()):
        source = unit_of(module)
        for target in sorted(targets):
            dest = unit_of(target)
            if layer_of(dest) < layer_of(source):
                out.append(
                    f"{module} imports {target}: {LAYERS[layer_of(source)][0]} may not import "
                    f"{LAYERS[layer_of(dest)][0]}"
                )
            elif source == "tempering.envs" and dest not in ENVS_MAY_IMPORT:
                out.append(f"{module} imports {target}: envs may import only {sorted(ENVS_MAY_IMPORT)}")
    return out


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected components of two or more modules
    (Tarjan's algorithm), and modules that import themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "tempering").rglob("*.py")):
        module = _module_name(path)
        graph[module] = imports_of(path.read_text(), module, is_package=path.name == "__init__.py") - {module}
    return graph


def test_every_package_has_a_layer() -> None:
    for module in package_graph():
        layer_of(unit_of(module))


def test_no_import_goes_up_a_layer() -> None:
    found = violations(package_graph())
    assert not found, "layering violations (see docs/architecture.md):\n" + "\n".join(found)


def test_import_graph_has_no_cycle() -> None:
    found = cycles(package_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def unit_graph(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """``graph`` between packages (:func:`unit_of`): package → the other packages it imports."""
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = unit_of(module)
        out.setdefault(source, set()).update(unit_of(t) for t in targets if unit_of(t) != source)
    return out


def test_packages_import_each_other_in_one_direction() -> None:
    """No cycle between packages, within a layer too (``rl`` ↔ ``evals`` and ``local`` ↔
    ``backend`` were such cycles: module by module acyclic, but two packages that each need
    the other)."""
    found = cycles(unit_graph(package_graph()))
    assert not found, "package cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_a_package_cycle_is_found() -> None:
    graph = {
        "tempering.rl.train": {"tempering.evals.suite"},
        "tempering.evals.accuracy": {"tempering.rl.policy"},
    }
    assert cycles(unit_graph(graph)) == [["tempering.evals", "tempering.rl"]]


@pytest.mark.parametrize(
    ("module", "source", "message"),
    [
        ("tempering.envs.x", "from tempering.rl.rollouts import MASK_TURN", "envs may import only"),
        ("tempering.envs.x", "from tempering.recipes import RECIPES", "may not import"),
        (
            "tempering.envs.x",
            "def f():\n    from tempering.local.tiny import TINY_MODEL\n",
            "envs may import only",
        ),
        ("tempering.backend", "import tempering.training.loop", "may not import"),
        ("tempering.renderers.x", "from tempering.backend import load_tokenizer", "may not import"),
        ("tempering.data.x", "from tempering import cli", "may not import"),
    ],
)
def test_the_checker_catches_a_new_violation(module: str, source: str, message: str) -> None:
    found = violations({module: imports_of(source, module)})
    assert len(found) == 1
    assert message in found[0]


def test_the_checker_allows_imports_down_and_within_a_layer() -> None:
    graph = {
        "tempering.rl.x": imports_of(
            "from tempering.envs import Problem\nimport tempering.training", "tempering.rl.x"
        ),
        "tempering.envs.x": imports_of("from tempering_protocols import MASK_TURN", "tempering.envs.x"),
        "tempering.local.x": imports_of("from ..backend import ServiceClient", "tempering.local.x"),
    }
    assert violations(graph) == []


def test_the_checker_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
