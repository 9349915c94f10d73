"""``--dataset-builder module.path:Name``: a builder written outside tempering (tests/user_builders,
put on ``PYTHONPATH``) trains from the command line; its fields are flags; a non-conforming
object, a bad module and a bad attribute are refused with messages naming them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tempering.cli import main
from tempering.cli.builders import BuilderError, load_builder, split_builder_flag, with_dataset_builder
from tempering.cli.rl import RLCommandConfig
from tempering.preference import DPOConfig
from tempering.rl.train import RLConfig
from tempering.sft import SFTConfig

USER_DIR = Path(__file__).parent / "user_builders"


@pytest.fixture
def user_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(USER_DIR))


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "TEMPERING_HOME": str(home), "TEMPERING_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(USER_DIR), env.get("PYTHONPATH", "")])
    env.pop("TINKER_API_KEY", None)
    return env


@pytest.mark.timeout(300)
def test_user_rl_builder_trains_from_the_command_line(local_root: Path, tmp_path: Path) -> None:
    log_dir = tmp_path / "rl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tempering.cli",
            "rl",
            "--num-steps",
            "2",
            "--dataset-builder",
            "my_builders:LetterBuilder",
            "--dataset.group-size",
            "4",
            "--dataset.letters",
            "abab",
            "--max-tokens",
            "4",
            f"--run.log-dir={log_dir}",
            "--run.no-progress",
            "--run.eval-every=0",
            "--loss-fn",
            "gspo",
        ],
        env=_env(local_root),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = json.loads(proc.stdout.strip().splitlines()[-1])
    assert final["step"] == 1
    config = json.loads((log_dir / "config.json").read_text())
    assert config["dataset"]["letters"] == "abab"
    assert config["dataset"]["group_size"] == 4
    assert config["loss_fn"] == "gspo"
    lines = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    assert all("env/reward/mean" in line and "optim/loss_sum" in line for line in lines)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("command", "builder", "flags"),
    [
        ("sft", "my_builders:CopyBuilder", ["--data.n-words", "8", "--data.batch-size", "4"]),
        ("dpo", "my_builders:PoliteBuilder", ["--data.n-pairs", "4"]),
    ],
)
def test_user_sft_and_dpo_builders_train(
    command: str,
    builder: str,
    flags: list[str],
    user_path: None,
    tempering_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TEMPERING_HOME", str(tempering_home))
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    log_dir = tmp_path / command
    argv = [command, *flags, f"--dataset-builder={builder}", f"--run.log-dir={log_dir}", "--run.no-progress"]
    assert main([*argv, "--max-steps", "2"]) == 0
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert final["step"] == 1
    lines = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    assert all(float(line["loss"]) > 0 for line in lines), lines


def test_fields_become_flags_and_an_instance_gives_defaults(user_path: None) -> None:
    from tempering.cli import _tyro_cli

    cls, rest, finish = with_dataset_builder(
        "rl",
        RLCommandConfig,
        ["--run.log-dir", "r", "--dataset-builder", "my_builders:LETTERS_XY", "--dataset.batch-size", "1"],
    )
    config = finish(_tyro_cli(cls, rest, "tempering rl", "rl"))
    assert type(config) is RLConfig
    assert (config.dataset.letters, config.dataset.group_size, config.dataset.batch_size) == ("xyxy", 2, 1)
    cls, rest, finish = with_dataset_builder(
        "sft", SFTConfig, ["--dataset-builder=my_builders:CopyBuilder", "--run.log-dir", "r"]
    )
    config = finish(_tyro_cli(cls, rest, "tempering sft", "sft"))
    assert type(config) is SFTConfig
    train, test = config.data(config.model)()
    assert len(train) == 2
    assert test is None
    cls, rest, finish = with_dataset_builder(
        "dpo", DPOConfig, ["--run.log-dir", "r", "--dataset-builder", "my_builders:PoliteBuilder"]
    )
    assert type(finish(_tyro_cli(cls, rest, "tempering dpo", "dpo"))) is DPOConfig


def test_help_lists_the_builder_fields(user_path: None, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["rl", "--dataset-builder", "my_builders:LetterBuilder", "--help"])
    out = capsys.readouterr().out
    assert "--dataset.letters" in out
    assert "--dataset.group-size" in out


@pytest.mark.parametrize(
    ("command", "spec", "expected"),
    [
        ("rl", "my_builders:SyncRLBuilder", ["SyncRLBuilder", "RLDatasetBuilder", "must be async"]),
        ("rl", "my_builders:PlainBuilder", ["PlainBuilder", "not an attrs class or a dataclass"]),
        ("rl", "my_builders:NoCall", ["NoCall", "async def __call__(self)"]),
        (
            "sft",
            "my_builders:LetterBuilder",
            ["LetterBuilder", "SupervisedDatasetBuilder", "must not be async"],
        ),
        ("dpo", "my_builders:STOP", ["is a int", "ComparisonDatasetBuilder"]),
        ("rl", "no_such_module_xyz:Builder", ["cannot import module 'no_such_module_xyz'", "PYTHONPATH"]),
        ("rl", "my_builders:NoSuchBuilder", ["module 'my_builders' has no attribute 'NoSuchBuilder'"]),
        ("rl", "my_builders", ["expected module.path:Name"]),
    ],
)
def test_bad_builders_are_refused_by_name(
    command: str, spec: str, expected: list[str], user_path: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(BuilderError) as info:
        load_builder(spec, command) if ":" in spec else with_dataset_builder(
            command, RLConfig, ["--dataset-builder", spec]
        )
    for text in expected:
        assert text in str(info.value), str(info.value)
    assert main([command, "--dataset-builder", spec, "--run.log-dir", "r"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tempering {command}: --dataset-builder")
    assert expected[0] in err


def test_the_flag_is_found_anywhere_once() -> None:
    assert split_builder_flag(["a", "--dataset-builder", "m:X", "b"]) == ("m:X", ["a", "b"])
    assert split_builder_flag(["--dataset-builder=m:X"]) == ("m:X", [])
    assert split_builder_flag(["a"]) == (None, ["a"])
    with pytest.raises(BuilderError, match="twice"):
        split_builder_flag(["--dataset-builder", "m:X", "--dataset-builder=m:Y"])
    with pytest.raises(BuilderError, match="needs a value"):
        split_builder_flag(["--dataset-builder"])


def test_a_module_that_fails_on_import_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "broken_builders.py").write_text('raise RuntimeError("boom at import")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["rl", "--dataset-builder", "broken_builders:Builder", "--run.log-dir", "r"]) == 2
    err = capsys.readouterr().err
    assert "importing module 'broken_builders' failed: RuntimeError: boom at import" in err
