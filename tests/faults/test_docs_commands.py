"""Every ``tempering …`` command in the docs runs as written, at tiny budgets (issue 15, bug 11).

The convention: every line inside a fenced code block of ``docs/**/*.md`` that starts with
``tempering `` is run (a line ending in ``\\`` continues on the next), unless the line right
before the block's opening fence is ``<!-- docs-test: skip REASON -->``. Commands run in this
process through ``tempering.cli.main`` with ``TEMPERING_DOCS_TEST=1``, which caps steps, batch,
group and eval sizes wherever the config holds them (``tempering.cli._budgets``), so the flags
stay exactly as written. They run in order, in one shared temporary working directory (``runs/…``
paths land there, and a later command can use an earlier one's output), with ``HOME`` there too
(``~/models/tiny``) and one ``TEMPERING_HOME``. A failure names the doc file, line and command.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from tempering.cli import main

DOCS = Path(__file__).resolve().parents[2] / "docs"
SKIP = re.compile(r"^<!--\s*docs-test:\s*skip\s+(?P<reason>.+?)\s*-->$")
FENCE = re.compile(r"^\s*(```|~~~)")
SHELL_SYNTAX = frozenset({"&", "&&", "|", "||", ";", "<", ">", ">>", "2>", "(", ")"})


def doc_commands(docs: Path = DOCS) -> Iterator[tuple[str, int, str, str | None]]:
    """(doc path relative to the repo, line number, command, skip reason or ``None``) for every
    ``tempering …`` line inside a fenced code block, in file and line order."""
    for path in sorted(docs.rglob("*.md")):
        rel = path.relative_to(docs.parent).as_posix()
        lines = path.read_text(encoding="utf-8").splitlines()
        fence: str | None = None
        skip: str | None = None
        i = 0
        while i < len(lines):
            line = lines[i]
            match = FENCE.match(line)
            if fence is None and match:
                fence = match.group(1)
                before = lines[i - 1].strip() if i > 0 else ""
                found = SKIP.match(before)
                skip = found.group("reason") if found else None
            elif fence is not None and match and line.strip().startswith(fence):
                fence = None
            elif fence is not None and line.strip().startswith("tempering "):
                start = i
                command = line.strip()
                while command.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    command = command[:-1].rstrip() + " " + lines[i].strip()
                yield rel, start + 1, command, skip
            i += 1


def _params() -> list[object]:
    out: list[object] = []
    for rel, lineno, command, skip in doc_commands():
        marks = [pytest.mark.skip(reason=f"docs-test: skip {skip}")] if skip is not None else []
        out.append(pytest.param(rel, lineno, command, marks=marks, id=f"{rel}:{lineno}"))
    return out


def _argv(where: str, command: str, home: Path) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    bad = [t for t in tokens if t in SHELL_SYNTAX or "$" in t or "*" in t]
    if bad:
        pytest.fail(
            f"{where}: `{command}` uses shell syntax ({' '.join(bad)}) that the docs test does not run; "
            "write the command without it, or put `<!-- docs-test: skip REASON -->` on the line "
            "before its code fence"
        )
    assert tokens[0] == "tempering"
    return [str(home) + t[1:] if t == "~" or t.startswith("~/") else t for t in tokens[1:]]


@pytest.fixture(scope="module")
def shared_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the working directory and ``HOME`` shared by every command, the ``TEMPERING_HOME``)."""
    return tmp_path_factory.mktemp("docs-cwd"), tmp_path_factory.mktemp("docs-home")


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("doc", "lineno", "command"), _params())
def test_doc_command_runs(
    doc: str,
    lineno: int,
    command: str,
    shared_dirs: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cwd, home = shared_dirs
    where = f"{doc}:{lineno}"
    argv = _argv(where, command, cwd)
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(cwd))
    monkeypatch.setenv("TEMPERING_HOME", str(home))
    monkeypatch.setenv("TEMPERING_DOCS_TEST", "1")
    monkeypatch.setenv("TEMPERING_NUM_THREADS", "1")
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    repo = DOCS.parent
    before = {p for p in repo.iterdir()}
    try:
        rc = main(argv)
    except SystemExit as exc:  # --help, or a refusal while parsing flags
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:
        pytest.fail(f"{where}: `{command}` raised {type(exc).__name__}: {exc}")
    out = capsys.readouterr()
    assert rc == 0, f"{where}: `{command}` exited {rc}:\n{out.err[-2000:]}"
    assert {p for p in repo.iterdir()} == before, f"{where}: `{command}` wrote into the repository"


def test_the_parser_follows_the_convention(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "sub" / "a.md").write_text(
        "text\n```bash\ntempering sft --x 1   # note\n  not a command\n"
        "tempering recipe dpo \\\n  --out runs/d\n```\n"
        "<!-- docs-test: skip needs a key -->\n```\ntempering rl --hosted\n```\n"
        "tempering outside a fence\n",
        encoding="utf-8",
    )
    assert list(doc_commands(docs)) == [
        ("docs/sub/a.md", 3, "tempering sft --x 1   # note", None),
        ("docs/sub/a.md", 5, "tempering recipe dpo --out runs/d", None),
        ("docs/sub/a.md", 10, "tempering rl --hosted", "needs a key"),
    ]
    assert _argv("x", "tempering sft --x 1   # note", tmp_path) == ["sft", "--x", "1"]
    assert _argv("x", "tempering tiny-model ~/m", tmp_path) == ["tiny-model", f"{tmp_path}/m"]
    with pytest.raises(pytest.fail.Exception, match=r"x: `tempering serve &` uses shell syntax \(&\)"):
        _argv("x", "tempering serve &", tmp_path)


def test_docs_hold_commands() -> None:
    commands = list(doc_commands())
    assert len(commands) > 10
    assert ("docs/rl.md", 8) in {(doc, line) for doc, line, _, _ in commands}
    assert os.path.isdir(DOCS)
