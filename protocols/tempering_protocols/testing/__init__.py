"""The conformance kit: run your implementation of a tempering protocol through its contract.

Each ``check_*`` function exercises one kind of implementation and raises
:class:`ConformanceError` (an ``AssertionError``) whose message starts with the id of the
broken rule, e.g. ``[env/step-after-done] MyEnv accepted step() after episode_done ...``.
The functions are synchronous (they run ``asyncio.run``); inside a running event loop await the
``acheck_*`` variants instead. Each awaited call into the implementation has a time limit
(:data:`DEFAULT_CALL_TIMEOUT_S`, changed with :func:`call_timeout`): one that does not return
fails with its ``*/timeout`` rule instead of hanging. The rule ids are listed in docs/protocols.md.

With pytest, the ``conformance`` fixture (from this package's plugin) carries the same
functions, and ``--tempering-conformance=pkg.module:obj`` adds one test per named object.

Example::

    from tempering_protocols.testing import check_env_group_builder

    def test_reverse_group():
        check_env_group_builder(ReverseGroup(prompt=(5, 6, 7)))
"""

from tempering_protocols.testing._base import DEFAULT_CALL_TIMEOUT_S, ConformanceError, call_timeout
from tempering_protocols.testing._dispatch import CHECKS, Kind, check_conformance, detect_kind
from tempering_protocols.testing._policies import (
    acheck_message_completer,
    acheck_token_completer,
    check_message_completer,
    check_token_completer,
)
from tempering_protocols.testing._rendering import DEFAULT_CONVERSATION, check_renderer
from tempering_protocols.testing._rl import (
    ActionPolicy,
    acheck_env,
    acheck_env_group_builder,
    acheck_rl_dataset,
    acheck_rl_dataset_builder,
    check_env,
    check_env_group_builder,
    check_rl_dataset,
    check_rl_dataset_builder,
    default_actions,
)
from tempering_protocols.testing._rules import RULES
from tempering_protocols.testing._sandbox import KIT_PROGRAMS, acheck_sandbox, check_sandbox
from tempering_protocols.testing._structure import (
    check_class_implements,
    check_object_implements,
    protocol_members,
)
from tempering_protocols.testing._supervised import check_supervised_dataset, check_supervised_dataset_builder

__all__ = [
    "CHECKS",
    "DEFAULT_CALL_TIMEOUT_S",
    "DEFAULT_CONVERSATION",
    "KIT_PROGRAMS",
    "RULES",
    "ActionPolicy",
    "Conformance",
    "ConformanceError",
    "Kind",
    "acheck_env",
    "acheck_env_group_builder",
    "acheck_message_completer",
    "acheck_rl_dataset",
    "acheck_rl_dataset_builder",
    "acheck_sandbox",
    "acheck_token_completer",
    "call_timeout",
    "check_class_implements",
    "check_conformance",
    "check_env",
    "check_env_group_builder",
    "check_message_completer",
    "check_object_implements",
    "check_renderer",
    "check_rl_dataset",
    "check_rl_dataset_builder",
    "check_sandbox",
    "check_supervised_dataset",
    "check_supervised_dataset_builder",
    "check_token_completer",
    "default_actions",
    "detect_kind",
    "protocol_members",
]


class Conformance:
    """The whole kit as one object: what the pytest fixture ``conformance`` returns.

    Example::

        def test_my_env(conformance):
            conformance.check_env(MyEnv())
            conformance.check(MyGroupBuilder())  # kind detected from its members
    """

    check = staticmethod(check_conformance)
    check_env = staticmethod(check_env)
    acheck_env = staticmethod(acheck_env)
    check_env_group_builder = staticmethod(check_env_group_builder)
    acheck_env_group_builder = staticmethod(acheck_env_group_builder)
    check_rl_dataset = staticmethod(check_rl_dataset)
    acheck_rl_dataset = staticmethod(acheck_rl_dataset)
    check_rl_dataset_builder = staticmethod(check_rl_dataset_builder)
    acheck_rl_dataset_builder = staticmethod(acheck_rl_dataset_builder)
    check_supervised_dataset = staticmethod(check_supervised_dataset)
    check_supervised_dataset_builder = staticmethod(check_supervised_dataset_builder)
    check_renderer = staticmethod(check_renderer)
    check_token_completer = staticmethod(check_token_completer)
    acheck_token_completer = staticmethod(acheck_token_completer)
    check_message_completer = staticmethod(check_message_completer)
    acheck_message_completer = staticmethod(acheck_message_completer)
    check_sandbox = staticmethod(check_sandbox)
    acheck_sandbox = staticmethod(acheck_sandbox)
    check_class_implements = staticmethod(check_class_implements)
    check_object_implements = staticmethod(check_object_implements)
