"""What a backend is: its :class:`Capabilities` (what it supports, as data) and its
:class:`Backend` (how it is chosen, connected, closed, and how its checkpoints and tokenizers
are found). The trainers and recipes ask these instead of checking which service they talk to.

Example::

    class EchoBackend(Backend):
        name = "echo"
        title = "the echo service"
        capabilities = Capabilities(checkpoint_schemes=("echo://",), trainer_deletes_checkpoints=True)

        def connect(self) -> ServiceClient:
            return EchoService()
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import attrs

from tempering_protocols import Future, SamplingClient, Tokenizer, TrainingClient

__all__ = ["Backend", "Capabilities", "CapabilityError", "ServiceClient", "SessionStatus"]

SessionStatus = Literal["success", "errored", "interrupted"]
"""How a run ended, as the hosted service records it when a session is finished."""


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


CapabilityName = Literal["full_training", "custom_loss", "topk_logprobs", "checkpoint_ttl"]
"""The yes-or-no capabilities :func:`tempering.backends.require` checks."""


@attrs.frozen(kw_only=True)
class Capabilities:
    """What a backend supports. Everything a trainer or recipe would otherwise learn by asking
    which service it talks to is here.

    =============================  =================================================================
    field                          meaning
    =============================  =================================================================
    ``full_training``              ``create_full_training_client``: ``lora_rank=0`` trains every
                                   parameter
    ``custom_loss``                ``forward_backward_custom``: a loss computed from the logprobs
                                   by the caller's function (DPO, a custom RL loss)
    ``custom_loss_passes``         forward passes ``forward_backward_custom`` costs (1: the loss
                                   runs beside the model; 2: the service runs a forward, the
                                   client computes the loss, the service runs forward-backward)
    ``topk_logprobs``              ``topk_prompt_logprobs`` / ``topk_sample_logprobs`` in sampling
                                   (top-K distillation)
    ``checkpoint_ttl``             a checkpoint saved with ``ttl_seconds`` expires
    ``checkpoint_schemes``         the prefixes of the paths its saves hand out
    ``trainer_deletes_checkpoints``  ``RunConfig.keep_last`` deletes old checkpoints from the
                                   trainer (else they are left for the service's expiry, with a
                                   warning, and ``tempering checkpoints rm`` deletes them)
    ``session_close``              ``"status"``: closing finishes the session on the server with
                                   how the run ended (and waits for it); ``"plain"``: ``close()``
                                   releases the client's own threads
    ``builtin_models``             models only this backend serves (``tempering/tiny``)
    ``tokenizer_source``           where a model's tokenizer comes from, in words
    ``extra``                      the ``pip install 'tempering[EXTRA]'`` it needs, if any
    =============================  =================================================================
    """

    full_training: bool = False
    custom_loss: bool = True
    custom_loss_passes: int = 2
    topk_logprobs: bool = True
    checkpoint_ttl: bool = False
    checkpoint_schemes: tuple[str, ...] = ()
    trainer_deletes_checkpoints: bool = False
    session_close: Literal["status", "plain"] = "plain"
    builtin_models: frozenset[str] = frozenset()
    tokenizer_source: str = "Hugging Face, by the model's name or directory"
    extra: str | None = None

    def __attrs_post_init__(self) -> None:
        bad = [s for s in self.checkpoint_schemes if not s.endswith("://")]
        if bad:
            raise ValueError(
                f"Capabilities.checkpoint_schemes: {bad} must each end in '://' (e.g. 'tinker://')"
            )
        if self.custom_loss_passes not in (1, 2):
            raise ValueError(f"Capabilities.custom_loss_passes must be 1 or 2, got {self.custom_loss_passes}")

    def owns_path(self, path: str) -> bool:
        """Whether ``path`` is one of this backend's checkpoint paths (by its scheme)."""
        return path.startswith(self.checkpoint_schemes)


class CapabilityError(ValueError):
    """What a run asked of its backend that the backend does not support (the message names
    the capability, the backend and what to do instead)."""


class Backend:
    """One backend: a subclass sets :attr:`name`, :attr:`title` and :attr:`capabilities` and
    implements :meth:`connect`; the other methods have defaults that fit a backend whose clients
    need nothing special. A client (service, training or sampling) that has a
    ``tempering_backend`` attribute holding its :class:`Backend` is recognised by every trainer
    without any other change (:func:`tempering.backends.backend_of`); listing the backend in
    :data:`tempering.backends.BACKENDS` also lets :func:`tempering.service_client` choose it.
    """

    name: str = ""
    """Short name, as reports print it: ``hosted``, ``local``."""
    title: str = ""
    """What it is, in words: ``the hosted Tinker service``."""
    capabilities: Capabilities = Capabilities()
    selected_because: str = ""
    """Why the environment selects it, for messages: ``TINKER_API_KEY is set (hosted service)``."""
    how_to_select: str = ""
    """How a user selects it, for messages: ``unset TINKER_API_KEY to run locally``."""
    model_hint: str = ""
    """How to name a model it serves, for messages."""

    def selected(self) -> bool:
        """Whether the environment selects this backend (the first of
        :data:`tempering.backends.BACKENDS` that says so is used)."""
        return False

    def connect(self) -> ServiceClient:
        """A new service client of this backend."""
        raise NotImplementedError(f"{type(self).__name__}.connect: a backend must say how to connect")

    def owns(self, client: object, /) -> bool:
        """Whether ``client`` (a service, training or sampling client) belongs to this backend,
        for clients that carry no ``tempering_backend`` attribute."""
        del client
        return False

    def close(self, service: object, status: SessionStatus, /) -> None:
        """End ``service``'s session (:attr:`Capabilities.session_close`): ``"status"`` calls
        ``close(status)`` and waits up to 60 s; ``"plain"`` calls ``close()`` if there is one."""
        if not callable(getattr(service, "close", None)):
            return
        closing: Any = service
        if self.capabilities.session_close == "status":
            closing.close(status).result(timeout=60)
        else:
            closing.close()

    def remove_checkpoint(self, path: str, client: object | None, /) -> None:
        """Delete the checkpoint at ``path`` (one of :attr:`Capabilities.checkpoint_schemes`),
        for ``RunConfig.keep_last``; ``client`` is the training client that saved it, if known.
        Called only when :attr:`Capabilities.trainer_deletes_checkpoints`."""
        del client
        raise NotImplementedError(
            f"{self.title or type(self).__name__} declares trainer_deletes_checkpoints but does not "
            f"implement remove_checkpoint (asked to remove {path})"
        )

    def tokenizer(self, base_model: str, /) -> Tokenizer | None:
        """``base_model``'s tokenizer when this backend provides it (a model of its own, such as
        the built-in tiny model), else ``None`` (Hugging Face's is used)."""
        del base_model
        return None
