"""``--verifiers-env NAME`` (and ``--verifiers-env-args JSON``) on ``tempering rl`` and ``tempering eval``.

======================================  =========================================================
command                                 what it does
======================================  =========================================================
``tempering rl --verifiers-env NAME``   trains on the installed verifiers environment ``NAME``:
                                        ``--dataset-builder`` with
                                        :class:`~tempering.envs.verifiers_data.VerifiersTask`, its
                                        fields as ``--dataset.FIELD`` flags (``batch-size``,
                                        ``group-size``, ``n-test``, ``timeout-s``, ...)
``tempering eval --verifiers-env NAME`` evaluates the model on ``NAME``'s eval dataset
                                        (:func:`~tempering.rl.verifiers_eval.evaluate_verifiers`:
                                        ``--limit`` rows, ``--num-samples`` rollouts each); no
                                        benchmark runs unless ``--benchmark`` is given too
======================================  =========================================================

A missing ``verifiers`` package, an env that is not installed or arguments that are not a JSON
object are refused before anything runs, with a message naming them (exit 2).

Example::

    tempering rl --verifiers-env wordle --verifiers-env-args '{"num_train_examples": 200}' --num-steps 20
    tempering eval --verifiers-env wordle --limit 50 --num-samples 2 --max-tokens 512
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

__all__ = ["ARGS_FLAG", "FLAG", "HELP", "VerifiersChoice", "rl_argv", "split_flags"]

FLAG = "--verifiers-env"
ARGS_FLAG = "--verifiers-env-args"
BUILDER = "tempering.envs.verifiers_data:VerifiersTask"
HELP = (
    f"\n{FLAG} NAME [{ARGS_FLAG} JSON] trains on an installed verifiers environment (docs/verifiers.md), "
    "its settings as --dataset.FIELD flags."
)


@attrs.frozen
class VerifiersChoice:
    """The env named on the command line and its ``load_environment`` arguments (JSON)."""

    env: str
    args: str = "{}"

    def check(self) -> None:
        """Refuse, naming what and what to do: verifiers missing, the env not installed or not
        loadable, arguments that are not a JSON object (``ValueError`` / ``ImportError``)."""
        from tempering.envs.verifiers_env import load_verifiers_env, parse_env_args

        load_verifiers_env(self.env, parse_env_args(self.args, self.env))


def _value(args: list[str], i: int, flag: str) -> tuple[str, int]:
    arg = args[i]
    if arg.startswith(flag + "="):
        return arg.split("=", 1)[1], i + 1
    if i + 1 >= len(args) or (args[i + 1].startswith("-") and flag == FLAG):
        raise ValueError(
            f"{flag} needs a value ({'an environment name' if flag == FLAG else 'a JSON object'})"
        )
    return args[i + 1], i + 2


def split_flags(argv: Sequence[str]) -> tuple[VerifiersChoice | None, list[str]]:
    """``(the chosen env or None, the other arguments)``; ``--verifiers-env-args`` without
    ``--verifiers-env`` is a ``ValueError``."""
    args = list(argv)
    env: str | None = None
    env_args: str | None = None
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        for flag in (FLAG, ARGS_FLAG):
            if arg == flag or arg.startswith(flag + "="):
                value, i = _value(args, i, flag)
                if (env if flag == FLAG else env_args) is not None:
                    raise ValueError(f"{flag} is given twice; give it once")
                if flag == FLAG:
                    env = value
                else:
                    env_args = value
                break
        else:
            rest.append(arg)
            i += 1
    if env is None:
        if env_args is not None:
            raise ValueError(f"{ARGS_FLAG} is given without {FLAG} NAME")
        return None, rest
    return VerifiersChoice(env, env_args if env_args is not None else "{}"), rest


def rl_argv(choice: VerifiersChoice, rest: Sequence[str]) -> list[str]:
    """``tempering rl``'s arguments that train on ``choice`` through ``--dataset-builder``; the
    dataset renders with the trained model (``--model.base-model``, ``--model.renderer-name``)
    unless ``--dataset.base-model`` / ``--dataset.renderer-name`` say otherwise."""
    out = ["--dataset-builder", BUILDER, "--dataset.env", choice.env, "--dataset.env-args", choice.args]
    for field in ("base-model", "renderer-name"):
        model_flag, dataset_flag = f"--model.{field}", f"--dataset.{field}"
        if any(a == dataset_flag or a.startswith(dataset_flag + "=") for a in rest):
            continue
        for i, a in enumerate(rest):
            if a.startswith(model_flag + "="):
                out += [dataset_flag, a.split("=", 1)[1]]
            elif a == model_flag and i + 1 < len(rest):
                out += [dataset_flag, rest[i + 1]]
    return [*out, *rest]
