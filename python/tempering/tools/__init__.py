"""Tools a model can call, in the renderers-and-data layer (envs import them).

=============================  ==============================================================
what                           where
=============================  ==============================================================
a tool from a typed function   :func:`tool` / :meth:`Tool.from_function` (schema from the
                               signature and docstring: :func:`function_schema`)
running one parsed call        :func:`run_tool_call` → :class:`ToolOutcome` (errors, timeouts,
                               non-text results and oversize results handled, never raised)
declaring tools to a model     :func:`tool_prefix` (the renderer's own format, else a plain one)
a calculator                   :data:`tempering.tools.calculator.calculator`
BM25 search over a corpus      :class:`tempering.tools.search.BM25Search` (``bm25s``: the
                               ``tools`` extra)
=============================  ==============================================================

The env that runs tools in a loop is :class:`tempering.envs.tool_use.ToolEnv`; see
docs/tools.md.

Example::

    from tempering.tools import tool, tool_prefix

    @tool(timeout_s=2.0)
    def lookup(word: str) -> str:
        '''Look a word up.

        Args:
            word: the word
        '''
        return DICTIONARY.get(word, "not found")
"""

from tempering.tools._declare import plain_tool_declaration, tool_prefix
from tempering.tools._schema import check_arguments, function_schema
from tempering.tools._tool import Tool, ToolOutcome, ToolStatus, run_tool_call, tool

__all__ = [
    "Tool",
    "ToolOutcome",
    "ToolStatus",
    "check_arguments",
    "function_schema",
    "plain_tool_declaration",
    "run_tool_call",
    "tool",
    "tool_prefix",
]
