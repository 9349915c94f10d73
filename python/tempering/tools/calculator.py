"""A calculator tool: arithmetic on numbers, evaluated from the expression's syntax tree.

Only numbers, ``+ - * / // % **`` and parentheses are allowed (no names, calls or attributes),
and exponents are bounded, so a model cannot make it run code or compute for ever.

Example::

    calculator.fn(expression="12 * (3 + 4)")    # "84"
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable

from tempering.tools._tool import Tool

__all__ = ["calculator", "evaluate_expression"]

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_MAX_EXPONENT = 100
_MAX_LENGTH = 200


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent {right:g} is too large (at most {_MAX_EXPONENT})")
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"only numbers, + - * / // % ** and parentheses are allowed, not {ast.unparse(node)!r}")


def evaluate_expression(expression: str) -> str:
    """Evaluate an arithmetic expression, for example 12 * (3 + 4).

    Args:
        expression: numbers combined with + - * / // % ** and parentheses
    """
    if len(expression) > _MAX_LENGTH:
        raise ValueError(f"expression is {len(expression)} characters long; at most {_MAX_LENGTH}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    value = _eval(tree)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:.6g}" if isinstance(value, float) else str(value)


calculator = Tool.from_function(evaluate_expression, name="calculator", timeout_s=5.0)
"""The calculator as a tool named ``calculator``."""
