"""A sampling client for an evaluation, from any backend: the local engine, ``tempering serve``
or the hosted service.

:class:`ModelSource` says which model (a base model: ``tempering/tiny``, a local model
directory, a hosted model name; or saved sampler weights: ``tempering://…`` / ``tinker://…``)
and where it runs (``base_url``: a ``tempering serve`` or other Tinker-compatible server; else
the hosted service when ``TINKER_API_KEY`` is set; else the local engine, in-process).
:meth:`ModelSource.open` is an async context manager that yields the sampling client and
closes the service client after.

Example::

    source = ModelSource(base_model="tempering/tiny", base_url="http://127.0.0.1:8000", api_key=key)
    async with source.open() as sampling_client:
        await evaluator(sampling_client)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncGenerator

import attrs

from tempering.backend import ServiceClient, ending_session, service_client
from tempering.backends import selected_backend
from tempering.model_info import resolve_renderer_name
from tempering_protocols import SamplingClient

__all__ = ["ModelSource"]


@attrs.frozen(kw_only=True, slots=False)  # not slotted: it is a mixin of tempering eval's config
class ModelSource:
    """The model to evaluate and the backend that runs it (see the module docstring).

    ``base_model`` also picks the tokenizer and the default renderer (``renderer_name``
    overrides it); with ``model_path`` it must name the checkpoint's base model. ``api_key``:
    the server's key (default ``$TINKER_API_KEY``).
    """

    base_model: str = "tempering/tiny"
    """Base model: tempering/tiny, a local model directory, or a hosted model name."""
    model_path: str | None = None
    """Saved sampler weights (tempering://... or tinker://...) instead of the base model."""
    base_url: str | None = None
    """A tempering serve (or Tinker-compatible) server; default: hosted with TINKER_API_KEY, else local."""
    api_key: str | None = None
    """The server's API key (default $TINKER_API_KEY)."""
    renderer_name: str | None = None
    """Chat format (default: the one recommended for base_model)."""

    def renderer(self) -> str:
        """The renderer name in effect."""
        return resolve_renderer_name(self.base_model, self.renderer_name)

    def backend(self) -> str:
        """``serve <url>``, ``hosted`` or ``local`` (for reports)."""
        if self.base_url is not None:
            return f"server {self.base_url}"
        return selected_backend().name

    def service(self) -> ServiceClient:
        """A new service client for this source's backend."""
        if self.base_url is None:
            return service_client()
        import tinker

        api_key = self.api_key if self.api_key is not None else os.environ.get("TINKER_API_KEY")
        if not api_key:
            raise ValueError(
                f"base_url {self.base_url} given without an API key: pass api_key (--api-key) or set "
                "TINKER_API_KEY to the key the server prints at start"
            )
        return tinker.ServiceClient(base_url=self.base_url, api_key=api_key)

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncGenerator[SamplingClient]:
        """The sampling client of this model; the service client is closed on exit."""
        with ending_session(self.service()) as service:
            if self.model_path is not None:
                yield await service.create_sampling_client(model_path=self.model_path)
            else:
                yield await service.create_sampling_client(base_model=self.base_model)
