"""Static proof that the local engine's clients satisfy tempering's backend protocols.

Not a test module: basedpyright (strict) checks this file (it is listed in pyproject.toml's
``[tool.basedpyright] include``); a change that breaks a protocol fails type-checking here.
It lives in the tests so that the local engine never imports ``tempering.backend`` (which
imports the engine): ``tests/test_layering.py`` refuses that package cycle.
"""

import tinker

from tempering.backend import ServiceClient
from tempering.local.futures import LocalFuture
from tempering.local.sampling import LocalSamplingClient
from tempering.local.service import ServiceClient as LocalServiceClient
from tempering.local.training import LocalTrainingClient
from tempering_protocols import Future, SamplingClient, Tokenizer, TrainingClient


def training_client_is_protocol(client: LocalTrainingClient) -> TrainingClient:
    return client


def sampling_client_is_protocol(client: LocalSamplingClient) -> SamplingClient:
    return client


def local_future_is_protocol(future: LocalFuture[int]) -> Future[int]:
    return future


def tokenizer_is_protocol(client: LocalTrainingClient) -> Tokenizer:
    return client.get_tokenizer()


def local_service_is_protocol(service: LocalServiceClient) -> ServiceClient:
    return service


def hosted_service_is_protocol(service: tinker.ServiceClient) -> ServiceClient:
    return service
