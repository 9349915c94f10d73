"""Static proof that the official SDK clients satisfy tempering's backend protocols.

Not a pytest module: basedpyright (strict) checks this file as part of ``make test``; an SDK
change that breaks the protocols fails type-checking here. ``test_sdk_conformance.py`` checks
the same at run time.
"""

import tinker

from tempering_protocols import Future, SamplingClient, TrainingClient


def training_client_is_protocol(client: tinker.TrainingClient) -> TrainingClient:
    return client


def sampling_client_is_protocol(client: tinker.SamplingClient) -> SamplingClient:
    return client


def api_future_is_protocol(future: tinker.APIFuture[int]) -> Future[int]:
    return future
