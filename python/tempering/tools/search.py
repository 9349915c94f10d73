"""A search tool over a local corpus, ranked with BM25 (the ``bm25s`` package: ``pip install
'tempering[tools]'``).

Example::

    index = BM25Search(["Paris is the capital of France.", "The Nile is long."], top_k=1)
    index.search("capital of France")           # "[1] Paris is the capital of France."
    tool = index.as_tool()                      # a Tool named "search"
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tempering.tools._tool import Tool

__all__ = ["BM25Search", "load_corpus"]


def load_corpus(path: str | Path) -> list[str]:
    """The ``"text"`` of every row of a JSONL file (``{"text": ...}`` per line)."""
    texts: list[str] = []
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            row: Any = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f"{path}:{number}: each row must be an object with a string 'text'")
            texts.append(str(row["text"]))
    if not texts:
        raise ValueError(f"{path}: the corpus is empty")
    return texts


class BM25Search:
    """BM25 over ``documents`` (English stopwords removed); :meth:`search` returns the
    ``top_k`` best documents with a positive score, numbered, one per line."""

    def __init__(self, documents: Sequence[str], *, top_k: int = 2) -> None:
        try:
            import bm25s
        except ImportError:
            raise ImportError("BM25Search needs the bm25s package: pip install 'tempering[tools]'") from None
        if not documents:
            raise ValueError("BM25Search: no documents to index")
        if top_k < 1:
            raise ValueError(f"BM25Search: top_k must be >= 1, got {top_k}")
        self.documents = list(documents)
        self.top_k = top_k
        self._bm25s: Any = bm25s
        self._index: Any = bm25s.BM25()
        self._index.index(
            bm25s.tokenize(self.documents, stopwords="en", show_progress=False), show_progress=False
        )

    def search(self, query: str) -> str:
        """Search the corpus for documents that match a query.

        Args:
            query: the words to search for
        """
        tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not any(len(ids) for ids in tokens.ids):
            return "No results (the query has no searchable words)."
        k = min(self.top_k, len(self.documents))
        ids, scores = self._index.retrieve(tokens, k=k, show_progress=False)
        hits = [
            f"[{rank}] {self.documents[int(i)]}"
            for rank, (i, s) in enumerate(zip(ids[0], scores[0], strict=True), 1)
            if float(s) > 0
        ]
        return "\n".join(hits) if hits else "No results."

    def as_tool(self, *, name: str = "search", timeout_s: float | None = 10.0) -> Tool:
        """This index's :meth:`search` as a tool."""
        return Tool.from_function(self.search, name=name, timeout_s=timeout_s)
