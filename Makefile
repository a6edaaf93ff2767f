# Everything a newcomer needs: `make demo` and `make test` each build the
# virtual environment on first use, install the pinned dependencies and run.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-body test test-containers test-fast lint typecheck venv clean bench fuzz browser durations images

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, by exact version: the CPU build is installed from a local file
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev,experiments]" -e ./clients
	# Flower for the experiments' DP-FedAvg baseline: its metadata asks for protobuf < 7,
	# but the pinned protobuf 7 runtime loads its generated code; what it imports comes
	# with the experiments extra
	$(PY) -m pip install --quiet --no-deps -c constraints.txt flwr==1.42.0
	# offline images: only the data files are read, so its TensorFlow dependency is skipped
	$(PY) -m pip install --quiet --no-deps -c constraints.txt animal-mnist==0.4
	@touch $(STAMP)

# Container images with no registry and no package index reachable from the build:
# the wheels are built here (the pinned dependencies once per change of the pins, capc
# and capc-client every time), the base is a Debian made by debootstrap unless
# BASE_IMAGE names one, and the engine is docker where its daemon runs, else podman
# (ENGINE=... to choose). deploy/build-images.sh prints the images' sizes.
WHEELS := build/wheelhouse

$(WHEELS)/.deps: pyproject.toml constraints.txt clients/pyproject.toml | $(STAMP)
	rm -rf $(WHEELS)/deps && mkdir -p $(WHEELS)/deps
	# pip's output is shown only when it fails (it warns about each index location it skips)
	$(PY) -m pip wheel --quiet --wheel-dir $(WHEELS)/deps -c constraints.txt torch==2.13.0 . ./clients \
	  > build/wheels.log 2>&1 || { grep -v '^WARNING: Location' build/wheels.log; exit 1; }
	rm -f $(WHEELS)/deps/capc-*.whl $(WHEELS)/deps/capc_client-*.whl
	# setuptools' build trees: clients/build/lib would be a second capc_client to mypy
	rm -rf build/lib build/bdist.* clients/build
	@touch $@

images: $(STAMP) $(WHEELS)/.deps
	# build trees may hold files removed from the tree since: never let them into a wheel
	rm -rf $(WHEELS)/capc build/lib clients/build && mkdir -p $(WHEELS)/capc
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir $(WHEELS)/capc . ./clients \
	  > build/wheels.log 2>&1 || { grep -v '^WARNING: Location' build/wheels.log; exit 1; }
	rm -rf build/lib build/bdist.* clients/build
	nice deploy/build-images.sh

# DIR: where the demo keeps its consortium and results (a second run there says so).
DIR ?= demo

demo: $(STAMP)
	$(VENV)/bin/capc demo --dir $(DIR)

# The demo's shipped body, remade by the project's own pretraining on synthetic images
# (about 25 minutes on a quiet 2-core machine), in bounded parts: each pauses after 9
# minutes (exit status 3), keeping its state in .capc-cache, and the next resumes it.
DEMO_BODY_CMD := diet pretrain --pretrain-steps 4500 --pool 48000 --pretrain-precision bf16 \
	--half --out services/assets/demo-body.pt --record services/assets/demo-body.json

demo-body: $(STAMP)
	@until $(VENV)/bin/capc $(DEMO_BODY_CMD) --time-limit 9; do \
	  status=$$?; [ $$status -eq 3 ] || exit $$status; done

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The dashboard test drives Debian's headless Chromium; install it where it is missing.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && SUDO= || SUDO=sudo; \
	    $$SUDO apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q chromium >/dev/null; }; }

# Whole files to each of three workers, longest first (tests/file_seconds.py). Three on
# two cores: the end-to-end files wait much of their time (a partition test: 119 s of
# wall, 23 s of CPU; services starting, keepalives, share timeouts), and a third worker
# fills those waits; the whole run used 1.4 cores with three workers. mypy (80 s of one
# core on a fresh checkout) checks beside the tests rather than before them; its report
# follows theirs.
WORKERS := 3
test: $(STAMP) browser
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@$(VENV)/bin/mypy > .mypy.out 2>&1 & types=$$!; \
	  $(VENV)/bin/pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder -m "not containers"; \
	  tests=$$?; wait $$types; typed=$$?; cat .mypy.out; rm -f .mypy.out; \
	  [ $$tests -eq 0 ] && [ $$typed -eq 0 ]

# The shipped compose file (podman-compose) and Kubernetes manifests (podman kube play)
# started for real under podman, with their faults: a lane of its own (minutes on the
# images `make images` built; docs/results.md), since it would take `make test` past
# its 15 minutes. .ci/run runs it after `make test`. One worker: two, one file each,
# took longer on the 2-core machine (428 s against 388 s; the containers' starts compute).
test-containers: $(STAMP)
	$(VENV)/bin/pytest -q -m containers tests/containers

# The lane to run while working: unit tests only (no processes, no network), lint first.
test-fast: $(STAMP) lint
	$(VENV)/bin/pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not slow" tests/unit

# Measure every test file again for the order `make test` deals them in.
durations: $(STAMP) browser
	$(VENV)/bin/pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder --junitxml=.durations.xml
	$(PY) -m tests.file_seconds .durations.xml

fuzz: $(STAMP)
	CAPC_FUZZ_SECONDS=600 $(VENV)/bin/pytest -q -m fuzz tests/e2e/test_gateway.py

bench: $(STAMP)
	@for b in benchmarks/*.py; do $(PY) $$b; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
