"""The backends and their capabilities (``tempering.backends``): the hosted service and the local
engine declare what differs between them, and a third backend (the test doubles of
``tests/fake_backend.py``, named nowhere in ``python/``) behaves as its capabilities declare in
every place that used to check for the hosted service: choosing the service, closing its
session, full training, deleting old checkpoints (``keep_last``), top-K distillation, DPO's
custom loss, the recipes' defaults and model checks, and the tokenizer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
import pytest
import tinker
from fake_backend import (  # pyright: ignore[reportMissingImports]  # tests/
    FAKE,
    FAKE_MODEL,
    FakeBackend,
    FakeSampler,
    FakeService,
)

import tempering
import tempering.backends
from tempering.backend import ModelConfig, close_service, end_session, load_tokenizer, uses_hosted_service
from tempering.backends import (
    BACKENDS,
    Backend,
    Capabilities,
    CapabilityError,
    backend_for_path,
    backend_of,
    require,
    selected_backend,
    serving,
)
from tempering.backends.hosted import HOSTED
from tempering.backends.local import LOCAL
from tempering.training.retention import checkpoint_remover
from tempering_protocols import (
    Action,
    Env,
    EnvGroupBuilder,
    Observation,
    RLDataset,
    StepResult,
    StopCondition,
)


def test_the_two_listed_backends_declare_what_differs() -> None:
    assert BACKENDS[0] is HOSTED  # chosen first when TINKER_API_KEY is set
    assert BACKENDS[-1] is LOCAL  # the fallback
    hosted, local = HOSTED.capabilities, LOCAL.capabilities
    assert (hosted.full_training, local.full_training) == (False, True)
    assert (hosted.custom_loss_passes, local.custom_loss_passes) == (2, 1)
    assert (hosted.checkpoint_ttl, local.checkpoint_ttl) == (True, False)
    assert (hosted.checkpoint_schemes, local.checkpoint_schemes) == (("tinker://",), ("tempering://",))
    assert (hosted.trainer_deletes_checkpoints, local.trainer_deletes_checkpoints) == (False, True)
    assert (hosted.session_close, local.session_close) == ("status", "plain")
    assert (hosted.builtin_models, local.builtin_models) == (frozenset(), frozenset({"tempering/tiny"}))
    assert (hosted.extra, local.extra) == (None, "local")
    assert all(c.topk_logprobs and c.custom_loss for c in (hosted, local))


def test_the_environment_selects_hosted_or_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    assert selected_backend() is LOCAL
    assert not uses_hosted_service()
    monkeypatch.setenv("TINKER_API_KEY", "tml-not-a-real-key")
    assert selected_backend() is HOSTED
    assert uses_hosted_service()
    assert serving("tempering/tiny") is LOCAL
    assert serving("Qwen/Qwen3-8B") is None


def test_clients_are_recognised_by_their_backend(tmp_path: Path) -> None:
    from tempering.local import ServiceClient

    local = ServiceClient(root=tmp_path)
    try:
        assert backend_of(local) is LOCAL
    finally:
        local.close()
    hosted = tinker.TrainingClient.__new__(tinker.TrainingClient)  # no connection: only its type
    assert backend_of(hosted) is HOSTED
    assert backend_of(FakeService()) is FAKE
    assert backend_of(FakeSampler(np.random.default_rng(0))) is FAKE
    assert backend_of(object()) is None


def test_checkpoint_paths_find_their_backend() -> None:
    assert backend_for_path("tinker://r/weights/a") is HOSTED
    assert backend_for_path("tempering://r/weights/a") is LOCAL
    assert backend_for_path("/some/checkpoint/dir") is LOCAL
    assert backend_for_path("fake://run/weights/a", FakeService()) is FAKE
    with pytest.raises(
        ValueError, match=r"'gs://b/x': no backend declares its scheme \(known: tempering://, tinker://\)"
    ):
        backend_for_path("gs://b/x")


def test_capabilities_refuse_a_malformed_declaration() -> None:
    with pytest.raises(ValueError, match=r"checkpoint_schemes: \['tinker'\] must each end in '://'"):
        Capabilities(checkpoint_schemes=("tinker",))
    with pytest.raises(ValueError, match="custom_loss_passes must be 1 or 2, got 3"):
        Capabilities(custom_loss_passes=3)


def test_a_session_closes_as_its_backend_declares() -> None:
    service = FakeService()
    end_session(service, RuntimeError("the run failed"))  # "status" close: the SDK's close(status)
    end_session(service, KeyboardInterrupt())
    close_service(service)
    assert service.closed == ["errored", "interrupted", "success"]


def test_full_training_is_refused_where_the_backend_lacks_it() -> None:
    model = ModelConfig(base_model=FAKE_MODEL, lora_rank=0)
    with pytest.raises(CapabilityError, match=r"Capabilities\.full_training\); the fake backend does not"):
        asyncio.run(model.create_training_client(FakeService()))  # pyright: ignore[reportArgumentType]
    trainer = asyncio.run(
        ModelConfig(base_model=FAKE_MODEL, lora_rank=4).create_training_client(FakeService())  # pyright: ignore[reportArgumentType]
    )
    assert backend_of(trainer) is FAKE


def test_topk_distillation_and_dpo_are_refused_without_the_capability() -> None:
    from tempering.sft.topk_distill import teacher_topk

    with pytest.raises(
        CapabilityError, match=r"top-K distillation .* needs topk logprobs, which the fake backend"
    ):
        asyncio.run(teacher_topk(FakeSampler(np.random.default_rng(0)), [1, 2, 3], k=2))  # pyright: ignore[reportArgumentType]
    trainer = FakeService().create_lora_training_client(FAKE_MODEL).result()
    with pytest.raises(CapabilityError, match=r"DPO .* needs custom loss, .*the local engine support it"):
        require(trainer, "custom_loss", "DPO (its loss goes through forward_backward_custom)")
    require(object(), "custom_loss", "anything")  # a client no backend declares is tried as it is


def test_keep_last_deletes_through_the_backend_of_the_path(caplog: pytest.LogCaptureFixture) -> None:
    trainer = FakeService().create_lora_training_client(FAKE_MODEL).result()
    path = trainer.save_state("step-1").result().path
    checkpoint_remover(trainer)(path)
    assert trainer.store.removed == [path]
    remove = checkpoint_remover(trainer)
    with caplog.at_level(logging.WARNING), pytest.raises(Exception, match="tinker://r/weights/a"):
        remove("tinker://r/weights/a")  # the hosted service's: kept, said once
    assert "on the hosted Tinker service are not deleted by the trainer" in caplog.text


@attrs.frozen
class _Echo(EnvGroupBuilder):
    index: int

    async def make_envs(self) -> Sequence[Env]:
        return [_OneStep() for _ in range(2)]


class _OneStep(Env):
    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return tinker.ModelInput.from_ints([1, 2, 3]), [0]

    async def step(self, action: Action, /) -> StepResult:
        return StepResult(
            reward=float(len(action) % 2),
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=[0],
        )


@attrs.frozen
class _EchoData:
    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        return [_Echo(index * 2 + i) for i in range(2)]

    def __len__(self) -> int:
        return 100


@attrs.frozen
class _EchoBuilder:
    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return _EchoData(), None


def test_an_rl_run_on_the_third_backend_prunes_its_checkpoints(tmp_path: Path) -> None:
    from tempering.rl.rollouts import RolloutConfig
    from tempering.rl.train import RLConfig, train
    from tempering.training import AdamConfig, RunConfig

    config = RLConfig(
        run=RunConfig(log_dir=str(tmp_path / "run"), save_every=1, eval_every=0, progress=False, keep_last=1),
        dataset=_EchoBuilder(),
        model=ModelConfig(base_model=FAKE_MODEL, lora_rank=4),
        adam=AdamConfig(learning_rate=1e-5),
        num_steps=3,
        rollout=RolloutConfig(),
    )
    service = FakeService((1, 6))
    asyncio.run(train(config, service=service))  # pyright: ignore[reportArgumentType]
    (trainer,) = service.trainers
    assert trainer.steps == 3
    assert trainer.store.removed  # deleted through the fake backend, not the local store
    assert all(p.startswith("fake://") for p in trainer.store.removed)
    assert not any("step-1" in p for p in trainer.store.saved)


def test_a_selected_third_backend_drives_the_service_and_the_recipes(monkeypatch: pytest.MonkeyPatch) -> None:
    from tempering.recipes._common import default_lora_rank, recipe_learning_rate, recipe_service

    chosen = FakeBackend(selected=True)
    monkeypatch.setattr(tempering.backends, "BACKENDS", (chosen, HOSTED, LOCAL))
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    assert selected_backend() is chosen
    assert not uses_hosted_service()
    assert isinstance(tempering.service_client(), FakeService)
    assert default_lora_rank("tempering/tiny", None) == 32  # no full training here: LoRA
    assert recipe_learning_rate("tempering/tiny", None) != 2e-3  # not the tiny full fine-tune rate
    with pytest.raises(
        ValueError,
        match=(
            r"FAKE_BACKEND is set \(fake backend\) but --base-model is 'tempering/tiny', which only the "
            r"local engine has: .*e\.g\. --base-model fake/echo, or unset TINKER_API_KEY"
        ),
    ):
        recipe_service("tempering/tiny")
    assert isinstance(recipe_service(FAKE_MODEL), FakeService)
    assert load_tokenizer(FAKE_MODEL).encode("ab") == load_tokenizer("tempering/tiny").encode("ab")


def test_a_backend_must_say_how_to_connect() -> None:
    with pytest.raises(NotImplementedError, match="a backend must say how to connect"):
        Backend().connect()


def test_distillation_refuses_a_teacher_only_another_backend_serves(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tempering.recipes.distill import OnPolicyDistillRecipe

    monkeypatch.setenv("TINKER_API_KEY", "tml-not-a-real-key")
    recipe = OnPolicyDistillRecipe(out=str(tmp_path / "run"), progress=False)
    with pytest.raises(
        ValueError,
        match=(
            r"TINKER_API_KEY is set \(hosted service\) but --teacher-model is 'tempering/tiny', which only "
            r"the local engine has: pass --teacher-model with a model the hosted Tinker service serves, "
            r"e\.g\. .*, or unset TINKER_API_KEY to run locally, or --teacher$"
        ),
    ):
        asyncio.run(recipe())
    assert not (tmp_path / "run").exists()
