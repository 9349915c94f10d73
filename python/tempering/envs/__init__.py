"""Environments shipped with tempering.

=======================================  ====================================================
what                                     where
=======================================  ====================================================
single-turn question → graded answer     :class:`ProblemEnv`, :class:`ProblemGroupBuilder`,
                                         :class:`ProblemDataset`
chat-message envs through a renderer     :class:`MessageEnv`, :class:`MessageEnvAdapter`
two-player games (self-play in a group)  :class:`NimGroupBuilder`, :class:`TicTacToeGroupBuilder`
tic-tac-toe against a random player      :class:`TicTacToeVsRandomGroupBuilder` (evaluated by
                                         ``tempering.rl.evaluate.evaluate_against_random``)
multi-turn: guess a number (higher/      :class:`GuessNumberGroupBuilder`, :class:`GuessNumberTask`
lower feedback)
pairwise-preference tournaments (RLHF)   :class:`PairwisePreferenceGroupBuilder`,
                                         :class:`PreferenceModel`
an installed verifiers environment       :mod:`tempering.envs.verifiers_env` (the env),
                                         :mod:`tempering.envs.verifiers_data` (the builder;
                                         imported on use: docs/verifiers.md)
=======================================  ====================================================

Example::

    from tempering.envs import Problem, ProblemDataset, exact_match
    dataset = ProblemDataset([Problem("2+2?", "4")], renderer, exact_match, batch_size=1, group_size=8)
"""

from tempering.envs.games import NimGame, NimGroupBuilder, NimPlayer
from tempering.envs.guess_number import (
    GuessNumberDataset,
    GuessNumberEnv,
    GuessNumberGame,
    GuessNumberGroupBuilder,
    GuessNumberRules,
    GuessNumberStats,
    GuessNumberTask,
    guess_number_stats,
)
from tempering.envs.message import MessageEnv, MessageEnvAdapter, MessageStepResult, OnFailure
from tempering.envs.preference import (
    CompletionEnv,
    PairwisePreferenceGroupBuilder,
    PreferenceModel,
    tournament_scores,
)
from tempering.envs.problem import (
    Grader,
    Problem,
    ProblemDataset,
    ProblemEnv,
    ProblemGroupBuilder,
    exact_match,
    first_number_match,
    lowercase_fraction,
)
from tempering.envs.tic_tac_toe import (
    TicTacToeGame,
    TicTacToeGroupBuilder,
    TicTacToePlayer,
    TicTacToeStats,
    TicTacToeVsRandom,
    TicTacToeVsRandomGroupBuilder,
    tic_tac_toe_stats,
)

__all__ = [
    "CompletionEnv",
    "Grader",
    "GuessNumberDataset",
    "GuessNumberEnv",
    "GuessNumberGame",
    "GuessNumberGroupBuilder",
    "GuessNumberRules",
    "GuessNumberStats",
    "GuessNumberTask",
    "MessageEnv",
    "MessageEnvAdapter",
    "MessageStepResult",
    "NimGame",
    "NimGroupBuilder",
    "NimPlayer",
    "OnFailure",
    "PairwisePreferenceGroupBuilder",
    "PreferenceModel",
    "Problem",
    "ProblemDataset",
    "ProblemEnv",
    "ProblemGroupBuilder",
    "TicTacToeGame",
    "TicTacToeGroupBuilder",
    "TicTacToePlayer",
    "TicTacToeStats",
    "TicTacToeVsRandom",
    "TicTacToeVsRandomGroupBuilder",
    "exact_match",
    "first_number_match",
    "guess_number_stats",
    "lowercase_fraction",
    "tic_tac_toe_stats",
    "tournament_scores",
]
