"""Sizes and ages as ``tempering checkpoints`` prints and reads them."""

from __future__ import annotations

import re

__all__ = ["age_s", "size_text"]

_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def size_text(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def age_s(text: str) -> float:
    m = _AGE.fullmatch(text.strip())
    if m is None:
        raise SystemExit(
            f"tempering checkpoints prune: --older-than {text!r}: use a number and s, m, h, d or w (7d)"
        )
    return float(m.group(1)) * _AGE_UNITS[m.group(2)]
