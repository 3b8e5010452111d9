# torch_overlay: one entry point for humans and CI.
# `make test` sets everything up on a fresh machine (idempotent) and runs the suite
# against the overlay AND the patched wheel, then checks the upstream export.

PYTHON_BOOT ?= python3.11
# The base torch release, pinned in ONE file that everything reads.
BASE_TORCH := $(shell cat torch_overlay/_overlay/base_version.txt)
VENV := .venv
PY := $(abspath $(VENV))/bin/python
STAMP := $(VENV)/.torch_overlay-installed
BUILD := build
export TORCH_OVERLAY_CACHE_DIR ?= $(abspath $(BUILD))/overlay-cache
PYTEST_ARGS ?=

.PHONY: venv test test-overlay test-wheel wheel wheel-venv export export-check status edit refresh clean

$(STAMP): torch_overlay/_overlay/base_version.txt pyproject.toml setup.py torch_overlay.pth
	test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --upgrade "pip>=23" "setuptools>=68" wheel
	$(PY) -m pip install "torch==$(BASE_TORCH)"
	$(PY) -m pip install --no-build-isolation -e ".[test]"
	$(PY) -m torch_overlay install-pth
	$(PY) -m torch_overlay materialize
	touch $@

venv: $(STAMP)

test: test-overlay test-wheel export-check

test-overlay: venv
	TORCH_OVERLAY=1 TORCH_OVERLAY_EXPECT=overlay $(PY) -m pytest test $(PYTEST_ARGS)

status: venv
	$(PY) -m torch_overlay status

edit: venv
	$(PY) -m torch_overlay edit

refresh: venv
	$(PY) -m torch_overlay refresh

clean:
	rm -rf $(BUILD) dist
