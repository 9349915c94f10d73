"""The run directory, LR schedules and Adam settings: pure bookkeeping, no model."""

from __future__ import annotations

import io
import json
import math
import pickle
from pathlib import Path

import attrs
import pytest

from tempering.backend import ModelConfig
from tempering.training import (
    AdamConfig,
    CheckpointRecord,
    FineTuningConfig,
    LRSchedule,
    ProgressBar,
    RunConfig,
    RunDir,
    RunExistsError,
    config_to_json,
    fine_tuning_adam,
    format_duration,
)


@attrs.frozen(kw_only=True)
class _Config:
    run: RunConfig
    model: ModelConfig = attrs.field(factory=ModelConfig)
    adam: AdamConfig = attrs.field(factory=AdamConfig)
    steps: int = 10


def _config(tmp_path: Path) -> _Config:
    return _Config(run=RunConfig(log_dir=str(tmp_path / "run")))


def test_schedules() -> None:
    const = LRSchedule("constant", warmup_steps=3)
    assert [const.multiplier(s, 10) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    linear = LRSchedule("linear")
    assert linear.multiplier(0, 10) == 1.0
    assert linear.multiplier(5, 10) == pytest.approx(0.5)
    cosine = LRSchedule("cosine", warmup_steps=2, min_lr_ratio=0.1)
    assert cosine.multiplier(2, 12) == pytest.approx(1.0)
    assert cosine.multiplier(7, 12) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert cosine.multiplier(12, 12) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="min_lr_ratio"):
        LRSchedule(min_lr_ratio=-1.0)


def test_adam_params() -> None:
    adam = AdamConfig(learning_rate=1e-3, weight_decay=0.1, grad_clip_norm=1.0, schedule=LRSchedule("linear"))
    p = adam.adam_params(5, 10)
    assert p.learning_rate == pytest.approx(5e-4)
    assert (p.weight_decay, p.grad_clip_norm, p.beta1, p.beta2) == (0.1, 1.0, 0.9, 0.95)


def test_fine_tuning_trainers_default_to_one_adam() -> None:
    """SFT, the reward model, DPO and top-K distillation share one default: the model's learning
    rate, two warmup steps, then a linear decay."""
    from tempering.preference import DPOConfig, RewardModelConfig
    from tempering.sft.offpolicy import TopKDistillConfig
    from tempering.sft.train import SFTConfig

    expected = AdamConfig(learning_rate=None, schedule=LRSchedule("linear", warmup_steps=2))
    assert fine_tuning_adam() == expected
    run = RunConfig(log_dir="unused")
    for config in (SFTConfig, RewardModelConfig, DPOConfig, TopKDistillConfig):
        assert config(run=run).adam == expected, config.__name__
    assert [expected.schedule.multiplier(s, 10) for s in (0, 1, 2, 6)] == pytest.approx(
        [1 / 3, 2 / 3, 1.0, 0.5]
    )


def test_fine_tuning_configs_share_one_base(tmp_path: Path) -> None:
    """SFT's, the reward model's, DPO's and top-K distillation's configs take run, model, Adam and
    the run's length from FineTuningConfig; ``resolved(stage)`` fills an unset learning rate from
    the model (lora or not) and keeps a given one; a config.json written with the fields in their
    former order (``data`` before ``adam``) still resumes."""
    from tempering.model_info import default_learning_rate
    from tempering.preference import DPOConfig, RewardModelConfig
    from tempering.sft.offpolicy import TopKDistillConfig
    from tempering.sft.train import SFTConfig

    shared = ["run", "model", "adam", "num_epochs", "max_steps"]
    assert [f.name for f in attrs.fields(FineTuningConfig)] == shared
    hub = "HuggingFaceTB/SmolLM2-135M-Instruct"
    for cls in (SFTConfig, RewardModelConfig, DPOConfig, TopKDistillConfig):
        assert issubclass(cls, FineTuningConfig), cls.__name__
        assert [f.name for f in attrs.fields(cls)][:5] == shared, cls.__name__
        config = cls(run=RunConfig(log_dir="unused"), model=ModelConfig(base_model=hub, lora_rank=0))
        resolved = config.resolved("sft")
        assert type(resolved) is cls
        assert resolved.adam.learning_rate == default_learning_rate(hub, "sft", lora=False)
        assert resolved.adam.learning_rate != default_learning_rate(hub, "sft", lora=True)
        assert attrs.evolve(resolved, adam=config.adam) == config
    given = DPOConfig(run=RunConfig(log_dir="unused"), adam=AdamConfig(learning_rate=3e-6))
    assert given.resolved("dpo") == given
    assert DPOConfig(run=RunConfig(log_dir="unused")).resolved("dpo").adam.learning_rate == (
        default_learning_rate("tempering/tiny", "dpo")
    )

    config = SFTConfig(run=RunConfig(log_dir=str(tmp_path / "sft")), max_steps=3)
    run, _ = RunDir.open(config.run.log_dir, config, "refuse")
    run.close()
    written = json.loads(run.config_path.read_text())
    former = ["__type__", "run", "model", "data", "adam", "num_epochs", "max_steps", "evals"]
    assert list(written)[: len(former)] != former  # the order did change
    reordered = {k: written[k] for k in former} | {k: v for k, v in written.items() if k not in former}
    run.config_path.write_text(json.dumps(reordered, indent=2) + "\n")
    _, resumed = RunDir.open(config.run.log_dir, config, "resume")
    assert resumed


def test_configs_pickle_and_serialize(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert pickle.loads(pickle.dumps(config)) == config
    raw = config_to_json(config)
    assert raw["__type__"].endswith("_Config")
    assert raw["adam"]["schedule"]["kind"] == "linear"
    json.dumps(raw)


def test_open_fresh_refuse_resume_overwrite(tmp_path: Path) -> None:
    config = _config(tmp_path)
    run, resumed = RunDir.open(config.run.log_dir, config, "refuse")
    assert not resumed
    assert run.config_path.is_file()
    run.append_metrics({"step": 0, "loss": 1.0})
    with pytest.raises(RunExistsError, match=r"--run\.if-exists resume"):
        RunDir.open(config.run.log_dir, config, "refuse")
    _, resumed = RunDir.open(config.run.log_dir, config, "resume")
    assert resumed
    other = attrs.evolve(config, steps=11)
    with pytest.raises(RunExistsError, match="fields steps"):
        RunDir.open(config.run.log_dir, other, "resume")
    # A different run section (e.g. if_exists itself) may change on resume.
    moved = attrs.evolve(config, run=attrs.evolve(config.run, if_exists="refuse"))
    assert RunDir.open(config.run.log_dir, moved, "resume", ignore_on_resume=frozenset({"run"}))[1]
    (run.path / "inspect").mkdir()
    (run.path / "inspect" / "evaluations.jsonl").write_text("{}\n")  # the old run's inspect logs
    run, resumed = RunDir.open(config.run.log_dir, other, "overwrite")
    assert not resumed
    assert run.read_metrics() == []
    assert not (run.path / "inspect").exists()


def test_metrics_truncate_and_torn_lines(tmp_path: Path) -> None:
    run, _ = RunDir.open(tmp_path / "r", _config(tmp_path))
    for step in range(5):
        run.append_metrics({"step": step, "loss": float(step)})
    with run.metrics_path.open("a") as f:
        f.write('{"step": 5, "lo')  # killed mid-write
    assert [m["step"] for m in run.read_metrics()] == [0, 1, 2, 3, 4]
    run.truncate_metrics(3)
    assert [m["step"] for m in run.read_metrics()] == [0, 1, 2]
    assert run.metrics_path.read_text().endswith("\n")


def test_checkpoint_index_and_state(tmp_path: Path) -> None:
    run, _ = RunDir.open(tmp_path / "r", _config(tmp_path))
    assert run.last_checkpoint() is None
    a = CheckpointRecord(name="step-000002", step=2, epoch=0, batch=2, state_path="tempering://x/weights/a")
    b = attrs.evolve(a, name="final", step=4, batch=4, final=True, sampler_path="s")
    run.add_checkpoint(a)
    run.add_checkpoint(b)
    assert run.checkpoints() == [a, b]
    assert run.last_checkpoint() == b
    run.update_state(reference_path="p")
    run.update_state(other=1)
    assert run.read_state() == {"reference_path": "p", "other": 1}


def test_progress_bar() -> None:
    out = io.StringIO()
    bar = ProgressBar(total=4, start=1, stream=out)
    for _ in range(3):
        bar.update(1, {"loss": 0.5, "lr": 1e-3, "other": 2.0})
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("step 4/4 [####################] 100%")
    assert "loss=0.5" in lines[-1]
    assert "lr=0.001" in lines[-1]
    assert "other" not in lines[-1]
    assert format_duration(3725) == "1:02:05"
    assert format_duration(65) == "1:05"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_is_a_rich_bar() -> None:
    out = _Terminal()
    bar = ProgressBar(total=4, start=1, stream=out)
    for _ in range(3):
        bar.update(1, {"loss": 0.5, "lr": 1e-3, "other": 2.0})
    bar.close()
    text = out.getvalue()
    assert "4/4" in text
    assert "loss=0.5 lr=0.001" in text
    assert "other" not in text
    assert "[####" not in text  # not the plain line of logs
