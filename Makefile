# The two set-up commands of README.md: `make demo` and `make test`.
# Each creates (or reuses) .venv, installs npucam from pyproject.toml and fetches the
# sample media and detector models into .cache/npucam (never committed).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DURATION ?= 20

KEYS ?= configs/keys

.PHONY: setup setup-test demo test test-slow test-random test-loaded lint format soak clean keys

$(VENV)/.runtime: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test: $(VENV)/.runtime pyproject.toml
	$(PY) -m pip install -q -e '.[test]'
	touch $@

DEMO_CALIB := .cache/npucam/pose2sim/Demo_SinglePerson/calibration

# the Pose2Sim demo's Qualisys calibration as the TOML configs/studio-3d.toml names
.cache/npucam/.fetched: pipeline/assets.py stages/body/anny_data.py stages/body/torch_zip.py | $(VENV)/.runtime
	$(PY) -m pipeline.assets
	$(VENV)/bin/npucam calibrate import qualisys $(DEMO_CALIB)/Calib.qca.txt -o $(DEMO_CALIB)/Calib.toml
	touch $@

# numba compiles Sapiens2's host kernels (npu/models/sapiens2/kernels.py) on their first call
# and caches them beside the module: one synthetic pose on the simulated NPU compiles the ones
# the demo and the tests use (~10 s of CPU), so neither the first demo nor the first test pays
NUMBA_WARM := npu/models/sapiens2/__pycache__/.warm

$(NUMBA_WARM): npu/models/sapiens2/kernels.py npu/models/sapiens2/glue.py | $(VENV)/.runtime .cache/npucam/.fetched
	$(PY) -c "import cv2, numpy; cv2.imwrite('.cache/npucam/warm.png', numpy.full((256, 192, 3), 128, numpy.uint8))"
	$(VENV)/bin/npucam pose image .cache/npucam/warm.png --box 0,0,192,256 --backend sim --synthetic -o /dev/null
	touch $@

setup: $(VENV)/.runtime .cache/npucam/.fetched $(NUMBA_WARM)

# The view's browser test drives Debian's chromium through chromedriver, and the Node.js
# subscriber example (docs/examples) needs node and its npm packages (npm ci: the zeromq
# package ships its prebuilt addon). apt-get runs only when a program is missing (as root).
CHROMIUM := /usr/bin/chromium /usr/bin/chromedriver
NODE_MODULES := docs/examples/node_modules/.package-lock.json

$(CHROMIUM):
	apt-get update -q
	apt-get install -y --no-install-recommends chromium chromium-driver

$(NODE_MODULES): docs/examples/package.json docs/examples/package-lock.json
	command -v npm >/dev/null || (apt-get update -q && apt-get install -y --no-install-recommends nodejs npm)
	cd docs/examples && npm ci --no-audit --no-fund

# MediaPipe's own graphs, the independent reference for stages/landmarks, in a venv of their own
# (bench/mediapipe-requirements.txt says why); npucam never imports mediapipe. Its wheels are
# CPython 3.9-3.12 only.
MP_VENV := .venv-mediapipe

$(MP_VENV)/.made: bench/mediapipe-requirements.txt
	test -x $(MP_VENV)/bin/python || $(PYTHON) -m venv $(MP_VENV)
	$(MP_VENV)/bin/python -m pip install -q --no-deps mediapipe==0.10.21
	$(MP_VENV)/bin/python -m pip install -q -r bench/mediapipe-requirements.txt
	touch $@

# Pose2Sim's own calibration converters, the reference for stages/rig/importers.py, in a venv of
# their own (bench/pose2sim-requirements.txt says why); npucam never imports Pose2Sim.
P2S_VENV := .venv-pose2sim

$(P2S_VENV)/.made: bench/pose2sim-requirements.txt
	test -x $(P2S_VENV)/bin/python || $(PYTHON) -m venv $(P2S_VENV)
	$(P2S_VENV)/bin/python -m pip install -q --no-deps pose2sim==0.10.49
	$(P2S_VENV)/bin/python -m pip install -q -r bench/pose2sim-requirements.txt
	touch $@

# anny's own model, the body tests' reference (test extra): its data built once (~3.5 min)
ANNY_REF := .cache/npucam/anny-reference/.built

$(ANNY_REF): $(VENV)/.test .cache/npucam/.fetched
	$(PY) -m tests.stages.body.anny_reference
	touch $@

# MediaPipe's Holistic landmarks of the clips the landmark tests compare against, run once
MP_REF := .cache/npucam/mediapipe-reference/.built

$(MP_REF): $(MP_VENV)/.made bench/mediapipe_reference.py | $(VENV)/.test .cache/npucam/.fetched
	$(PY) -m tests.stages.landmarks.mediapipe_reference
	touch $@

setup-test: $(VENV)/.test .cache/npucam/.fetched $(CHROMIUM) $(NODE_MODULES) $(MP_VENV)/.made \
	$(P2S_VENV)/.made $(ANNY_REF) $(MP_REF) $(NUMBA_WARM)

demo: setup
	$(VENV)/bin/npucam run configs/demo.toml --duration $(DURATION)

# CURVE keys for configs/split-*-secure.toml (docs/security.md): one pair per process and
# one for a subscriber, each public key copied into the allow-list of the side it talks to.
# Existing keys are never overwritten; delete $(KEYS) to start over.
keys: $(KEYS)/.made

$(KEYS)/.made: | $(VENV)/.runtime
	$(VENV)/bin/npucam keys generate capture --dir $(KEYS)
	$(VENV)/bin/npucam keys generate infer --dir $(KEYS)
	$(VENV)/bin/npucam keys generate subscriber --dir $(KEYS)
	mkdir -p $(KEYS)/capture-clients $(KEYS)/infer-clients
	cp $(KEYS)/infer.key $(KEYS)/capture-clients/
	cp $(KEYS)/subscriber.key $(KEYS)/infer-clients/
	touch $@

# The default suite on WORKERS parallel pytest-xdist workers (docs/architecture.md "Testing":
# most tests wait on sleeps, sockets and subprocesses, so 4 on 2 cores; the runs measured are
# in docs/benchmarks.md, "test suite"), printing the 20 slowest tests. Tests marked with one
# xdist_group share a worker (and its module fixtures: a clip's landmark runs, once).
WORKERS ?= 4
PYTEST_PARALLEL := $(PY) -m pytest -q -n $(WORKERS) --dist loadgroup --durations=20

test: setup-test
	$(PYTEST_PARALLEL)

test-slow: setup-test
	$(PY) -m pytest -q -m slow

# The default suite in a random order (pytest-randomly, off in a plain run): the same SEED
# gives the same order, so a failure can be replayed.
SEED ?= 1

test-random: setup-test
	$(PYTEST_PARALLEL) -p randomly --randomly-seed=$(SEED)

# The default suite while two busy loops hold both cores (a loaded CI host): the target
# starts them and kills them when pytest ends, pass or fail.
test-loaded: setup-test
	bash .ci/loaded.sh $(PYTEST_PARALLEL)

# 4 looping cameras through detect + infer on the SIMULATED NPU for SOAK_MINUTES; fails on
# RSS growth over 5% after warm-up, fd, task or thread leaks (bench/soak.py, docs/reliability.md).
SOAK_MINUTES ?= 30

soak: setup
	$(PY) bench/soak.py --minutes $(SOAK_MINUTES) --path sim

# ruff (with McCabe complexity <= 15), mypy over pipeline/, stages/ and npu/ (pydantic's plugin;
# the modules still on the burn-down list of pyproject.toml's [tool.mypy] are skipped), then
# .ci/no_host_speed_asserts.py: no default-run test bounds a wall-clock duration; then
# .ci/no_import_cycles.py: no import circle in npu/, stages/ or pipeline/
lint: setup-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) .ci/no_host_speed_asserts.py
	$(PY) .ci/no_import_cycles.py

format: setup-test
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .cache .pytest_cache docs/examples/node_modules
