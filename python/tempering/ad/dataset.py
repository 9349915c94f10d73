"""Cross-episode windows of learning histories, as a ``torch.utils.data.Dataset``, in the RL
format (tensors) or the language format (a conversation, rendered by a renderer); both are built
from the same checked files (:func:`~tempering.ad.histories.read_histories`).

A window is ``window`` consecutive transitions of one task's history (crossing episode
boundaries), starting every ``stride`` transitions at an episode start. ``episodes="final"``
keeps only windows inside each task's last ``final_episodes`` episodes: the expert
distillation baseline's data.

RL format, one item (``T`` = ``window`` transitions):

=============  ========  =======  ============================================================
key            shape     dtype    meaning
=============  ========  =======  ============================================================
``states``     ``T``     int64    the state before each action
``actions``    ``T``     int64    the source learner's action
``rewards``    ``T``     float32  the reward of the action
``logprobs``   ``T``     float32  the log-probability of the action under the source learner
=============  ========  =======  ============================================================

Language format, one item: a :class:`~tempering_protocols.SupervisedExample` (the conversation
of :meth:`HistoryDataset.messages` through the renderer, weight on every action); the
conversations themselves (:meth:`HistoryDataset.messages`) are what ``tempering sft`` trains on
(:func:`write_chat_jsonl`).

Example::

    ds = HistoryDataset(read_histories("runs/ad/histories"), window=80, stride=20)
    ds[0]["actions"].shape                      # torch.Size([80])
    text = HistoryDataset(h, window=80, fmt="language", family=DarkRoomFamily(), renderer=r)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import Dataset

from tempering.ad.histories import HistoryError, LearningHistories
from tempering_protocols import InContextTaskFamily, Message, Renderer, SupervisedExample, TrainOnWhat

__all__ = ["Episodes", "Format", "HistoryDataset", "WindowTooLongError", "transcript", "write_chat_jsonl"]

Format = Literal["rl", "language"]
Episodes = Literal["all", "final"]


class WindowTooLongError(ValueError):
    """A window longer than the model's context (or than a task's history)."""


def transcript(
    family: InContextTaskFamily,
    states_T: npt.NDArray[np.int64],
    actions_T: npt.NDArray[np.int64],
    rewards_T: npt.NDArray[np.float32],
    first_turn: int,
) -> list[Message]:
    """A window as a conversation: the user gives the state (and the last reward), the assistant
    answers with the action. A new episode starts with ``"Episode starts."``.

    Example::

        transcript(BanditFamily(), s, a, r, 0)[:2]
        # [{"role": "user", "content": "Episode starts. pull an arm"},
        #  {"role": "assistant", "content": "arm 3"}]
    """
    h = family.horizon
    messages: list[Message] = [
        {"role": "system", "content": f"You are learning the {family.name} task from its rewards."}
    ]
    for i in range(len(states_T)):
        turn = (first_turn + i) % h
        parts: list[str] = []
        if i > 0:
            parts.append(f"Reward {rewards_T[i - 1]:g}.")
        if turn == 0:
            parts.append("Episode starts.")
        parts.append(family.describe_state(int(states_T[i])))
        messages.append({"role": "user", "content": " ".join(parts)})
        messages.append({"role": "assistant", "content": family.describe_action(int(actions_T[i]))})
    return messages


class HistoryDataset(Dataset[dict[str, torch.Tensor] | SupervisedExample]):
    """Windows of learning histories in either format; see the module docstring.

    ``max_context``: the model's context in transitions; a longer window raises
    :class:`WindowTooLongError`, unless ``truncate`` (then the window is cut to it).
    """

    def __init__(
        self,
        histories: LearningHistories,
        *,
        window: int,
        stride: int | None = None,
        episodes: Episodes = "all",
        final_episodes: int = 1,
        fmt: Format = "rl",
        family: InContextTaskFamily | None = None,
        renderer: Renderer | None = None,
        max_context: int | None = None,
        truncate: bool = False,
    ) -> None:
        h = histories.horizon
        if window < 1:
            raise ValueError(f"HistoryDataset: window must be >= 1, got {window}")
        if max_context is not None and window > max_context:
            if not truncate:
                raise WindowTooLongError(
                    f"HistoryDataset: a window of {window} transitions is longer than the model's "
                    f"context of {max_context}; shorten the window, enlarge the model's context, or "
                    "pass truncate=True to cut windows to the context"
                )
            window = max_context
        if fmt == "language" and family is None:
            raise ValueError("HistoryDataset: the language format needs the task family (its words)")
        self.histories = histories
        self.window = window
        self.fmt: Format = fmt
        self.family = family
        self.renderer = renderer
        stride = stride or h
        if stride % h and h > 1:
            raise ValueError(f"HistoryDataset: stride {stride} must be a multiple of the horizon {h}")
        starts: list[int] = []
        for n in range(histories.n_tasks):
            lo, hi = int(histories.starts_N1[n]), int(histories.starts_N1[n + 1])
            if hi - lo < window:
                raise WindowTooLongError(
                    f"{histories.source}: task {n}'s history has {hi - lo} transitions, fewer than a "
                    f"window of {window}; log more episodes or shorten the window"
                )
            first = lo if episodes == "all" else max(lo, hi - final_episodes * h)
            if hi - first < window:
                raise WindowTooLongError(
                    f"{histories.source}: the final {final_episodes} episodes ({hi - first} transitions) "
                    f"of task {n} are shorter than a window of {window}"
                )
            starts.extend(range(first, hi - window + 1, stride))
        self.starts_W = np.asarray(starts, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.starts_W)

    def _span(self, index: int) -> slice:
        start = int(self.starts_W[index])
        task = int(self.histories.task_R[start])
        if int(self.histories.task_R[start + self.window - 1]) != task:
            raise HistoryError(f"{self.histories.source}: window {index} mixes tasks")  # checked on read
        return slice(start, start + self.window)

    def tensors(self, index: int) -> dict[str, torch.Tensor]:
        """The window in the RL format."""
        span = self._span(index)
        h = self.histories
        return {
            "states": torch.from_numpy(h.state_R[span].copy()),
            "actions": torch.from_numpy(h.action_R[span].copy()),
            "rewards": torch.from_numpy(h.reward_R[span].copy()),
            "logprobs": torch.from_numpy(h.logprob_R[span].copy()),
        }

    def messages(self, index: int) -> list[Message]:
        """The window in the language format, as a conversation (:func:`transcript`)."""
        if self.family is None:
            raise ValueError("HistoryDataset.messages: the language format needs the task family")
        span = self._span(index)
        h = self.histories
        first_turn = int(span.start - h.starts_N1[np.searchsorted(h.starts_N1, span.start, side="right") - 1])
        return transcript(self.family, h.state_R[span], h.action_R[span], h.reward_R[span], first_turn)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor] | SupervisedExample:
        if self.fmt == "rl":
            return self.tensors(index)
        if self.renderer is None:
            raise ValueError("HistoryDataset: the language format's items need a renderer (renderer=)")
        return self.renderer.build_supervised_example(
            self.messages(index), TrainOnWhat.ALL_ASSISTANT_MESSAGES
        )


def write_chat_jsonl(dataset: HistoryDataset, path: str | os.PathLike[str]) -> Path:
    """Every window of ``dataset`` as a ``{"messages": [...]}`` row (``tempering sft``'s input,
    trained with ``--data.train-on-what ALL_ASSISTANT_MESSAGES``); returns the path.

    Example::

        write_chat_jsonl(HistoryDataset(h, window=20, fmt="language", family=f), "runs/ad/chat.jsonl")
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for i in range(len(dataset)):
            f.write(json.dumps({"messages": dataset.messages(i)}) + "\n")
    return out
