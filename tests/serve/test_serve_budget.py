"""``tempering serve`` under a micro-batch token budget (``TEMPERING_MAX_BATCH_TOKENS``): a
request larger than one micro-batch is split and trains, a datum longer than the budget is
refused with a named user error saying how large it is and what the limit is, and the server
goes on serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tinker

from tempering.serve.testing import ServerProcess

pytestmark = pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")  # the SDK's leak (conftest)

BUDGET = 64


@pytest.fixture(scope="module")
def server(serve_root: Path, tiny_dir: Path) -> Iterator[ServerProcess]:
    """This module's server, started with the token budget in its environment."""
    del tiny_dir
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TEMPERING_MAX_BATCH_TOKENS", str(BUDGET))
        process = ServerProcess(serve_root / "data", serve_root / "home")
        process.start()
    try:
        yield process
    finally:
        process.stop()


def _datum(rng: np.random.Generator, n: int) -> tinker.Datum:
    tokens = [int(t) for t in rng.integers(0, 256, size=n + 1)]
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * n},
    )


def test_a_request_over_the_budget_is_split_and_a_too_long_datum_refused(
    service: tinker.ServiceClient, tiny_dir: Path
) -> None:
    client = service.create_lora_training_client(str(tiny_dir), rank=4).result(timeout=60)
    rng = np.random.default_rng(0)
    data = [_datum(rng, n) for n in (20, 31, 9, 27, 14, 30)]  # 6 x 31 padded: several micro-batches
    out = client.forward_backward(data, "cross_entropy").result(timeout=120)
    assert [len(o["logprobs"].tolist()) for o in out.loss_fn_outputs] == [20, 31, 9, 27, 14, 30]
    assert np.isfinite(out.metrics["loss:sum"])
    with pytest.raises(
        tinker.RequestFailedError, match=rf"datum 1 has 100 tokens, more than the {BUDGET}"
    ) as info:
        client.forward([data[0], _datum(rng, 100)], "cross_entropy").result(timeout=60)
    assert info.value.category == tinker.types.RequestErrorCategory.User
    assert "TEMPERING_MAX_BATCH_TOKENS" in str(info.value)
    # The server goes on serving: the same request again, and an optimizer step.
    again = client.forward(data, "cross_entropy").result(timeout=120)
    np.testing.assert_allclose(
        [o["logprobs"].tolist()[0] for o in again.loss_fn_outputs],
        [o["logprobs"].tolist()[0] for o in out.loss_fn_outputs],
        rtol=1e-6,
    )
    client.optim_step(tinker.AdamParams(learning_rate=1e-3)).result(timeout=60)
