"""The local engine: Tinker-compatible training and sampling on PyTorch, in-process.

With no ``TINKER_API_KEY``, ``tempering.service_client()`` returns :class:`ServiceClient` from
here; its training and sampling clients satisfy ``tempering_protocols.TrainingClient`` and
``SamplingClient`` with the official ``tinker`` types, so the same trainer code runs here and on
the hosted service.

Needs the ``local`` extra (torch, transformers, peft): ``pip install 'tempering[local]'``.

Example::

    import tinker
    from tempering.local import ServiceClient

    service = ServiceClient()
    trainer = service.create_lora_training_client("tempering/tiny", rank=8).result()
    tok = trainer.get_tokenizer()
    ids = tok.encode("hello world")
    datum = tinker.Datum(
        model_input=tinker.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )
    trainer.forward_backward([datum], "cross_entropy")
    trainer.optim_step(tinker.AdamParams(learning_rate=1e-3)).result()
    sampler = trainer.save_weights_and_get_sampling_client()
    params = tinker.SamplingParams(max_tokens=8, temperature=1.0, seed=0)
    out = sampler.sample(tinker.ModelInput.from_ints(ids[:3]), 4, params).result()
"""

from tempering.local.checkpoints import SCHEME, CheckpointStore, default_root
from tempering.local.errors import (
    CheckpointNotFoundError,
    DatumError,
    IncompatibleCheckpointError,
    LocalEngineError,
    LossConfigError,
    ModelLoadError,
    UnknownLossError,
)
from tempering.local.futures import LocalFuture
from tempering.local.losses import BUILTIN_LOSSES
from tempering.local.sampling import LocalSamplingClient
from tempering.local.service import ServiceClient
from tempering.local.tiny import TINY_MODEL, build_tiny_model
from tempering.local.training import LocalTrainingClient

__all__ = [
    "BUILTIN_LOSSES",
    "SCHEME",
    "TINY_MODEL",
    "CheckpointNotFoundError",
    "CheckpointStore",
    "DatumError",
    "IncompatibleCheckpointError",
    "LocalEngineError",
    "LocalFuture",
    "LocalSamplingClient",
    "LocalTrainingClient",
    "LossConfigError",
    "ModelLoadError",
    "ServiceClient",
    "UnknownLossError",
    "build_tiny_model",
    "default_root",
]
