"""A `verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ environment as a tempering env.

A classic verifiers environment (``vf.SingleTurnEnv``, ``vf.MultiTurnEnv``, ``vf.ToolEnv`` and
their subclasses, as written for verifiers 0.3 and the hub) runs its own rollout loop:
``env.rollout(input, client, model)`` asks ``client.get_response(prompt, tools)`` for each
assistant turn, calls ``env_response`` between turns and checks its stop conditions. Its
rubric scores the finished state. :class:`VerifiersEnv` turns that loop inside out so tempering's
RL loop samples every turn:

================================  ==========================================================
step                              what happens
================================  ==========================================================
``initial_observation()``         starts ``env.rollout`` as a task with a bridge client; the
                                  env's first ``get_response`` is rendered (the renderer's own
                                  tool declarations when ``tools`` are given) and returned
``step(action)``                  the sampled tokens are parsed by the renderer (text, thinking,
                                  tool calls) and handed back to the waiting ``get_response``;
                                  the env runs ``env_response`` / its stop conditions until it
                                  asks again (the next observation) or its rollout ends
the rollout ends                  the rubric scores it (``score_rollout``; with group-level
                                  reward functions, ``score_group`` over the group, in
                                  :meth:`VerifiersGroupBuilder.compute_group_rewards`); the
                                  reward and the rubric's metrics (``verifiers/<name>``) end
                                  the episode
================================  ==========================================================

So training is on exactly the tokens tempering sampled, and a multi-turn episode with a renderer
that extends prefixes packs into one datum. The env's own ``sampling_args`` are not used: the RL
loop's ``max_tokens`` and temperature are.

Failures never end a run: the env raising (in ``setup_state``, ``env_response``, a tool, a
reward function), its rollout ending with ``state["error"]`` set, a reward that is not a finite
number, or the env taking longer than ``timeout_s`` between two model calls (or to score) raise
:class:`VerifiersEnvError`, whose message names the env; the RL loop counts it as a failed rollout
(``rollout/failed/VerifiersEnvError``) and logs the message once.

Example::

    env = load_verifiers_env("my-env", {"n": 10})  # imports module my_env, calls load_environment
    group = VerifiersGroupBuilder("my-env", "{}", "train", 0, renderer, group_size=4)
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import tinker

from tempering.data.jsontext import NotJSONObjectError, loads_object
from tempering.tools import Tool, tool_prefix
from tempering_protocols import Action, Message, Metrics, Observation, Renderer, StepResult, StopCondition
from tempering_protocols.types import ToolCall

__all__ = [
    "INSTALL_HINT",
    "VerifiersEnv",
    "VerifiersEnvError",
    "VerifiersMissingError",
    "finite_reward",
    "import_verifiers",
    "load_verifiers_env",
    "parse_env_args",
]

INSTALL_HINT = "pip install 'tempering[verifiers]'"


class VerifiersMissingError(ImportError):
    """The ``verifiers`` package (0.3.x, the classic environments) is not importable."""


class VerifiersEnvError(RuntimeError):
    """A verifiers environment failed (raised, hung, errored, or gave a reward that is not a
    finite number); the message names the env. The RL loop counts it as a failed rollout."""


def import_verifiers() -> Any:
    """The ``verifiers`` module with its classic API (``vf.MultiTurnEnv``, ``vf.Client``, ...);
    :class:`VerifiersMissingError` naming the install line when it is absent or too new."""
    try:
        vf = importlib.import_module("verifiers")
    except ImportError as exc:
        raise VerifiersMissingError(
            f"verifiers environments need the `verifiers` package (0.3.x), which is not installed "
            f"({exc}): {INSTALL_HINT}"
        ) from exc
    try:
        ok = all(hasattr(vf, name) for name in ("MultiTurnEnv", "Client", "load_environment"))
    except ImportError as exc:  # an alias whose dependencies are missing
        raise VerifiersMissingError(
            f"verifiers is installed but its classic API does not import ({exc}): {INSTALL_HINT}"
        ) from exc
    if not ok:
        version = getattr(vf, "__version__", "?")
        raise VerifiersMissingError(
            f"verifiers {version} has no classic environment API (vf.MultiTurnEnv, vf.Client); tempering "
            f"runs the environments of verifiers 0.3.x: {INSTALL_HINT}"
        )
    return vf


def parse_env_args(text: str, env_name: str) -> dict[str, Any]:
    """``--verifiers-env-args``: a JSON object of keyword arguments for ``load_environment``."""
    try:
        return loads_object(text or "{}")
    except NotJSONObjectError as exc:
        raise ValueError(
            f"the arguments of verifiers env {env_name!r} are not JSON keyword arguments: {text!r} is {exc}; "
            "give a JSON object, e.g. '{\"num_examples\": 10}'"
        ) from None


_LOADED: dict[tuple[str, str], Any] = {}
"""(name, canonical JSON of its arguments) → the loaded environment, one per process."""


def load_verifiers_env(name: str, args: Mapping[str, Any] | None = None) -> Any:
    """The installed verifiers environment ``name`` (``vf.load_environment``: imports the module
    ``name`` with ``-`` as ``_`` and calls its ``load_environment(**args)``), loaded once per
    process and argument set. A name that does not import, or an env that is not a classic
    multi-turn env, is a :class:`ValueError` naming it and what to do."""
    if not name:
        raise ValueError("no verifiers environment named: give its name, e.g. --verifiers-env wordle")
    vf = import_verifiers()
    key = (name, json.dumps(dict(args or {}), sort_keys=True))
    if key in _LOADED:
        return _LOADED[key]
    module = name.replace("-", "_").split("/")[-1]
    if importlib.util.find_spec(module) is None:
        raise ValueError(
            f"verifiers env {name!r}: no module {module!r} is installed. Install the environment's "
            f"package (from the Environments Hub: `vf-install OWNER/{name}`, or `pip install` its "
            "wheel; docs/verifiers.md) or put its directory on PYTHONPATH"
        )
    try:
        env = vf.load_environment(name, **dict(args or {}))
    except Exception as exc:
        cause = exc.__cause__ or exc
        raise ValueError(
            f"verifiers env {name!r} failed to load with arguments {dict(args or {})}: "
            f"{type(cause).__name__}: {cause}"
        ) from exc
    if not isinstance(env, vf.MultiTurnEnv):
        raise ValueError(
            f"verifiers env {name!r} is a {type(env).__name__}, not a classic vf.MultiTurnEnv "
            "(SingleTurnEnv, ToolEnv, ... are); tempering cannot drive its turns"
        )
    _LOADED[key] = env
    return env


def _text(content: object, env_name: str) -> str:
    """A verifiers message content (text, or a list of parts) as text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out: list[str] = []
        for part in cast(list[object], content):
            kind = _get(part, "type")
            if kind != "text":
                raise VerifiersEnvError(
                    f"verifiers env {env_name!r} sent a {kind!r} content part; tempering renders text only"
                )
            out.append(str(_get(part, "text") or ""))
        return "".join(out)
    return str(content)


def _get(obj: object, key: str) -> Any:
    """A field of a verifiers value: a pydantic model or a plain dict."""
    if isinstance(obj, Mapping):
        return cast(Mapping[str, Any], obj).get(key)
    return getattr(obj, key, None)


def to_messages(vf_messages: Sequence[object], env_name: str) -> list[Message]:
    """Verifiers messages (pydantic or dicts) as tempering messages."""
    out: list[Message] = []
    call_names: dict[str, str] = {}
    for m in vf_messages:
        role = str(_get(m, "role"))
        message = Message(role=role, content=_text(_get(m, "content"), env_name))
        thinking = _get(m, "reasoning_content")
        if role == "assistant" and thinking:
            message["thinking"] = str(thinking)
        calls = _get(m, "tool_calls")
        if role == "assistant" and calls:
            message["tool_calls"] = []
            for c in cast(list[object], calls):
                call_id = str(_get(c, "id"))
                call = ToolCall(name=str(_get(c, "name")), arguments=str(_get(c, "arguments")), id=call_id)
                call_names[call_id] = call["name"]
                message["tool_calls"].append(call)
        call_id = _get(m, "tool_call_id")
        if role == "tool" and call_id is not None:
            message["tool_call_id"] = str(call_id)
            if str(call_id) in call_names:
                message["name"] = call_names[str(call_id)]
        out.append(message)
    return out


def finite_reward(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise VerifiersEnvError(f"{what} returned the reward {value!r}; rewards must be finite numbers")
    return float(value)


def rubric_metrics(state: Mapping[str, Any]) -> Metrics:
    """The rubric's per-function scores of a scored state as ``verifiers/<name>`` (finite ones)."""
    out: Metrics = {}
    for k, v in cast(Mapping[str, object], state.get("metrics") or {}).items():
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out[f"verifiers/{k}"] = v
    return out


class VerifiersEnv:
    """One rollout of a verifiers environment on one dataset row, played turn by turn by
    tempering's loop (see the module docstring). Single-use. ``score=False``: the group scores
    (the rubric has group-level reward functions)."""

    def __init__(
        self,
        env: Any,
        name: str,
        row: Mapping[str, Any],
        renderer: Renderer,
        *,
        timeout_s: float,
        score: bool = True,
    ) -> None:
        self.env = env
        self.name = name
        self.row = dict(row)
        self.renderer = renderer
        self.timeout_s = timeout_s
        self.score = score
        self.state: Any = None
        self._requests: asyncio.Queue[tuple[list[Message], asyncio.Future[Any]]] = asyncio.Queue()
        self._reply: asyncio.Future[Any] | None = None
        self._task: asyncio.Task[Any] | None = None
        self._observation: Observation = tinker.ModelInput.empty()
        self._turn = 0

    def _what(self) -> str:
        return f"verifiers env {self.name!r} (example {self.row.get('example_id', '?')})"

    def _stop(self) -> StopCondition:
        return self.renderer.get_stop_sequences()

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        vf = import_verifiers()
        client = _bridge_client(vf, self)
        self._task = asyncio.ensure_future(self.env.rollout(self.row, client, "tempering"))
        done = await self._next()
        if done is not None:
            raise VerifiersEnvError(f"{self._what()}: the rollout ended before asking the model for a reply")
        return self._observation, self._stop()

    async def ask(self, prompt: Sequence[object], tools: Sequence[object] | None) -> Any:
        """The bridge client's ``get_response``: queue the prompt, wait for the sampled reply."""
        messages = to_messages(prompt, self.name)
        if tools:
            declared = [
                Tool(
                    str(_get(t, "name")),
                    str(_get(t, "description") or ""),
                    dict(_get(t, "parameters") or {}),
                    _no_call,
                )
                for t in tools
            ]
            has_system = bool(messages) and messages[0]["role"] == "system"
            system = messages[0]["content"] if has_system else ""
            messages = [*tool_prefix(self.renderer, declared, system), *messages[int(has_system) :]]
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self._requests.put((messages, reply))
        return await reply

    async def _next(self) -> Any:
        """Run the env until it asks for a reply (``None``; the observation is set) or its rollout
        ends (the finished state); a :class:`VerifiersEnvError` if it raises or hangs."""
        assert self._task is not None
        get = asyncio.ensure_future(self._requests.get())
        done, _ = await asyncio.wait(
            {get, self._task}, timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if get in done:
            messages, self._reply = get.result()
            self._observation = self.renderer.build_generation_prompt(messages)
            return None
        get.cancel()
        if self._task not in done:
            self.close()
            raise VerifiersEnvError(
                f"{self._what()} took longer than {self.timeout_s:g} s to answer turn {self._turn} (a hang?)"
            )
        exc = self._task.exception()
        if exc is not None:
            raise VerifiersEnvError(f"{self._what()} raised {type(exc).__name__}: {exc}") from exc
        state = self._task.result()
        error = state.get("error")
        if error is not None:
            cause = getattr(error, "__cause__", None) or error
            raise VerifiersEnvError(
                f"{self._what()} ended its rollout with an error: {type(error).__name__} "
                f"({type(cause).__name__}: {cause})"
            )
        return state

    async def step(self, action: Action, /) -> StepResult:
        if self._reply is None:
            raise RuntimeError(
                f"{self._what()}: step() without a pending turn (the episode is over; envs are single-use)"
            )
        vf = import_verifiers()
        message, parsed = self.renderer.parse_response(action)
        self._turn += 1
        reply, self._reply = self._reply, None
        reply.set_result(_response(vf, message, parsed, self._observation.length, len(action), self._turn))
        state = await self._next()
        if state is None:
            return StepResult(
                0.0, False, self._observation, self._stop(), {"verifiers/parse_error": int(not parsed)}
            )
        self.state = state
        metrics: Metrics = {"verifiers/parse_error": int(not parsed), "verifiers/turns": self._turn}
        reward = 0.0
        if self.score:
            try:
                await asyncio.wait_for(self.env.rubric.score_rollout(state), self.timeout_s)
                await self.env.rubric.cleanup(state)
            except TimeoutError as exc:
                raise VerifiersEnvError(
                    f"{self._what()}: its rubric took longer than {self.timeout_s:g} s"
                ) from exc
            except Exception as exc:
                raise VerifiersEnvError(
                    f"{self._what()}: its rubric raised {type(exc).__name__}: {exc}"
                ) from exc
            reward = finite_reward(state.get("reward"), f"{self._what()}'s rubric")
            metrics |= rubric_metrics(state)
            metrics["verifiers/passed"] = int(reward >= float(getattr(self.env, "pass_threshold", 0.5)))
        return StepResult(reward, True, tinker.ModelInput.empty(), self._stop(), metrics)

    def close(self) -> None:
        """Cancel the env's rollout if it is still running (an episode the loop abandoned)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()


def _no_call(**_: object) -> object:
    raise RuntimeError("a verifiers tool is called by its env, not by tempering")


def _response(
    vf: Any, message: Message, parsed: bool, prompt_tokens: int, completion_tokens: int, turn: int
) -> Any:
    """The sampled reply as a ``vf.Response`` (text, thinking, tool calls, usage)."""
    calls = [
        vf.ToolCall(id=c.get("id") or f"call_{turn}_{i}", name=c["name"], arguments=c["arguments"])
        for i, c in enumerate(message.get("tool_calls", []))
    ]
    finish = "tool_calls" if calls else ("stop" if parsed else "length")
    return vf.Response(
        id=f"tempering-{turn}",
        created=0,
        model="tempering",
        usage=vf.Usage(
            prompt_tokens=prompt_tokens,
            reasoning_tokens=0,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        ),
        message=vf.ResponseMessage(
            content=message.get("content", ""),
            reasoning_content=message.get("thinking"),
            tool_calls=calls or None,
            finish_reason=finish,
            is_truncated=not parsed,
        ),
    )


def _bridge_client(vf: Any, env: VerifiersEnv) -> Any:
    """A ``vf.Client`` whose ``get_response`` is answered by tempering's loop through ``env``."""

    async def get_response(
        self: object,
        prompt: Sequence[object],
        model: str,
        sampling_args: object,
        tools: Sequence[object] | None = None,
        **kwargs: object,
    ) -> Any:
        del self, model, sampling_args, kwargs
        return await env.ask(prompt, tools)

    def unused(*_: object, **__: object) -> Any:
        raise NotImplementedError("tempering's bridge client answers get_response only")

    async def close(self: object) -> None:
        del self

    methods: dict[str, Any] = {
        "get_response": get_response,
        "close": close,
        **{
            m: unused
            for m in (
                "setup_client",
                "to_native_tool",
                "to_native_prompt",
                "get_native_response",
                "raise_from_native_response",
                "from_native_response",
            )
        },
    }
    cls = type("TemperingBridgeClient", (vf.Client,), methods)
    return cls(object())
