"""Algorithm distillation (Laskin et al., 2022): a source learner's learning histories across many
episodes of a task, logged in the trajectory log format, served as cross-episode windows (RL
format tensors or language format text), a small causal transformer trained on them, and its
in-context learning measured online on held-out tasks. See docs/recipes/algorithm-distillation.md.

- :mod:`tempering.ad.tasks`: bandits, Dark Room, guess-number, with their source learners
  (``tempering_protocols.InContextTaskFamily``: a downstream package adds its own).
- :mod:`tempering.ad.guess_env`: guess-number under the token env's rules, and
  :mod:`tempering.ad.rl_source`: a tempering RL run on that env as the source of its histories.
- :mod:`tempering.ad.histories`: :func:`write_histories` / :func:`read_histories` (checked).
- :mod:`tempering.ad.dataset`: :class:`HistoryDataset` (``torch.utils.data.Dataset``).
- :mod:`tempering.ad.model`: :class:`ADTransformer`; :mod:`tempering.ad.train`: :func:`train_ad`.
- :mod:`tempering.ad.evaluate`: :func:`evaluate_in_context` and the baselines.

Example::

    family = BanditFamily()
    write_histories(family, "runs/ad/h", n_tasks=200, n_episodes=200, seed=0)
    ds = HistoryDataset(read_histories("runs/ad/h"), window=100, stride=10)
    model = train_ad(ADTrainConfig(log_dir="runs/ad/m", model=ADModelConfig(n_states=1, n_actions=5,
                     context=100)), ds, n_states=1, n_actions=5)
    evaluate_in_context(model, family, range(30), 100)
"""

from tempering.ad.dataset import HistoryDataset, WindowTooLongError, transcript, write_chat_jsonl
from tempering.ad.evaluate import (
    cumulative_regret,
    evaluate_in_context,
    random_curve,
    source_curve,
    write_curves,
)
from tempering.ad.guess_env import GuessNumberEnvFamily
from tempering.ad.histories import (
    HistoryError,
    LearningHistories,
    read_histories,
    run_source,
    write_histories,
)
from tempering.ad.model import ADModelConfig, ADTransformer, SpaceMismatchError, check_spaces
from tempering.ad.tasks import BanditFamily, DarkRoomFamily, GuessNumberFamily
from tempering.ad.train import ADTrainConfig, load_model, train_ad

__all__ = [
    "ADModelConfig",
    "ADTrainConfig",
    "ADTransformer",
    "BanditFamily",
    "DarkRoomFamily",
    "GuessNumberEnvFamily",
    "GuessNumberFamily",
    "HistoryDataset",
    "HistoryError",
    "LearningHistories",
    "SpaceMismatchError",
    "WindowTooLongError",
    "check_spaces",
    "cumulative_regret",
    "evaluate_in_context",
    "load_model",
    "random_curve",
    "read_histories",
    "run_source",
    "source_curve",
    "train_ad",
    "transcript",
    "write_chat_jsonl",
    "write_curves",
    "write_histories",
]
