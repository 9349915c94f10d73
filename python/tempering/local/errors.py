"""The local engine's exceptions.

Each subclasses the standard exception a Python user would expect (``ValueError`` for bad
input, ``FileNotFoundError`` for an unknown checkpoint), so ``except ValueError`` keeps working.
Errors of a request are raised through its future; a request that fails changes no state.
"""

from __future__ import annotations

__all__ = [
    "CheckpointExistsError",
    "CheckpointNotFoundError",
    "ChecksumMismatchError",
    "CorruptModelError",
    "DatumError",
    "IncompatibleCheckpointError",
    "LocalEngineError",
    "LossConfigError",
    "ModelCacheError",
    "ModelLoadError",
    "ModelNotAvailableError",
    "RegistryUnreachableError",
    "UnknownLossError",
    "UnsupportedGGUFError",
]


class LocalEngineError(Exception):
    """Base class of every error the local engine raises on purpose."""


class DatumError(LocalEngineError, ValueError):
    """A datum whose inputs don't fit its loss; names the datum's index and the field.

    Example::

        try:
            client.forward_backward(data, "cross_entropy").result()
        except DatumError as e:
            print(e.index, e.field)  # 3 'weights'
    """

    def __init__(self, index: int, field: str, problem: str) -> None:
        self.index = index
        self.field = field
        self.problem = problem
        super().__init__(f"datum {index}, field {field!r}: {problem}")

    def __reduce__(self) -> tuple[type[DatumError], tuple[int, str, str]]:
        return (type(self), (self.index, self.field, self.problem))


class UnknownLossError(LocalEngineError, ValueError):
    """A loss name the local engine does not implement."""


class LossConfigError(LocalEngineError, ValueError):
    """A ``loss_fn_config`` key the loss does not take, or a value of the wrong type."""


class CheckpointNotFoundError(LocalEngineError, FileNotFoundError):
    """A checkpoint path that names nothing in the checkpoint store."""


class CheckpointExistsError(LocalEngineError, FileExistsError):
    """A save to a checkpoint name that is taken, without ``overwrite=True``."""


class IncompatibleCheckpointError(LocalEngineError, ValueError):
    """A checkpoint that exists but cannot be loaded here (other base model, LoRA shape, kind)."""


class ModelLoadError(LocalEngineError, ValueError):
    """A base model name or directory that doesn't load as a causal language model."""


class ModelCacheError(ModelLoadError):
    """A model the cache (``$TEMPERING_HOME/models``) cannot provide; the message says what to do."""


class CorruptModelError(ModelCacheError):
    """A truncated or corrupted GGUF file, wheel or cached model directory (re-pull it)."""


class ChecksumMismatchError(ModelCacheError):
    """A file whose sha256 is not the one tempering expects for it."""


class UnsupportedGGUFError(ModelCacheError):
    """A GGUF file of an architecture or quantization type transformers cannot dequantize."""


class RegistryUnreachableError(ModelCacheError):
    """A pull that could not reach the package registry (place the file by hand: ``--from``)."""


class ModelNotAvailableError(ModelCacheError):
    """A base model name that is neither here nor reachable."""
