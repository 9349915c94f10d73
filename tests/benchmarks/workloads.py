"""The benchmark workloads, generated from a fixed seed.

Tokens and logprobs are Python lists, as the Tinker sampler returns them; observations are
``tinker.ModelInput.from_ints`` (validated lists). Members of a group share their prompt object.

- W1 single-turn: 64 problems × 16 samples, prompt 256 tokens, completions uniform in 64..1024
  tokens, rewards in {0, 1};
- W2 multi-turn: 32 × 8, 4 turns; each observation extends the conversation so far by 128 new
  observation tokens; actions uniform in 64..256;
- W3 large: 256 × 16, prompt 512, completions uniform in 256..2048.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tinker

from tempering_protocols import TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition

VOCAB = 151_936


@dataclass(frozen=True)
class Spec:
    name: str
    problems: int
    group_size: int
    turns: int
    prompt: int  # first observation's length; later turns add this many observation tokens
    completion: tuple[int, int]  # inclusive range of action lengths


W1 = Spec("W1", 64, 16, 1, 256, (64, 1024))
W2 = Spec("W2", 32, 8, 4, 128, (64, 256))
W3 = Spec("W3", 256, 16, 1, 512, (256, 2048))
WORKLOADS = {s.name: s for s in (W1, W2, W3)}


def make_groups(spec: Spec, seed: int = 0, scale: float = 1.0) -> list[TrajectoryGroup]:
    """The workload's trajectory groups; ``scale`` < 1 shrinks the number of problems (for quick
    correctness runs)."""
    rng = np.random.default_rng(seed)
    lo, hi = spec.completion
    groups: list[TrajectoryGroup] = []
    for _ in range(max(1, round(spec.problems * scale))):
        prompt = tinker.ModelInput.from_ints(rng.integers(0, VOCAB, spec.prompt).tolist())
        trajs: list[Trajectory] = []
        for _ in range(spec.group_size):
            transitions: list[Transition] = []
            ob = prompt
            so_far: list[int] = prompt.to_ints()
            for turn in range(spec.turns):
                if turn > 0:
                    so_far = so_far + rng.integers(0, VOCAB, spec.prompt).tolist()
                    ob = tinker.ModelInput.from_ints(so_far)
                n = int(rng.integers(lo, hi + 1))
                ac = rng.integers(0, VOCAB, n).tolist()
                lps = (-rng.exponential(1.0, n)).tolist()
                transitions.append(
                    Transition(
                        ob=ob,
                        ac=TokensWithLogprobs(tokens=ac, maybe_logprobs=lps),
                        reward=0.0,
                        episode_done=turn == spec.turns - 1,
                    )
                )
                so_far = so_far + ac
            trajs.append(Trajectory(transitions=transitions, final_ob=tinker.ModelInput.empty()))
        rewards = rng.integers(0, 2, spec.group_size).astype(float).tolist()
        groups.append(TrajectoryGroup(trajs, rewards, [{} for _ in trajs]))
    return groups
