"""Real (small) training runs on the tiny model: SFT lowers the loss on a synthetic task, and
RL with importance_sampling raises a simple reward. Written against the protocols only."""

from __future__ import annotations

import numpy as np
import tinker
from local_helpers import sft_datum

from tempering.local import ServiceClient
from tempering_protocols import SamplingClient, TrainingClient


def _copy_task(rng: np.random.Generator) -> tinker.Datum:
    """ "<|im_start|>abc\\n" -> "abc<|im_end|>": copy a random lowercase word."""
    word = [int(t) for t in rng.integers(97, 123, size=int(rng.integers(2, 5)))]
    prompt = [258, *word, 10]
    answer = [*word, 259]
    return sft_datum(prompt + answer, [0.0] * (len(prompt) - 1) + [1.0] * len(answer))


def test_sft_lowers_the_loss(service: ServiceClient) -> None:
    client: TrainingClient = service.create_lora_training_client("tempering/tiny", rank=16).result()
    rng = np.random.default_rng(0)
    held_out = [_copy_task(np.random.default_rng(1000 + i)) for i in range(16)]

    def held_out_loss() -> float:
        out = client.forward(held_out, "cross_entropy").result()
        weight = sum(float(d.loss_fn_inputs["weights"].to_numpy().sum()) for d in held_out)
        return out.metrics["loss:sum"] / weight

    before = held_out_loss()
    for _ in range(40):
        client.forward_backward([_copy_task(rng) for _ in range(16)], "cross_entropy")
        client.optim_step(tinker.AdamParams(learning_rate=3e-3))
    after = held_out_loss()
    assert after < 0.6 * before, (before, after)


def test_rl_with_importance_sampling_raises_the_reward(service: ServiceClient) -> None:
    """Reward: the fraction of lowercase letters among 8 sampled tokens (about 0.1 at first)."""
    client: TrainingClient = service.create_lora_training_client("tempering/tiny", rank=8).result()
    prompts = [[258, 117, 10], [258, 97, 10], [258, 120, 10], [258, 100, 10]]
    group_size, max_tokens = 8, 8
    mean_rewards = []
    for step in range(8):
        sampler: SamplingClient = client.save_weights_and_get_sampling_client()
        params = [
            tinker.SamplingParams(max_tokens=max_tokens, stop=[], seed=100 * step + i)
            for i in range(len(prompts))
        ]
        futures = [
            sampler.sample(tinker.ModelInput.from_ints(p), group_size, sp)
            for p, sp in zip(prompts, params, strict=True)
        ]
        data, rewards = [], []
        for prompt, future in zip(prompts, futures, strict=True):
            sequences = future.result().sequences
            reward_G = np.array([np.mean([97 <= t <= 122 for t in s.tokens]) for s in sequences])
            rewards.append(reward_G.mean())
            for seq, advantage in zip(sequences, reward_G - reward_G.mean(), strict=True):
                tokens = prompt + seq.tokens
                pad = [0.0] * (len(prompt) - 1)
                data.append(
                    tinker.Datum(
                        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={
                            "target_tokens": tokens[1:],
                            "logprobs": pad + list(seq.logprobs or []),
                            "advantages": pad + [float(advantage)] * len(seq.tokens),
                        },
                    )
                )
        mean_rewards.append(float(np.mean(rewards)))
        client.forward_backward(data, "importance_sampling")
        client.optim_step(tinker.AdamParams(learning_rate=2e-2))
    assert mean_rewards[0] < 0.3
    assert np.mean(mean_rewards[-2:]) > mean_rewards[0] + 0.3, mean_rewards
