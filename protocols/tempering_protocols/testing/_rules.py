"""Every rule the kit checks, by id: the one list that the docs and the tests are held to."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = ["RULES"]

RULES: Final[Mapping[str, str]] = MappingProxyType(
    {
        # structure (every check starts with these)
        "protocol/missing-member": "the object lacks a member of the protocol",
        "protocol/signature": "a method cannot be called with the protocol's arguments, or needs more",
        "protocol/async": "a method is `async` where the protocol's is not, or the other way round",
        # Env
        "env/no-reset": "the env has `reset()`; envs are single-use, builders make fresh ones",
        "env/initial-observation-type": "`initial_observation()` is not `(tinker.ModelInput, StopCondition)`",
        "env/step-type": "`step()` does not return a `StepResult` with fields of the declared types",
        "env/reward-not-finite": "`step()` returned a NaN or infinite reward",
        "env/never-finishes": "no `episode_done` within `max_steps` steps of the action policy",
        "env/step-after-done": "a finished env accepted another `step()` instead of raising",
        "env/raised": "`initial_observation()` or `step()` raised during the episode",
        "env/timeout": "`initial_observation()` or `step()` did not return within the kit's time limit",
        # EnvGroupBuilder
        "builder/pickle": "the builder does not pickle, or its copy makes a different number of envs",
        "builder/make-envs-type": "`make_envs()` does not return a sequence of `Env`",
        "builder/empty-group": "`make_envs()` returned no envs",
        "builder/fresh-envs": "one env object twice in a group, or returned again by a later call",
        "builder/group-rewards-length": "`compute_group_rewards()` does not return one pair per member",
        "builder/group-rewards-type": "`compute_group_rewards()` is not a `list[tuple[float, Metrics]]`",
        "builder/logging-tags-type": "`logging_tags()` is not `list[str]`",
        "builder/raised": "`make_envs()`, `compute_group_rewards()`, `logging_tags()` or `cleanup()` raised",
        "builder/timeout": "`make_envs()`, `compute_group_rewards()` or `cleanup()` did not return in time",
        # RLDataset, RLDatasetBuilder
        "rl-dataset/len": "`len()` fails or is 0",
        "rl-dataset/batch-type": "`get_batch(i)` is not a sequence of `EnvGroupBuilder`",
        "rl-dataset/empty-batch": "`get_batch(i)` returned no builders",
        "rl-dataset/deterministic": "`get_batch(i)` called twice gave different builders",
        "rl-dataset/raised": "`get_batch(i)` raised",
        "rl-dataset-builder/pickle": "the dataset builder does not pickle",
        "rl-dataset-builder/return-type": "`await builder()` is not `(RLDataset, RLDataset | None)`",
        "rl-dataset-builder/raised": "`await builder()` raised",
        "rl-dataset-builder/timeout": "`await builder()` did not return within the kit's time limit",
        # SupervisedDataset, SupervisedDatasetBuilder
        "supervised/len": "`len()` fails or is 0",
        "supervised/batch-type": "`get_batch(i)` is not a sequence of `tinker.Datum`",
        "supervised/empty-batch": "`get_batch(i)` returned no datums",
        "supervised/missing-loss-input": "a datum lacks `loss_fn_inputs['target_tokens']` or `['weights']`",
        "supervised/loss-input-dtype": "`target_tokens` is not int64 or `weights` is not float32",
        "supervised/misaligned": "`target_tokens` or `weights` is not as long as `model_input`",
        "supervised/weights-range": "a weight is negative or not finite",
        "supervised/deterministic": "`get_batch(i)` changes when called again, or after re-seeding",
        "supervised/raised": "`get_batch(i)` or `set_epoch()` raised",
        "supervised-builder/pickle": "the dataset builder does not pickle",
        "supervised-builder/return-type": "`builder()` is not (SupervisedDataset, SupervisedDataset | None)",
        "supervised-builder/raised": "`builder()` raised",
        # Renderer
        "renderer/generation-prompt-type": "`build_generation_prompt()` is not a non-empty ModelInput",
        "renderer/supervised-example-type": "`build_supervised_example()` is not a `SupervisedExample`",
        "renderer/weights-aligned": "the weights are not a 1-D float array with one weight per token",
        "renderer/weights-range": "a weight is negative or not finite",
        "renderer/no-trained-tokens": "all weights are 0 for a conversation ending with an assistant message",
        "renderer/stop-sequences-type": "`get_stop_sequences()` is not a non-empty list[str] or list[int]",
        "renderer/parse-response-type": "`parse_response()` is not `(Message, bool)`",
        "renderer/round-trip": "`parse_response()` does not give back an assistant message with `True`",
        "renderer/raised": "a renderer method raised",
        # TokenCompleter, MessageCompleter
        "completer/return-type": "not a `TokensWithLogprobs` of integer tokens with a valid `stop_reason`",
        "completer/missing-logprobs": "no logprobs (`maybe_logprobs is None`) where they are required",
        "completer/logprobs-length": "the number of logprobs differs from the number of tokens",
        "completer/logprobs-range": "a logprob is positive or not finite",
        "completer/raised": "the completer raised",
        "completer/timeout": "the completer did not return within the kit's time limit",
        "message-completer/return-type": "not a `Message` with role `assistant`",
        "message-completer/raised": "the completer raised",
        "message-completer/timeout": "the completer did not return within the kit's time limit",
        # Sandbox
        "sandbox/return-type": "`run()` is not a `SandboxResult` with a known status and typed fields",
        "sandbox/ok-run": "a program printing a file and stdin is not `ok` with exit code 0 and that output",
        "sandbox/exit-code": "a program exiting with 3 is not `error` with exit code 3",
        "sandbox/fresh": "a file written by one run is visible to the next",
        "sandbox/timeout": "a sleep past `timeout` is not reported as `timeout` (or takes far longer)",
        "sandbox/raised": "`run()` raised for what the code did",
    }
)
"""Rule id -> what breaks it. Every ``ConformanceError`` names one of these ids."""
