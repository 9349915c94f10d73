"""Shared-prefix forward passes (tempering.local.prefix): the plan, and equality with the plain
forward pass in logits, gradients and through the training client."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tinker
import torch
from local_helpers import random_tokens, rl_datum

from tempering.local import ServiceClient
from tempering.local.prefix import plan_prefix, shared_prefix_logits
from tempering.local.tiny import build_tiny_model


def _padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(map(len, rows))
    ids = torch.zeros((len(rows), L), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r)
        mask[b, : len(r)] = 1
    return ids, mask


def _groups(rng: np.random.Generator, groups: int, members: int) -> list[list[int]]:
    rows: list[list[int]] = []
    for g in range(groups):
        prompt = random_tokens(rng, 12 + g)
        rows += [prompt + random_tokens(rng, 1 + (j * 3) % 5) for j in range(members)]
    return rows


def test_plan_groups_consecutive_rows_by_their_shared_prefix() -> None:
    rows = _groups(np.random.default_rng(0), 3, 4)
    ids, mask = _padded(rows)
    plan = plan_prefix(ids.numpy(), mask.sum(1).numpy())
    assert plan is not None
    assert plan.length == 12  # the shortest prompt
    assert plan.group_B.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert plan.first_G.tolist() == [0, 4, 8]


def test_plan_declines_when_little_is_shared() -> None:
    rng = np.random.default_rng(1)
    rows = [random_tokens(rng, 10) for _ in range(6)]  # nothing shared
    ids, mask = _padded(rows)
    assert plan_prefix(ids.numpy(), mask.sum(1).numpy()) is None
    one = _padded([rows[0]])
    assert plan_prefix(one[0].numpy(), one[1].sum(1).numpy()) is None
    # Shared, but a datum no longer than the prefix leaves nothing to save.
    ids, mask = _padded([[5, 6, 7], [5, 6, 7], [5]])
    assert plan_prefix(ids.numpy(), mask.sum(1).numpy()) is None


def test_shared_logits_and_gradients_match_the_plain_forward(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "tiny", seed=3))
    ids, mask = _padded(_groups(np.random.default_rng(2), 3, 4))
    plan = plan_prefix(ids.numpy(), mask.sum(1).numpy())
    assert plan is not None
    weights = torch.randn((*ids.shape, model.config.vocab_size), generator=torch.Generator().manual_seed(0))
    weights = weights * mask.unsqueeze(-1)

    def run(shared: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        if shared:
            logits = shared_prefix_logits(model, ids, mask, plan)
        else:
            logits = model(input_ids=ids, attention_mask=mask).logits
        (logits * weights).sum().backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain, plain_grads = run(False)
    shared, shared_grads = run(True)
    real = mask.bool()
    torch.testing.assert_close(shared[real], plain[real], rtol=1e-5, atol=1e-5)
    assert len(shared_grads) == len(plain_grads)
    for a, b in zip(shared_grads, plain_grads, strict=True):
        # Sums in another order: equal up to float rounding, relative to the gradient's size.
        assert float((a - b).norm()) <= 1e-4 * float(b.norm()) + 1e-7


@pytest.mark.timeout(120)
def test_training_client_shares_prompts_and_matches_the_plain_pass(
    service: ServiceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An RL-like batch (4 groups of 4 samples of one prompt) gives the same logprobs and loss
    with prefix sharing as with ``TEMPERING_PREFIX_SHARING=0``."""
    rng = np.random.default_rng(4)
    data: list[tinker.Datum] = []
    for g in range(4):
        prompt = random_tokens(rng, 20 + g)
        for _ in range(4):
            tokens = prompt + random_tokens(rng, int(rng.integers(2, 7)))
            n = len(tokens) - 1
            data.append(rl_datum(tokens, [-1.0] * n, list(rng.normal(size=n))))

    def logprobs_and_loss() -> tuple[list[np.ndarray], float]:
        client = service.create_full_training_client("tempering/tiny").result()
        try:
            out = client.forward(data, "importance_sampling").result()
        finally:
            client.close()
        lps = [np.asarray(o["logprobs"].to_numpy()) for o in out.loss_fn_outputs]
        return lps, out.metrics["loss:sum"]

    shared_lps, shared_loss = logprobs_and_loss()
    monkeypatch.setenv("TEMPERING_PREFIX_SHARING", "0")
    plain_lps, plain_loss = logprobs_and_loss()
    for a, b in zip(shared_lps, plain_lps, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert shared_loss == pytest.approx(plain_loss, rel=1e-5)
