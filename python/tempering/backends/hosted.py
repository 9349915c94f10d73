"""The hosted Tinker service through the official SDK (``tinker.ServiceClient``): selected when
``TINKER_API_KEY`` is set; ``TINKER_BASE_URL`` points the same SDK at another server, such as
``tempering serve``. Importing this module does not import ``tinker``.
"""

from __future__ import annotations

import os
import sys

from tempering.backends.base import Backend, Capabilities, ServiceClient

__all__ = ["HOSTED", "HostedBackend"]


class HostedBackend(Backend):
    """The Tinker SDK's service. Its checkpoints are ``tinker://`` paths that the trainer leaves
    to the service's expiry; a session is finished on the server with how the run ended."""

    name = "hosted"
    title = "the hosted Tinker service"
    capabilities = Capabilities(  # the defaults otherwise: LoRA only, custom losses in 2 passes, top-K
        checkpoint_ttl=True,
        checkpoint_schemes=("tinker://",),
        session_close="status",
        tokenizer_source="Hugging Face, by the model's name",
    )
    selected_because = "TINKER_API_KEY is set (hosted service)"
    how_to_select = "set TINKER_API_KEY to train on the hosted Tinker service"
    model_hint = (
        "e.g. --base-model Qwen/Qwen3-4B-Instruct-2507 --renderer-name qwen3_disable_thinking "
        "(docs/recipes/hosted.md)"
    )

    def selected(self) -> bool:
        return bool(os.environ.get("TINKER_API_KEY"))

    def connect(self) -> ServiceClient:
        import tinker

        return tinker.ServiceClient()

    def owns(self, client: object, /) -> bool:
        tinker = sys.modules.get("tinker")  # a tinker client exists only once tinker is imported
        if tinker is None:
            return False
        return isinstance(client, (tinker.ServiceClient, tinker.TrainingClient, tinker.SamplingClient))


HOSTED = HostedBackend()
