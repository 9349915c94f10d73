"""The CLI's error boundary: every error a user can cause ends in one or two lines.

- Bad input (a malformed data file, a wrong flag value, a path that is not what it should be,
  a run directory in use, a read-only or full disk): ``tempering CMD: <what, where, what to do>``
  on stderr, exit code 2.
- A run that failed for its own reasons (every rollout failed, workers lost, a missing extra):
  one line, exit code 1.
- Ctrl-C: what was kept and how the run resumes, exit code 130.
- Anything else is a bug: the traceback, then a line saying so, exit code 1.

``--debug`` (anywhere on the command line) or ``TEMPERING_DEBUG=1`` prints the traceback of
every error as well.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

from tempering.fs import DirLockedError, describe_os_error, os_error_of

__all__ = ["DEBUG_ENV", "debug_requested", "run_guarded"]

DEBUG_ENV = "TEMPERING_DEBUG"
"""Set to 1 to print the traceback of every error (as ``--debug`` does)."""

_EXIT_BAD_INPUT = 2
_EXIT_FAILED = 1
_EXIT_INTERRUPTED = 130


def debug_requested(args: list[str]) -> bool:
    """Whether tracebacks are asked for; removes ``--debug`` from ``args`` (before a ``--``)."""
    debug = os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")
    end = args.index("--") if "--" in args else len(args)
    while "--debug" in args[:end]:
        args.remove("--debug")
        end -= 1
        debug = True
    return debug


def _run_failed_types() -> tuple[type[BaseException], ...]:
    """Errors of a run that was given good input but could not go on (exit 1, one line)."""
    from tempering.evals.inspect_eval import InspectTaskError  # an inspect task of the suite failed

    try:
        from tempering.rl.ray_executor import WorkersLostError
        from tempering.rl.rollout_failures import RolloutsFailedError
    except ImportError:  # a bare install (no `local` extra): no run got that far
        return (InspectTaskError,)
    return (RolloutsFailedError, WorkersLostError, InspectTaskError)


def _bad_input_types() -> tuple[type[BaseException], ...]:
    """Errors a user causes with their input, flags, files or directories (exit 2, one line)."""
    from tempering.model_info import UnknownModelError

    try:
        from tempering.training.rundir import RunExistsError
    except ImportError:  # a bare install (no `local` extra)
        return (ValueError, OSError, DirLockedError, UnknownModelError)
    return (ValueError, OSError, RunExistsError, DirLockedError, UnknownModelError)


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        if exc.strerror and exc.strerror != os.strerror(exc.errno):
            return exc.strerror  # a sentence tempering wrote, naming the path
        return describe_os_error(exc, doing="reading or writing")
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    text = str(exc).strip()
    return text if text else type(exc).__name__


def _own(exc: BaseException) -> bool:
    """Whether ``exc`` is tempering's own error, or raised from tempering's code (a message
    written for the user), rather than from a library underneath."""
    if type(exc).__module__.startswith("tempering") or getattr(exc, "_tempering_named", False):
        return True
    import tempering

    package = os.path.dirname(os.path.abspath(tempering.__file__))
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    return last is not None and os.path.abspath(last.tb_frame.f_code.co_filename).startswith(package)


def _interrupted(command: str) -> str:
    lines = [f"tempering {command}: interrupted (Ctrl-C)."]
    rundir = sys.modules.get("tempering.training.rundir")  # loaded only if a run was opened
    opened = rundir.opened_run_dirs() if rundir is not None else []
    for run in opened:
        last = run.last_checkpoint() if run.exists() else None
        if last is None:
            lines.append(
                f"  {run.path}: no checkpoint saved yet; the same command starts the run again from step 0"
            )
        else:
            resume = (
                ""
                if command in ("recipe", "demo")
                else "; run the same command again to resume from there (--run.if-exists resume, the default)"
            )
            lines.append(f"  {run.path}: kept up to its checkpoint at step {last.step}{resume}")
    if command in ("recipe", "demo"):
        lines.append(
            "  recipes do not resume: the same command starts over and empties the output directory "
            "(--out); copy what you need from it first"
        )
    elif len(lines) == 1:
        lines.append("  nothing was being trained; run the command again")
    return "\n".join(lines)


def run_guarded(command: str, body: Callable[[], int], *, debug: bool) -> int:
    """Run ``body`` (a command), turning the errors a user can cause into one-line messages."""
    try:
        return body()
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise  # argparse and tyro have printed their message; their exit code stands
        text = exc.code if exc.code.startswith("tempering") else f"tempering {command}: {exc.code}"
        print(text, file=sys.stderr)
        return _EXIT_BAD_INPUT
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print(_interrupted(command), file=sys.stderr)
        return _EXIT_INTERRUPTED
    except ImportError as exc:
        if "pip install" not in str(exc):
            raise  # the caller names a missing extra of the local engine
        if debug:
            traceback.print_exc()
        print(f"tempering {command}: {exc}", file=sys.stderr)
        return _EXIT_FAILED
    except Exception as caught:
        exc: BaseException = os_error_of(caught) or caught  # safetensors' I/O errors too
        failed = isinstance(exc, _run_failed_types())
        if not failed and not isinstance(exc, _bad_input_types()):
            traceback.print_exc()
            print(
                f"tempering {command}: unexpected {type(exc).__name__} (traceback above): if it ends in your "
                "own code (a dataset builder, env, grader), fix it there; otherwise this is a bug in "
                "tempering: please report it with the command that ran",
                file=sys.stderr,
            )
            return _EXIT_FAILED
        if debug:
            traceback.print_exc()
        print(f"tempering {command}: {_message(exc)}", file=sys.stderr)
        if not debug and not failed and not _own(exc):
            print(f"  ({type(exc).__name__}; --debug or {DEBUG_ENV}=1 shows where)", file=sys.stderr)
        return _EXIT_FAILED if failed else _EXIT_BAD_INPUT
