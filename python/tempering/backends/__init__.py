"""The backends and what each can do, in one place.

A backend is a :class:`Backend` with its :class:`Capabilities` (full training, custom losses,
top-K logprobs, checkpoint TTL, checkpoint schemes and who deletes them, how a session closes,
the models it alone serves, where tokenizers come from). Trainers and recipes ask the backend of
the client they hold (:func:`backend_of`), or the one the environment selects
(:func:`selected_backend`), never which service it is.

:data:`BACKENDS` lists the backends :func:`tempering.service_client` chooses from, first
selected wins: the hosted Tinker service (``TINKER_API_KEY`` set), else the local engine. A
backend of a client made elsewhere (a test double, a third-party engine) is found from the
client's ``tempering_backend`` attribute, with nothing to register.

Example::

    from tempering.backends import backend_of, require, selected_backend

    selected_backend().capabilities.full_training      # True on the local engine
    require(trainer, "topk_logprobs", "top-K distillation")   # CapabilityError if unsupported
    backend_of(service).close(service, "success")
"""

from __future__ import annotations

from collections.abc import Sequence

from tempering.backends.base import (
    Backend,
    Capabilities,
    CapabilityError,
    CapabilityName,
    ServiceClient,
    SessionStatus,
)
from tempering.backends.hosted import HOSTED
from tempering.backends.local import LOCAL

__all__ = [
    "BACKENDS",
    "Backend",
    "Capabilities",
    "CapabilityError",
    "CapabilityName",
    "ServiceClient",
    "SessionStatus",
    "backend_for_path",
    "backend_of",
    "listed_backends",
    "require",
    "selected_backend",
    "serving",
]

BACKENDS: tuple[Backend, ...] = (HOSTED, LOCAL)
"""The backends :func:`selected_backend` chooses from, in order: the first whose
``selected()`` is true. The local engine, last, is always selected."""


def listed_backends() -> tuple[Backend, ...]:
    """:data:`BACKENDS` as it is now (a test or a plugin may replace it)."""
    return BACKENDS


def selected_backend(backends: Sequence[Backend] | None = None) -> Backend:
    """The backend :func:`tempering.service_client` connects to: the first of ``backends``
    (default :data:`BACKENDS`) that the environment selects."""
    for backend in BACKENDS if backends is None else backends:
        if backend.selected():
            return backend
    raise LookupError("no backend is selected: the last of BACKENDS must be selected unconditionally")


def backend_of(client: object) -> Backend | None:
    """The backend of ``client`` (a service, training or sampling client): its
    ``tempering_backend`` attribute when it has one, else the listed backend that owns it, else
    ``None`` (a client no backend declares)."""
    declared = getattr(client, "tempering_backend", None)
    if isinstance(declared, Backend):
        return declared
    return next((b for b in BACKENDS if b.owns(client)), None)


def backend_for_path(path: str, client: object | None = None) -> Backend:
    """The backend whose checkpoint path ``path`` is: ``client``'s backend when the scheme is
    one of its own, else the listed backend with that scheme; a path with no scheme (a
    checkpoint directory) is the local engine's. Raises ``ValueError`` for a scheme no backend
    declares."""
    own = backend_of(client) if client is not None else None
    candidates = [own] if own is not None else []
    for backend in (*candidates, *BACKENDS):
        if backend.capabilities.owns_path(path):
            return backend
    if "://" not in path:
        return LOCAL
    schemes = sorted({s for b in (*candidates, *BACKENDS) for s in b.capabilities.checkpoint_schemes})
    raise ValueError(
        f"checkpoint path {path!r}: no backend declares its scheme (known: {', '.join(schemes)}); "
        "give a path a backend handed out, or a checkpoint directory"
    )


def serving(base_model: str, backends: Sequence[Backend] | None = None) -> Backend | None:
    """The listed backend that alone serves ``base_model`` (one of its
    :attr:`Capabilities.builtin_models`), if any."""
    listed = BACKENDS if backends is None else backends
    return next((b for b in listed if base_model in b.capabilities.builtin_models), None)


def require(client: object, capability: CapabilityName, purpose: str) -> None:
    """Refuse ``purpose`` on ``client``'s backend when that backend declares it lacks
    ``capability``, naming the capability, the backend and the backends that have it. A client
    no backend declares is not refused (it is tried as it is)."""
    backend = backend_of(client)
    if backend is None or getattr(backend.capabilities, capability):
        return
    able = [b.title for b in BACKENDS if getattr(b.capabilities, capability)]
    raise CapabilityError(
        f"{purpose} needs {capability.replace('_', ' ')}, which {backend.title or backend.name} does not "
        f"support (Capabilities.{capability} is False)"
        + (f"; {' and '.join(able)} support it" if able else "")
    )
