"""Server paths kept out of what ``tempering serve`` tells a client.

An error from the local engine names files as a local user needs them (``no checkpoint at ...
(looked in /home/me/.cache/tempering/checkpoints/run-1/weights/x)``); a client of the server is
told about its own ``tinker://`` paths instead, never where the server keeps its data.
:class:`PathScrubber` rewrites a message bound for a client: where the store "looked in" for a
missing checkpoint is dropped; a checkpoint directory (or a file in one) becomes its
``tinker://`` path; any other path under the data directory, the server's ``$TEMPERING_HOME``,
its temporary directory or the home directory becomes ``<data dir>/...``, ``<tempering
home>/...``, ``<temp dir>/...`` or ``<home>/...``; the local store's ``tempering://`` paths are
the client's ``tinker://`` ones. The server's own log keeps the full paths.

Example::

    scrub = PathScrubber(Path("/srv/data"))
    scrub("no file /srv/data/checkpoints/run-1/weights/x/meta.json")
    # 'no file tinker://run-1/weights/x/meta.json'
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from tempering.local.checkpoints import SCHEME

__all__ = ["PathScrubber"]

_PART = r"[^/\s'\"()]+"
"""One path component as it appears inside a message (quotes and brackets end it)."""

_LOOKED_IN = re.compile(r" \(looked in /[^)]*\)")
"""The local store's ``(looked in DIRECTORY)`` after a missing checkpoint's path: dropped."""


class PathScrubber:
    """Rewrites server paths in a message (module docstring); ``__call__`` is the rewrite."""

    def __init__(self, data_dir: Path, *, home: Path | None = None) -> None:
        named: list[tuple[Path, str]] = [(data_dir, "<data dir>")]
        if home is not None:
            named.append((home, "<tempering home>"))
        named += [(Path(tempfile.gettempdir()), "<temp dir>"), (Path.home(), "<home>")]
        roots: dict[str, str] = {}
        for path, label in named:
            for form in (path.expanduser(), path.expanduser().resolve()):
                text = str(form).rstrip("/")
                if text and text not in roots:
                    roots[text] = label
        # the longest root first, so that the data dir wins over a temp or home dir holding it
        ordered = sorted(roots, key=len, reverse=True)
        self._checkpoints = [
            re.compile(re.escape(root) + rf"/checkpoints/({_PART})/({_PART})/({_PART})")
            for root in ordered
            if roots[root] in ("<data dir>", "<tempering home>")
        ]
        self._roots = [(re.compile(re.escape(root) + r"(?![\w-])"), roots[root]) for root in ordered]

    def __call__(self, message: str) -> str:
        message = _LOOKED_IN.sub("", message)
        for pattern in self._checkpoints:
            message = pattern.sub(lambda m: f"tinker://{m[1]}/{m[2]}/{m[3]}", message)
        for pattern, label in self._roots:
            message = pattern.sub(label, message)
        return message.replace(SCHEME, "tinker://")
