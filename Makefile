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
# The behaviour diff (tools/behaviour_diff/): extra arguments in DIFF_ARGS.
BEHAVIOUR_DIFF := tools/behaviour_diff/diff_upstream.py
DIFF_ARGS ?=


.PHONY: agree-overlay-wheel agree-overlay-wheel-probes test-sweep-sample
.PHONY: venv ext lint test test-overlay test-wheel wheel wheel-venv export export-check export-check-imports status edit refresh clean demo bench-guards bench-load bench-load-serving bench-transformers-first-token bench-distributed-first-step bench-calls bench-signing fuzz
.PHONY: valgrind bench-call-instructions check-call-instructions

# Other supported bases (a series in patches/v<BASE>/series; the overlay picks the
# series of the installed torch): `make venv BASE=2.6.0` / `make test BASE=2.6.0`
# use .venv-<BASE> instead of .venv (see "Other supported bases" further down).
# rebase-check's BASE is any release, not a supported base.
SUPPORTED_BASES := $(patsubst patches/v%/series,%,$(wildcard patches/v*/series))
OTHER_BASE := $(if $(filter rebase-check,$(MAKECMDGOALS)),,$(filter-out $(BASE_TORCH),$(BASE)))
ifneq ($(OTHER_BASE),)
ifeq ($(filter $(OTHER_BASE),$(SUPPORTED_BASES)),)
$(error BASE=$(OTHER_BASE) has no series (patches/v$(OTHER_BASE)/series); supported bases: $(SUPPORTED_BASES))
endif
endif

# The C++ extension (torch_overlay/csrc/ and the compat layer's glue, see setup.py),
# built in place in the compat layer: torch_overlay/compat/_functorch/ holds the
# torch._functorch module it provides.
EXT_SUFFIX := $(shell $(if $(wildcard $(PY)),$(PY),$(PYTHON_BOOT)) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
EXT_SRCS := $(shell find torch_overlay/csrc torch_overlay/compat/csrc -name '*.cpp' -o -name '*.h')
EXT_SO := torch_overlay/compat/_functorch/_interpreter_serialization_C$(EXT_SUFFIX)

# nlohmann/json, the JSON library upstream's C++ uses (torch 2.7.1 does not ship its
# header): Debian's header-only package, installed from the registry when missing.
NLOHMANN_JSON_HEADER := /usr/include/nlohmann/json.hpp

$(NLOHMANN_JSON_HEADER):
	@echo "$@ is missing: installing Debian's nlohmann-json3-dev (nlohmann/json headers) for the C++ extension"
	apt-get update && apt-get install -y nlohmann-json3-dev

# `pip install -e` also builds the C++ extension in place (setup.py), with ninja,
# which is installed first for that reason.
$(STAMP): torch_overlay/_overlay/base_version.txt pyproject.toml setup.py torch_overlay.pth | $(NLOHMANN_JSON_HEADER)
	test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --upgrade "pip>=23" "setuptools>=68" wheel
	$(PY) -m pip install "torch==$(BASE_TORCH)" ninja
	$(PY) -m pip install --no-build-isolation -e ".[test]"
	$(PY) -m torch_overlay install-pth
	$(PY) -m torch_overlay materialize
	touch $@

# The model zoo's libraries (test/dynamo/test_package_zoo.py): torchvision is the
# release built for the base torch; transformers does not depend on torch. Own
# stamps, so that an existing venv gets them too.
ZOO_TORCHVISION := 0.22.1
ZOO_TRANSFORMERS := 4.52.4
ZOO_STAMP := $(VENV)/.zoo-deps-installed

$(ZOO_STAMP): $(STAMP)
	$(PY) -m pip install "torch==$(BASE_TORCH)" "torchvision==$(ZOO_TORCHVISION)" "transformers==$(ZOO_TRANSFORMERS)"
	touch $@

ifeq ($(OTHER_BASE),)
venv: $(STAMP) $(EXT_SO) $(ZOO_STAMP)
else
venv: base-venv
endif

# Rebuilds the extension after a change to its sources (never done at import).
$(EXT_SO): $(EXT_SRCS) setup.py | $(STAMP) $(NLOHMANN_JSON_HEADER)
	$(PY) setup.py -q build_ext --inplace

# `make ext BASE=X.Y.Z` builds another base's (its rule is further down).
ifeq ($(OTHER_BASE),)
ext: $(EXT_SO)
endif

# NOTE: [What make test runs]
# CI gives `make test` 50 of its 90 minutes on a 2-core machine. It runs the
# suites side by side (-j2: the overlay's in the dev venv, the wheel's in its
# own; neither shares a cache directory with the other), each one's output
# printed whole when it finishes (--output-sync=target), with the transformers
# sweep's sample and the export's import check in the same two slots (a clean
# clone: 52 minutes, README); then the checks that read both. Three things are left to the
# nightly workflow, which runs each of them whole:
# - tests marked @slowTest (upstream's decorator; PYTORCH_TEST_WITH_SLOW=1 runs
#   them): the serving zoo's long tail, 4 ranks, the Inductor variants of tests
#   whose eager or aot_eager variants run here;
# - on the wheel, the files that decode or train real models in fresh processes
#   (WHEEL_FILES_LEFT_TO_NIGHTLY): the overlay's suite runs them here, on the same
#   patched sources;
# - the precompile probes and distributed jobs of the overlay/wheel agreement
#   (~11 minutes an environment): here the two agree on every test both ran and
#   on every guard probe.
SWEEP_SAMPLE := test/overlay/test_transformers_sweep.py::TestTransformersSweepSample
WHEEL_FILES_LEFT_TO_NIGHTLY := test/dynamo/test_package_serving.py test/dynamo/test_package_zoo.py \
	test/dynamo/test_package_launchers.py test/distributed
ifeq ($(OTHER_BASE),)
test: lint
	$(MAKE) -j2 --output-sync=target test-overlay test-wheel test-sweep-sample export-check-imports \
		OVERLAY_PYTEST_ARGS="--deselect $(SWEEP_SAMPLE)" \
		WHEEL_PYTEST_ARGS="$(addprefix --ignore=,$(WHEEL_FILES_LEFT_TO_NIGHTLY))"
	$(MAKE) agree-overlay-wheel check-call-instructions AGREE_ARGS="--no-precompile-probes --no-distributed"
else
test: test-base
endif

# Lint as upstream does (configuration in pyproject.toml): ruff with upstream
# pytorch's rule selection over the whole tree, and mypy on the mirrored torch
# modules as torch modules of the patched torch (build_scripts/typecheck.py).
# Both pinned, installed into the dev venv.
RUFF_VERSION := 0.14.14
MYPY_VERSION := 1.16.1
LINT_STAMP := $(VENV)/.lint-ruff-$(RUFF_VERSION)-mypy-$(MYPY_VERSION)

$(LINT_STAMP): $(STAMP)
	$(PY) -m pip install "ruff==$(RUFF_VERSION)" "mypy==$(MYPY_VERSION)"
	touch $@

lint: $(LINT_STAMP)
	$(PY) -m ruff check .
	$(PY) build_scripts/typecheck.py --view $(BUILD)/typing-view

# The overlay and the patched wheel deliver the same patches, so they must agree on
# every test (the junit XML of the two runs below, read back) and every guard and
# precompile probe decision, by the behaviour diff's one rule (NOTE: [What counts
# as a disagreement] in tools/behaviour_diff/diff_upstream.py); exit 1 otherwise.
# Report: $(BUILD)/diff-overlay-wheel/report.md. It reads the junit XML that
# test-overlay and test-wheel wrote (`make test` runs them first), and runs the
# probes itself.
agree-overlay-wheel: venv wheel-venv
	$(PY) $(BEHAVIOUR_DIFF) --out $(BUILD)/diff-overlay-wheel \
		--envs overlay,wheel --require-agreement overlay,wheel \
		--junit overlay=$(BUILD)/junit/overlay.xml --junit wheel=$(BUILD)/junit/wheel.xml $(AGREE_ARGS) $(DIFF_ARGS)

# The nightly's share of the agreement: every guard and precompile probe and the
# distributed jobs, on the overlay and the wheel (no suite runs).
agree-overlay-wheel-probes: venv wheel-venv
	$(PY) $(BEHAVIOUR_DIFF) --out $(BUILD)/diff-overlay-wheel-probes \
		--envs overlay,wheel --require-agreement overlay,wheel --no-tests $(DIFF_ARGS)

test-overlay: venv
	mkdir -p $(BUILD)/junit
	TORCH_OVERLAY=1 TORCH_OVERLAY_EXPECT=overlay $(PY) -m pytest test --junitxml=$(BUILD)/junit/overlay.xml $(OVERLAY_PYTEST_ARGS) $(PYTEST_ARGS)

# The transformers sweep's CI sample alone (`make test` runs it beside the suites).
test-sweep-sample: venv
	mkdir -p $(BUILD)/junit
	TORCH_OVERLAY=1 TORCH_OVERLAY_EXPECT=overlay $(PY) -m pytest $(SWEEP_SAMPLE) --junitxml=$(BUILD)/junit/sweep-sample.xml $(PYTEST_ARGS)

# The patched wheel: dist/torch-$(BASE_TORCH)+overlay.<YYYYMMDD>.<series hash>-<tags>.whl, and a
# fresh venv holding it (and neither torch_overlay nor the overlay's .pth) to test it in.
WHEEL_VENV := $(BUILD)/wheel-venv
WHEEL_PY := $(abspath $(WHEEL_VENV))/bin/python
WHEEL_STAMP := $(WHEEL_VENV)/.patched-wheel-installed
# Names the built wheel; build_wheel.py rewrites it only when the wheel changes, so
# the wheel venv is rebuilt exactly then.
WHEEL_POINTER := $(BUILD)/patched-wheel.txt

.PHONY: wheel-check FORCE
FORCE:

$(WHEEL_POINTER): FORCE $(STAMP) $(EXT_SO)
	$(PY) build_scripts/build_wheel.py --pointer $@

wheel: $(WHEEL_POINTER)

$(WHEEL_STAMP): $(WHEEL_POINTER)
	rm -rf $(WHEEL_VENV)
	$(PYTHON_BOOT) -m venv $(WHEEL_VENV)
	$(WHEEL_PY) -m pip install --quiet "$$(head -n 1 $(WHEEL_POINTER))" pytest expecttest numpy cryptography "moto[server]" "s3fs>=2024.1.0"
	touch $@

# The zoo's libraries next to the patched wheel: --no-deps keeps pip from
# replacing the patched torch with the registry's (torchvision pins torch==2.7.1);
# pillow is torchvision's other dependency, transformers brings its own.
WHEEL_ZOO_STAMP := $(WHEEL_VENV)/.zoo-deps-installed

$(WHEEL_ZOO_STAMP): $(WHEEL_STAMP)
	$(WHEEL_PY) -m pip install --quiet --no-deps "torchvision==$(ZOO_TORCHVISION)"
	$(WHEEL_PY) -m pip install --quiet pillow "transformers==$(ZOO_TRANSFORMERS)"
	touch $@

wheel-venv: $(WHEEL_STAMP) $(WHEEL_ZOO_STAMP)

# The wheel's contents against the overlay's sources (needs torch_overlay, so it runs
# in the dev venv).
wheel-check: wheel
	$(PY) -m pytest test/overlay/test_patched_wheel.py

# -P keeps the repo root (and so torch_overlay/) off sys.path: the wheel must stand
# alone. pytest still finds the repo's pyproject.toml from test/.
test-wheel: wheel-check wheel-venv
	mkdir -p $(BUILD)/junit
	env -u TORCH_OVERLAY TORCH_OVERLAY_EXPECT=wheel $(WHEEL_PY) -P -m pytest test --junitxml=$(abspath $(BUILD))/junit/wheel.xml $(WHEEL_PYTEST_ARGS) $(PYTEST_ARGS)

# The upstream export: a `git am` series for pytorch at tag v$(BASE_TORCH).
EXPORT_DIR := $(BUILD)/upstream-export

export: venv
	$(PY) build_scripts/export_upstream.py --out $(EXPORT_DIR)

# export-check: the series applies (git apply, git am) to the pristine sources, and
# every prefix of it is bisectable: pristine 2.7.1 + that prefix imports torch and
# the modules it adds, and passes the tests it adds, with the overlay off. The last
# prefix's tests are skipped there by default: that tree is what test-overlay runs
# (NOTE: [Bisecting the export] in build_scripts/export_bisect.py);
# EXPORT_PREFIX_TESTS=all runs them too, none checks imports only;
# EXPORT_CHECK_ARGS=--keep-going checks every prefix before reporting.
EXPORT_PREFIX_TESTS ?= skip-last
EXPORT_CHECK_ARGS ?=

export-check: export
	$(PY) build_scripts/export_upstream.py --check --out $(EXPORT_DIR) --prefix-tests $(EXPORT_PREFIX_TESTS) $(EXPORT_CHECK_ARGS)

# What `make test` runs: the same check with every prefix's imports but none of its
# tests. The prefix tests take ~18 minutes on the 2-core machine (the packages
# commit's 87 tests alone ~14), which would take `make test` past its 45-minute
# budget; `make export-check` runs them (the last prefix's are test-overlay's).
export-check-imports: export
	$(PY) build_scripts/export_upstream.py --check --out $(EXPORT_DIR) --prefix-tests none $(EXPORT_CHECK_ARGS)

# Behaviour diff against upstream (tools/behaviour_diff/diff_upstream.py): the suite,
# the guard probe set (guard_probes.py) and the precompile probes on stock
# $(BASE_TORCH), the overlay, the patched wheel (reported as absent when not built) and
# upstream torch $(UPSTREAM_TORCH) in its own venv. Report: $(DIFF_DIR)/report.md and
# report.json.
UPSTREAM_TORCH := 2.13.0
UPSTREAM_VENV := .venv-upstream
UPSTREAM_PY := $(abspath $(UPSTREAM_VENV))/bin/python
# transformers: the precompile probes' serving zoo (GPT-2, Llama) runs on 2.13 too.
UPSTREAM_STAMP := $(UPSTREAM_VENV)/.upstream-torch-installed-transformers-$(ZOO_TRANSFORMERS)
DIFF_DIR := $(BUILD)/diff-upstream

.PHONY: upstream-venv diff-upstream

$(UPSTREAM_STAMP):
	test -x $(UPSTREAM_PY) || $(PYTHON_BOOT) -m venv $(UPSTREAM_VENV)
	$(UPSTREAM_PY) -m pip install "torch==$(UPSTREAM_TORCH)" pytest expecttest numpy "transformers==$(ZOO_TRANSFORMERS)"
	touch $@

upstream-venv: $(UPSTREAM_STAMP)

diff-upstream: venv wheel-venv upstream-venv
	$(PY) $(BEHAVIOUR_DIFF) --out $(DIFF_DIR) \
		$(if $(wildcard $(CONFORMANCE_REPORT)),--conformance $(CONFORMANCE_REPORT)) \
		$(if $(wildcard $(SWEEP_OUT)/results_vs_upstream.json),--sweep $(SWEEP_OUT)/results_vs_upstream.json) $(DIFF_ARGS)

# Upstream conformance (tools/upstream_conformance/run_conformance.py): torch 2.13's
# own precompile test files (../shared/upstream-tests/2.13, run UNCHANGED, never
# copied here) on the overlay and on the patched wheel, one process and one empty
# inductor cache per file; a table per test next to 2.13's own result on CPU, each
# difference with its reason from tools/upstream_conformance/keep_list.toml.
# Report: $(BUILD)/upstream-conformance/report.md. CONFORMANCE_ARGS adds options
# (e.g. --files test/dynamo/test_package.py, --envs overlay).
UPSTREAM_TESTS := $(abspath ../shared/upstream-tests/2.13)
# Torch 2.13 itself runs them too (the `upstream` column), so the behaviour diff
# can show the three side by side: `make diff-upstream` includes the last report.
CONFORMANCE_ARGS ?=
CONFORMANCE_ENVS ?= overlay,wheel,upstream
CONFORMANCE_REPORT := $(BUILD)/upstream-conformance/report.json
.PHONY: upstream-conformance

upstream-conformance: venv wheel-venv upstream-venv
	$(PY) tools/upstream_conformance/run_conformance.py --tests-root $(UPSTREAM_TESTS) \
		--envs $(CONFORMANCE_ENVS) --out $(BUILD)/upstream-conformance $(CONFORMANCE_ARGS)

# The README's main job: compile with a package, load it in a fresh process with
# an empty inductor cache, nothing recompiles.
demo: venv
	$(PY) examples/precompile_demo.py

# Benchmarks (never part of `make test`, but for its gate check-call-instructions):
# results under benchmarks/results/.
bench-guards: venv
	$(PY) benchmarks/guard_check.py

bench-load: venv upstream-venv
	$(PY) benchmarks/load_time.py

# The serving row: spawn to the first generated token of a tiny Llama
# (NOTE: [Serving row] in benchmarks/load_time.py).
bench-load-serving: venv upstream-venv
	$(PY) benchmarks/load_time.py --serving $(BENCH_ARGS)

# Spawn to the first generated token of Inductor package loads against eager,
# over a sample of the transformers sweep's architectures (NOTE: [First-token
# processes] in benchmarks/transformers_first_token.py); BENCH_ARGS takes
# --archs, --rounds, --out.
bench-transformers-first-token: venv
	TORCH_OVERLAY=1 $(PY) benchmarks/transformers_first_token.py $(BENCH_ARGS)

# Spawn to the end of training step 1 on 2 gloo ranks, DDP and FSDP2 (issue 47):
# eager (overlay off and on), cold Inductor compile, package load (every rank
# loads rank 0's) and upstream 2.13's Mega-Cache load
# (benchmarks/distributed_first_step.py, NOTE: [First-step configurations]);
# BENCH_ARGS takes --jobs, --rounds, --kinds, --upstream-caching-precompile, --out.
bench-distributed-first-step: venv upstream-venv
	$(PY) benchmarks/distributed_first_step.py $(BENCH_ARGS)

# Per-call overhead of eager, torch.compile, a loaded package and a loaded
# aot_compile function, beside upstream 2.13 (benchmarks/call_overhead.py).
bench-calls: venv upstream-venv
	$(PY) benchmarks/call_overhead.py $(BENCH_ARGS)

# Instructions per call of a loaded package and aot_compile function (seed MLP
# in no_grad and grad mode, 32-layer stack), counted by callgrind (benchmarks/call_instructions.py, NOTE:
# [Counting instructions of a call]). bench-call-instructions measures and
# rewrites the baseline benchmarks/results/call_instructions.json;
# check-call-instructions, the gate `make test` runs, fails (exit 1) when a
# loaded row exceeds it by more than the script's MARGIN.
bench-call-instructions: venv valgrind
	$(PY) benchmarks/call_instructions.py --update $(BENCH_ARGS)

check-call-instructions: venv valgrind
	$(PY) benchmarks/call_instructions.py --check

# valgrind and callgrind_control (Debian's valgrind package), installed from the
# registry when missing, for the instruction counts above.
valgrind:
	command -v valgrind >/dev/null && command -v callgrind_control >/dev/null || (apt-get update && apt-get install -y valgrind)

# Signing cost of compile packages (benchmarks/package_signing.py): save and load
# with and without a signature, fresh processes.
bench-signing: venv
	TORCH_OVERLAY=1 $(PY) benchmarks/package_signing.py

# A longer fuzz campaign of compile packages and aot_compile archives than the
# suite's (test/dynamo/test_package_fuzz.py): FUZZ_CASES mutations per mode
# (unsigned, signatures required), seed FUZZ_SEED.
FUZZ_CASES ?= 2000
FUZZ_SEED ?= 1515
fuzz: venv
	FUZZ_CASES=$(FUZZ_CASES) FUZZ_SEED=$(FUZZ_SEED) TORCH_OVERLAY=1 $(PY) -m pytest test/dynamo/test_package_fuzz.py -q -s

# The transformers sweep (issue 46; tools/transformers_sweep/, docs/transformers-sweep.md):
# every text-generation architecture of the pinned transformers, from one tiny
# shrink of its config, decoded five ways from packages in fresh processes; the
# table is benchmarks/results/transformers_sweep/results.md. Hours on two cores:
# the nightly workflow runs it; `make test` runs an eight-architecture sample
# (test/overlay/test_transformers_sweep.py). The upstream column runs torch 2.13's
# caching_precompile on the same cases (Inductor); transformers-sweep-compare
# writes the two side by side. SWEEP_ARGS narrows a run (--archs, --spellings,
# --jobs, --update).
SWEEP_OUT := benchmarks/results/transformers_sweep
SWEEP_ARGS ?=

.PHONY: transformers-sweep transformers-sweep-upstream transformers-sweep-compare
transformers-sweep: venv
	TORCH_OVERLAY=1 $(PY) tools/transformers_sweep/sweep.py --out $(SWEEP_OUT) --env overlay \
		--work $(BUILD)/transformers-sweep/overlay $(SWEEP_ARGS)

transformers-sweep-upstream: venv upstream-venv
	$(PY) tools/transformers_sweep/sweep.py --out $(SWEEP_OUT)-upstream --env upstream \
		--work $(BUILD)/transformers-sweep/upstream $(SWEEP_ARGS)

transformers-sweep-compare:
	$(PY) tools/transformers_sweep/sweep.py --compare $(SWEEP_OUT) $(SWEEP_OUT)-upstream --out $(SWEEP_OUT)

# Nightly builds (.github/workflows/nightly.yml; docs/nightly-and-bases.md).
# publish: the patched wheel into the PEP 503 index INDEX (build_scripts/publish_index.py);
# publish-check: pip installs torch from that index into a fresh venv, and imports it.
# rebase-check: the series carried onto torch BASE (a release, e.g. 2.9.1) by 3-way
# merge (torch_overlay/_overlay/rebase_check.py); reports in $(REBASE_REPORTS).
.PHONY: publish publish-check rebase-check
REBASE_REPORTS := nightly/rebase-reports
PUBLISH_CHECK_VENV := $(BUILD)/index-venv

ifneq ($(filter publish publish-check,$(MAKECMDGOALS)),)
ifeq ($(INDEX),)
$(error make $(filter publish publish-check,$(MAKECMDGOALS)) needs INDEX=DIR, the index directory)
endif
endif
ifneq ($(filter rebase-check,$(MAKECMDGOALS)),)
ifeq ($(BASE),)
$(error make rebase-check needs BASE=X.Y.Z, the torch release to carry the series onto)
endif
endif

publish: wheel
	$(PY) build_scripts/publish_index.py --index $(INDEX) "$$(head -n 1 $(WHEEL_POINTER))"

# The index holds only the patched torch: it is installed from there alone
# (--no-deps), then its dependencies from the usual index (the installed torch
# satisfies torch==$(BASE_TORCH), so pip keeps it).
publish-check:
	rm -rf $(PUBLISH_CHECK_VENV)
	$(PYTHON_BOOT) -m venv $(PUBLISH_CHECK_VENV)
	$(PUBLISH_CHECK_VENV)/bin/python -m pip install --quiet --no-deps --index-url "file://$(abspath $(INDEX))/simple" "torch==$(BASE_TORCH)"
	$(PUBLISH_CHECK_VENV)/bin/python -m pip install --quiet "torch==$(BASE_TORCH)"
	cd $(PUBLISH_CHECK_VENV) && env -u TORCH_OVERLAY ./bin/python -P -c "import torch, torch._dynamo.package; assert '+overlay.' in torch.__version__, torch.__version__; print(torch.__version__)"

rebase-check: $(STAMP)
	$(PY) -m torch_overlay rebase-check $(BASE) --json $(REBASE_REPORTS)/$(BASE).json --markdown $(REBASE_REPORTS)/$(BASE).md

status: venv
	$(PY) -m torch_overlay status

edit: venv
	$(PY) -m torch_overlay edit$(if $(OTHER_BASE), --base $(OTHER_BASE))

refresh: venv
	$(PY) -m torch_overlay refresh$(if $(OTHER_BASE), --base $(OTHER_BASE))

clean:
	rm -rf $(BUILD) dist

# Other supported bases (issue #17): stock torch <BASE> + the overlay, which serves
# patches/v<BASE>/series there. The venv .venv-<BASE> gets torch==<BASE> from the
# registry (pip's cache keeps the large CUDA wheels after the first download), the
# test extra of pyproject.toml and the zoo's libraries, and the checkout on sys.path
# through a .pth file, not `pip install -e`: an editable build would compile the C++
# extension in place, over .venv's build of the same file name. The extension is
# built against <BASE>'s headers into $(BUILD)/ext/torch-<BASE>/, where the overlay
# loads it from when torch <BASE> is installed (NOTE: [One extension build per base]
# in torch_overlay/_overlay/series.py).
.PHONY: base-venv test-base test-base-subset
BASE_VENV := .venv-$(OTHER_BASE)
BASE_PY := $(abspath $(BASE_VENV))/bin/python
BASE_STAMP := $(BASE_VENV)/.torch_overlay-installed
BASE_EXT_SO := $(BUILD)/ext/torch-$(OTHER_BASE)/torch_overlay/compat/_functorch/_interpreter_serialization_C$(EXT_SUFFIX)
# Test dependencies only an older torch needs: 2.6.0's torch.testing prints to
# stdout when hypothesis is missing, which the tests that read a child process's
# output would take for its result.
BASE_TEST_DEPS_2.6.0 := hypothesis
# torchvision's release for each base torch (the zoo tests).
ZOO_TORCHVISION_2.6.0 := 0.21.0

$(BASE_STAMP): pyproject.toml torch_overlay.pth | $(NLOHMANN_JSON_HEADER)
	test -x $(BASE_PY) || $(PYTHON_BOOT) -m venv $(BASE_VENV)
	$(BASE_PY) -m pip install --upgrade "pip>=23" "setuptools>=68" wheel
	$(BASE_PY) -m pip install "torch==$(OTHER_BASE)" ninja
	$(BASE_PY) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]))' > $(BASE_VENV)/test-requirements.txt
	$(BASE_PY) -m pip install "torch==$(OTHER_BASE)" -r $(BASE_VENV)/test-requirements.txt $(BASE_TEST_DEPS_$(OTHER_BASE))
	$(BASE_PY) -m pip install "torch==$(OTHER_BASE)" "torchvision==$(ZOO_TORCHVISION_$(OTHER_BASE))" "transformers==$(ZOO_TRANSFORMERS)"
	echo "$(CURDIR)" > "$$($(BASE_PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_torch_overlay_checkout.pth"
	$(BASE_PY) -m torch_overlay install-pth
	touch $@

$(BASE_EXT_SO): $(EXT_SRCS) setup.py | $(BASE_STAMP) $(NLOHMANN_JSON_HEADER)
	$(BASE_PY) setup.py -q build_ext --build-lib $(BUILD)/ext/torch-$(OTHER_BASE) --build-temp $(BUILD)/ext-temp/torch-$(OTHER_BASE)

ifneq ($(OTHER_BASE),)
ext: $(BASE_EXT_SO)
endif

base-venv: $(BASE_STAMP) $(BASE_EXT_SO)
	$(BASE_PY) -m torch_overlay materialize

# The same suite on the other base's overlay. Not run for it (2.7.1 only): lint
# (the mirrored modules are type-checked once, against 2.7.1's typing view), the
# patched wheel and its suite, the upstream export and the overlay/wheel agreement:
# the wheel, the export and their checks are built from the 2.7.1 series only.
test-base: base-venv
	mkdir -p $(BUILD)/junit
	TORCH_OVERLAY=1 TORCH_OVERLAY_EXPECT=overlay $(BASE_PY) -m pytest test --junitxml=$(BUILD)/junit/overlay-$(OTHER_BASE).xml $(PYTEST_ARGS)

# The other base's subset that fits next to the full primary-base run in CI: guard
# serialization, compile packages saved in one process and loaded in a fresh one
# (eager, aot_eager and Inductor, graph breaks, training, functorch transforms,
# fail_on_recompile, damaged packages; the @slowTest ones among them skip, as in
# `make test`), aot_compile, and the functorch interpreters' serialization. The
# full other-base run is `make test BASE=<base>`.
BASE_SUBSET_PACKAGE_TESTS := test_function or test_graph_breaks_and_resume_functions or test_builtin_module_inductor or test_training_forward_and_backward or test_dynamic_shapes or test_frame_compiled_inside_functorch_transforms or test_guard_failure_after_load_recompiles_or_raises or test_corrupted_artifact or test_version_mismatch
test-base-subset: base-venv
	TORCH_OVERLAY=1 TORCH_OVERLAY_EXPECT=overlay $(BASE_PY) -m pytest test/dynamo/test_guard_serialization.py test/dynamo/test_aot_compile.py test/functorch/test_interpreter_serialization.py test/overlay/test_supported_bases.py $(PYTEST_ARGS)
	TORCH_OVERLAY=1 TORCH_OVERLAY_EXPECT=overlay $(BASE_PY) -m pytest test/dynamo/test_package.py -k "$(BASE_SUBSET_PACKAGE_TESTS)" $(PYTEST_ARGS)

ifneq ($(filter base-venv test-base test-base-subset,$(MAKECMDGOALS)),)
ifeq ($(OTHER_BASE),)
$(error make $(filter base-venv test-base test-base-subset,$(MAKECMDGOALS)) needs BASE=X.Y.Z, a supported base other than $(BASE_TORCH): $(filter-out $(BASE_TORCH),$(SUPPORTED_BASES)))
endif
endif
