"""``tempering serve``: the local engine behind the Tinker wire protocol, so that scripts
written for the official ``tinker`` SDK train and sample on this machine, unchanged.

Start a server, then point the SDK at it::

    tempering serve --port 8000 --api-key tml-local --data-dir ~/tempering-data

    import tinker
    service = tinker.ServiceClient(base_url="http://127.0.0.1:8000", api_key="tml-local")
    trainer = service.create_lora_training_client("/path/to/model_dir", rank=8)

Needs the ``serve`` extra (starlette, uvicorn) and the ``local`` extra (torch, transformers,
peft). ``import tempering`` does not import this package. See ``docs/serve.md``.
"""

from tempering.serve.app import build_app
from tempering.serve.engine import Engine
from tempering.serve.server import generate_api_key, serve

__all__ = ["Engine", "build_app", "generate_api_key", "serve"]
