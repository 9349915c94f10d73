"""The ``tempering`` command line.

``tempering sft|dpo|rm|rl [flags]`` builds the trainer's attrs config from flags with ``tyro``
(``--help`` lists every field, nested ones as ``--run.log-dir``, ``--adam.learning-rate``) and
runs it; flags may come before or after a subcommand such as ``dataset:arithmetic-task``, and
``--help`` shows the configs' docstrings as plain prose (:mod:`tempering.cli._help`);
``tempering demo`` takes its flags from ``DemoConfig`` the same way, and
``tempering recipe NAME`` from the recipe's config (``tempering.recipes.RECIPES``; its stages
are nested, ``--sft.steps``, and their older flat spellings ``--sft-steps`` are accepted:
:mod:`tempering.cli._aliases`);
``tempering eval`` takes its flags from ``tempering.cli.eval.EvalCommandConfig``;
``tempering tiny-model``, ``tempering serve``, ``tempering export``, ``tempering checkpoints``
(:mod:`tempering.cli.weights`) and ``tempering models`` (:mod:`tempering.cli.models`) are plain
``argparse`` commands.
``TEMPERING_DOCS_TEST=1`` caps every parsed config's budgets (steps, batch and eval sizes) for the
test that runs the docs' commands (:mod:`tempering.cli._budgets`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from tempering.cli._extras import EXTRAS

_TRAINERS = {
    "sft": "supervised fine-tuning on chat data (docs/sft.md)",
    "dpo": "direct preference optimization on labeled comparisons (docs/dpo.md)",
    "rm": "a pairwise reward model trained on labeled comparisons (docs/dpo.md)",
    "rl": "reinforcement learning on env groups: sync, streaming or async off-policy (docs/rl.md)",
}


_DEMO_HELP = (
    "the main job on the local engine: SFT warm start on arithmetic, then RL with verifiable rewards, "
    "on SmolLM2-135M-Instruct (--model tiny: the built-in tiny model) (docs/quickstart.md)"
)


def _tyro_cli(cls: type[Any], argv: Sequence[str], prog: str, description: str) -> Any:
    """``cls`` built from ``argv`` by tyro: flags before or after subcommands, plain-prose help."""
    import tyro

    from tempering.cli._aliases import expand_aliases
    from tempering.cli._budgets import apply_docs_test_budgets
    from tempering.cli._checks import check_config, check_flags
    from tempering.cli._help import plain_help

    plain_help()
    check_flags(argv)
    argv = expand_aliases(cls, argv)  # a recipe's flat stage flags: --sft-steps is --sft.steps
    config = tyro.cli(
        cls,
        args=list(argv),
        prog=prog,
        description=description,
        config=(tyro.conf.CascadeSubcommandArgs,),
    )
    check_config(config)  # counts, numbers and paths, by flag name, before anything is written
    return apply_docs_test_budgets(config)  # TEMPERING_DOCS_TEST=1: tiny budgets (docs/faults.md)


def _demo(argv: Sequence[str]) -> int:
    """``tempering demo [flags]``: the flags are :class:`tempering.recipes.demo.DemoConfig`'s."""
    from tempering.recipes.demo import DemoConfig, main

    config = _tyro_cli(DemoConfig, argv, "tempering demo", _DEMO_HELP)
    return main(config)


def _recipe(argv: Sequence[str]) -> int:
    """``tempering recipe NAME [flags]``: the flags are the recipe config's (``--help`` lists them)."""
    from tempering.recipes import RECIPES, load_recipe

    if not argv or argv[0] in ("-h", "--help", "--list"):
        print("usage: tempering recipe NAME [flags]   (tempering recipe NAME --help for its flags)\n")
        width = max(len(n) for n in RECIPES)
        for name, (_, help_text) in RECIPES.items():
            print(f"  {name:<{width}}  {help_text}")
        return 0 if argv else 2
    name = argv[0]
    if name not in RECIPES:
        print(f"tempering recipe: no recipe named {name!r}; recipes: {', '.join(RECIPES)}", file=sys.stderr)
        return 2
    cls = load_recipe(name)
    config = _tyro_cli(cls, argv[1:], f"tempering recipe {name}", RECIPES[name][1])
    run: Callable[[], Any] = config
    result = asyncio.run(run())
    print(result.line())
    print(f"run directory: {result.run_dir}")
    return 0


def _tiny_model(args: argparse.Namespace) -> int:
    from tempering.local.tiny import build_tiny_model

    path = build_tiny_model(args.directory, seed=args.seed)
    print(f"wrote the tiny model and its tokenizer to {path}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from tempering.serve import serve

    return serve(
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        data_dir=args.data_dir,
        device=args.device,
        dtype=args.dtype,
        max_request_mb=args.max_request_mb,
        log_level=args.log_level,
        session_ttl_s=args.session_ttl_s,
        read_timeout_s=args.read_timeout,
    )


def _config_class(command: str) -> type[Any]:
    if command == "sft":
        from tempering.sft import SFTConfig

        return SFTConfig
    if command == "dpo":
        from tempering.preference import DPOConfig

        return DPOConfig
    if command == "rl":
        from tempering.cli.rl import RLCommandConfig

        return RLCommandConfig
    from tempering.preference import RewardModelConfig

    return RewardModelConfig


def _train(command: str, argv: Sequence[str]) -> int:
    """Build the config of ``command`` from ``argv`` with tyro (with ``--dataset-builder``, its
    fields as flags: :mod:`tempering.cli.builders`), run it, print the final metrics."""
    from tempering.cli.builders import BuilderError, flag_help, with_dataset_builder
    from tempering.rl.rollouts import RolloutsFailedError
    from tempering.training import RunExistsError

    if command == "rl":
        from tempering.envs.verifiers_env import VerifiersMissingError

        try:
            argv = _verifiers_rl_argv(argv)
        except (ValueError, VerifiersMissingError) as exc:
            print(f"tempering {command}: {exc}", file=sys.stderr)
            return 2
    try:
        cls, argv, finish = with_dataset_builder(command, _config_class(command), argv)
    except BuilderError as exc:
        print(f"tempering {command}: {exc}", file=sys.stderr)
        return 2
    description = _TRAINERS[command] + flag_help(command)
    if command == "rl":
        from tempering.cli.verifiers import HELP as VERIFIERS_HELP

        description += VERIFIERS_HELP
    config = finish(_tyro_cli(cls, argv, f"tempering {command}", description))
    run: Callable[[], Any] = config
    try:
        result = asyncio.run(run())
    except RunExistsError as exc:
        print(f"tempering {command}: {exc}", file=sys.stderr)
        return 2
    except RolloutsFailedError as exc:
        print(f"tempering {command}: {exc}", file=sys.stderr)
        return 1
    last = result.metrics[-1] if result.metrics else {}
    summary = {k: v for k, v in last.items() if not k.startswith("time/")}
    print(json.dumps({"final": result.final.state_path, "sampler": result.final.sampler_path, **summary}))
    return 0


def _verifiers_rl_argv(argv: Sequence[str]) -> Sequence[str]:
    """``tempering rl --verifiers-env NAME``: the env checked, then trained on as a dataset builder
    (:mod:`tempering.cli.verifiers`)."""
    from tempering.cli.verifiers import rl_argv, split_flags

    choice, rest = split_flags(argv)
    if choice is None:
        return argv
    choice.check()
    return rl_argv(choice, rest)


_LOCAL_MODULES = frozenset(EXTRAS["local"][1])
"""The modules of the ``local`` extra (the in-process engine)."""


def _missing_local_module(exc: BaseException) -> str | None:
    """The name of a module of the ``local`` extra whose absence caused ``exc``, if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ModuleNotFoundError) and current.name is not None:
            root = current.name.partition(".")[0]
            if root in _LOCAL_MODULES:
                return root
        current = current.__cause__ or current.__context__
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """``tempering ARGS``: run the command through the error boundary (:mod:`tempering.cli._errors`);
    missing extras are one line naming them all, exit 1."""
    from tempering.cli._errors import debug_requested, run_guarded
    from tempering.cli._extras import missing_extras, missing_message

    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = debug_requested(args_list)
    command = args_list[0] if args_list else ""
    if not {"-h", "--help"} & set(args_list):
        missing = missing_extras(command)
        if missing:
            print(missing_message(command, missing), file=sys.stderr)
            return 1
    try:
        return run_guarded(command, lambda: _main(args_list), debug=debug)
    except ImportError as exc:
        gone = _missing_local_module(exc)
        if gone is None:
            raise
        others = {k: v for k, v in missing_extras(command).items() if k != "local"}
        print(missing_message(command, {"local": [gone], **others}, first=[gone]), file=sys.stderr)
        return 1


def _main(args_list: list[str]) -> int:
    if args_list and args_list[0] in _TRAINERS:
        return _train(args_list[0], args_list[1:])
    if args_list and args_list[0] == "demo":
        return _demo(args_list[1:])
    if args_list and args_list[0] == "recipe":
        return _recipe(args_list[1:])
    if args_list and args_list[0] == "eval":
        from tempering.cli import eval as eval_command

        return eval_command.main(args_list[1:], _tyro_cli)
    parser = argparse.ArgumentParser(prog="tempering", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in _TRAINERS.items():
        sub.add_parser(name, help=f"{help_text}; see `tempering {name} --help`", add_help=False)
    sub.add_parser("demo", help=f"{_DEMO_HELP}; see `tempering demo --help`", add_help=False)
    sub.add_parser("recipe", help="run a named recipe; `tempering recipe --list` lists them", add_help=False)
    sub.add_parser(
        "eval",
        help="benchmarks (math, IFEval, multiple choice, MBPP, NLL) on any model (tempering eval --help)",
        add_help=False,
    )
    tiny = sub.add_parser("tiny-model", help="write the built-in tiny model to a directory")
    tiny.add_argument("directory", help="where to write it (created if needed)")
    tiny.add_argument("--seed", type=int, default=0, help="initialisation seed (default 0)")
    tiny.set_defaults(func=_tiny_model)
    srv = sub.add_parser("serve", help="serve the local engine to the official tinker SDK (docs/serve.md)")
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    srv.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    srv.add_argument("--api-key", default=None, help="key clients must send (default: generated, printed)")
    srv.add_argument("--data-dir", default=None, help="checkpoints (default $TEMPERING_HOME)")
    srv.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default $TEMPERING_DEVICE or auto)")
    srv.add_argument("--dtype", default=None, help="float32, bfloat16 (default $TEMPERING_DTYPE or auto)")
    srv.add_argument("--max-request-mb", type=float, default=256, help="request size limit (default 256)")
    srv.add_argument(
        "--log-level", default="warning", help="critical, error, warning (default), info, debug, trace"
    )
    srv.add_argument(
        "--session-ttl-s",
        type=float,
        default=600,
        help="finish a client's session after this many seconds without a request or heartbeat, "
        "releasing its models (a client that exited without close(); default 600, 0: never)",
    )
    srv.add_argument(
        "--read-timeout",
        type=float,
        default=30,
        help="close a connection whose request headers take longer than this many seconds, or whose "
        "body pauses this long (default 30)",
    )
    srv.set_defaults(func=_serve)
    from tempering.cli.weights import add_commands

    add_commands(sub)
    from tempering.cli.view import add_commands as _add_view_commands

    _add_view_commands(sub)
    from tempering.cli.models import add_commands as _add_model_commands

    _add_model_commands(sub)
    args = parser.parse_args(args_list)
    result: int = args.func(args)
    return result
