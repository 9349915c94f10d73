"""The local engine (:mod:`tempering.local`) as a backend: in-process, offline, the default when
no other backend is selected. Importing this module imports neither torch nor the engine; the
engine is imported when a client is made, a checkpoint removed or a model of its own tokenized.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tempering.backends.base import Backend, Capabilities, ServiceClient
from tempering.model_info import TINY_MODEL, packaged_model
from tempering_protocols import Tokenizer

__all__ = ["LOCAL", "LocalBackend", "names_gguf"]


class LocalBackend(Backend):
    """The in-process PyTorch engine: full fine-tuning, custom losses in one forward pass,
    ``tempering://`` checkpoints in ``$TEMPERING_HOME`` that the trainer deletes itself, and the
    built-in tiny model."""

    name = "local"
    title = "the local engine"
    capabilities = Capabilities(
        full_training=True,
        custom_loss=True,
        custom_loss_passes=1,
        topk_logprobs=True,
        checkpoint_ttl=False,
        checkpoint_schemes=("tempering://",),
        trainer_deletes_checkpoints=True,
        session_close="plain",
        builtin_models=frozenset({TINY_MODEL}),
        tokenizer_source=(
            "built in for tempering/tiny; the model cache's copy for a packaged model or a .gguf "
            "file; else Hugging Face, by the model's name or directory"
        ),
        extra="local",
    )
    selected_because = "TINKER_API_KEY is not set (local engine)"
    how_to_select = "unset TINKER_API_KEY to run locally"
    model_hint = "e.g. --base-model tempering/tiny, a model directory or a .gguf file (docs/models.md)"

    def selected(self) -> bool:
        return True  # the fallback: listed last in BACKENDS

    def connect(self) -> ServiceClient:
        try:
            from tempering.local import ServiceClient as LocalServiceClient
        except ImportError as exc:
            raise ImportError(
                "TINKER_API_KEY is not set, and the local engine needs torch, transformers and peft: "
                "pip install 'tempering[local]' (or set TINKER_API_KEY to use the hosted service)"
            ) from exc
        return LocalServiceClient()

    def owns(self, client: object, /) -> bool:
        if "tempering.local" not in sys.modules:  # no local client exists before the engine loads
            return False
        from tempering.local import LocalSamplingClient, LocalTrainingClient
        from tempering.local import ServiceClient as LocalServiceClient

        return isinstance(client, (LocalServiceClient, LocalTrainingClient, LocalSamplingClient))

    def remove_checkpoint(self, path: str, client: object | None, /) -> None:
        """Delete ``path`` (a ``tempering://`` path or a checkpoint directory) from the store of
        ``client`` when it is a local training client, else from ``$TEMPERING_HOME``'s."""
        from tempering.local.checkpoints import CheckpointStore
        from tempering.local.inventory import remove_checkpoint

        store = getattr(client, "checkpoint_store", None)
        remove_checkpoint(store if isinstance(store, CheckpointStore) else CheckpointStore(), path)

    def tokenizer(self, base_model: str, /) -> Tokenizer | None:
        """The built-in tokenizer of ``tempering/tiny``; the model cache's copy for a model it
        provides (a packaged model such as ``HuggingFaceTB/SmolLM2-135M-Instruct``, pulled on
        first use, or a ``.gguf`` file: :func:`tempering.local.model.resolve_model_dir`'s
        resolution); ``None`` for any other model."""
        if base_model == TINY_MODEL:
            from tempering.local.tiny import build_tiny_tokenizer

            return build_tiny_tokenizer()
        if packaged_model(base_model) is None and not names_gguf(base_model):
            return None
        from transformers import AutoTokenizer

        from tempering.local.checkpoints import default_root
        from tempering.local.model_cache import resolve_cached

        found = resolve_cached(base_model, default_root())
        tokenizer: Tokenizer = AutoTokenizer.from_pretrained(str(found) if found is not None else base_model)
        return tokenizer


def names_gguf(base_model: str) -> bool:
    """Whether ``base_model`` is a ``.gguf`` file or a directory holding one (and no config.json)."""
    path = Path(base_model).expanduser()
    if path.suffix == ".gguf":
        return path.is_file()
    return path.is_dir() and not (path / "config.json").is_file() and any(path.glob("*.gguf"))


LOCAL = LocalBackend()
