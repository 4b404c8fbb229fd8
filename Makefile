# padoc-ray: `make demo` and `make test` each set up a fresh machine by themselves.
# The interpreter the venv is made from: the distribution's CPython 3.11 (/usr/bin/python3.11) where it can make a
# venv and has its C headers (packages that compile, torch's inductor), else the first python3.11 on PATH;
# `make install PY=...` picks another. Debian's has the interpreter linked into its executable; pyenv's default
# build, first on PATH on this project's machines, loads a shared libpython built without --enable-optimizations.
# Over the same packages Debian's used 6-8% less CPU (docs/testing.md#speed).
PY_USABLE := import ensurepip, os, sysconfig, venv; assert os.path.isfile(sysconfig.get_path("include") + "/Python.h")
PY      ?= $(shell for p in /usr/bin/python3.11 python3.11; do \
             $$p -c '$(PY_USABLE)' >/dev/null 2>&1 && { echo $$p; exit; }; done; echo python3.11)
VENV    ?= .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.padoc-installed
MODEL   ?= models/tiny
PYTEST_ARGS ?=

.PHONY: install browser tcmalloc demo test test-nightly test-fast model clean-model check-gpu-profile help

help:
	@echo "make demo   - set up .venv (CPU profile), build the tiny model, parse examples/ and print a summary"
	@echo "make test   - set up .venv (CPU profile) and run the test suite (real CPU vLLM engine included), all but the nightly checks"
	@echo "make test-nightly - the long end-to-end checks make test leaves out (tests marked nightly)"
	@echo "make install, make model, make test-fast (the fast tiers, tests/unit and tests/contracts: no Ray, no engine)"
	@echo "make check-gpu-profile - resolve pip install --dry-run '.[gpu]' (needs the index); fails off the tested versions"

$(VPY):
	$(PY) -m venv $(VENV)
	-$(VPY) -m pip install -q uv

# The installer is uv (a pip-compatible resolver and installer): it puts the CPU profile's ~230 packages in place in
# about 20 s with an empty cache and 9 s with a warm one, where pip took about 80 s, and resolves the same versions.
# uv reads none of pip's configuration, so the package sources that pip is configured with here (`pip config list`:
# find-links such as a folder holding the torch+cpu wheel, extra index URLs, constraints) are handed to it, with pip's
# rule for several indexes (the best version across all of them; uv's default takes the first index that has the
# package). Where uv could not be installed, or fails, pip installs instead.
UV := $(VENV)/bin/uv
PIP_SOURCES = $$($(VPY) -m pip config list 2>/dev/null | awk -F"='" '{ \
  key = $$1; sub(/^.*\./, "", key); val = $$2; sub(/'"'"'$$/, "", val); \
  flag = (key == "find-links" || key == "extra-index-url" || key == "index-url" || key == "constraint") ? "--" key : ""; \
  n = split(val, v, " "); for (i = 1; flag != "" && i <= n; i++) printf "%s %s ", flag, v[i] }')
PROFILE := '.[cpu,dev]'

# CPU profile. PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break imports next to
# torch+cpu: remove them, then let padoc_ray.compat decide whether the torchvision stand-in is needed.
$(STAMP): pyproject.toml | $(VPY)
	export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1; $(UV) pip install -q --python $(VPY) --index-strategy unsafe-best-match \
	  $(PIP_SOURCES) -e $(PROFILE) || { echo "uv did not install the profile: pip installs it"; \
	  $(VPY) -m pip install --no-compile -e $(PROFILE); }
	-$(VPY) -m pip uninstall -y -q torchaudio torchcodec
	PADOC_RAY_DISABLE_TORCHVISION_SHIM=1 $(VPY) -c 'import torchvision.transforms.v2' >/dev/null 2>&1 \
	  || $(VPY) -m pip uninstall -y -q torchvision || true
	$(VPY) -m padoc_ray.compat.torchvision_fallback install
	touch $(STAMP)

# Bytecode. `make install` (and so `make demo`) compiles the environment once the set is final, on every core
# (about 30 s on 2; pip compiled its 32,000 modules one by one, about 55 s), but for the 8,000 that nothing here
# imports (NO_BYTECODE: the packages' own tests, pip, the Anthropic SDK of vLLM's API server, moto's CloudFormation
# linter): a machine may set PYTHONDONTWRITEBYTECODE, and then each Ray worker and command would compile vLLM, Ray
# and torch again as it starts (about 23 CPU-s against 10). A few files in the wheels are for newer Pythons (torch's
# py312_intrinsics.py) and do not compile: compileall then exits 1, where pip says nothing.
# The test targets need no such pass: they run with bytecode written (WRITE_BYTECODE), so a module is compiled
# by the first process that imports it and read by every later one, and the 60% of the environment that no test
# imports is never compiled (a fresh clone's `make test`: 14 s before pytest starts instead of 43, pytest no slower).
COMPILED := $(VENV)/.padoc-compiled
NO_BYTECODE := /(tests?|pip|anthropic|cfnlint)/
SITE = $$($(VPY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
$(COMPILED): $(STAMP)
	$(VPY) -m compileall -q -j 0 -x '$(NO_BYTECODE)' "$(SITE)" >/dev/null || true
	touch $(COMPILED)

install: $(STAMP) $(COMPILED)

$(MODEL)/padoc_protocol.json: | $(STAMP)
	$(VENV)/bin/padoc-ray build-tiny-model $(MODEL) --force

model: $(MODEL)/padoc_protocol.json

demo: install model
	$(VENV)/bin/padoc-ray demo --model $(MODEL)

# Two pytest workers, whole modules each (module fixtures such as a Ray cluster stay in one worker):
# the suite mostly waits on engines, clusters and subprocesses, so two workers halve its time on 2 cores.
# Files go out in the collection's order (--no-loadscope-reorder), which tests/helpers/suite_order.py makes
# heavy files first, so the last minutes are short files on both workers, not one long one.
PYTEST_WORKERS ?= 2

# The viewer's browser tests drive Debian's chromium (Playwright never downloads a browser of its own).
# Idempotent: apt runs only when chromium is missing (as root, else through sudo). A machine where apt
# cannot install it still runs the suite: the browser tests then skip, saying why (on CI, CI=true, they fail).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	-@command -v chromium >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# The engine's tcmalloc paths (EngineConfig.allocator="tcmalloc", the heap release under tcmalloc) are
# tested against Debian's libtcmalloc-minimal4. Idempotent and best-effort like the browser: without it
# those tests skip, saying why (on CI they fail).
TCMALLOC := /usr/lib/$(shell uname -m)-linux-gnu/libtcmalloc_minimal.so.4
tcmalloc:
	-@[ -e $(TCMALLOC) ] || ! command -v apt-get >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4; }

# The tests start a few hundred Python processes (CLI runs, Ray workers, Serve replicas) that import this
# package and its dependencies: with bytecode written (PYTHONDONTWRITEBYTECODE, set on some machines, cleared
# for the run and every process it starts), each module is compiled once, by its first importer.
WRITE_BYTECODE := env -u PYTHONDONTWRITEBYTECODE

test: $(STAMP) browser tcmalloc
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(WRITE_BYTECODE) $(VPY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile \
	  --no-loadscope-reorder -m "not nightly" $(PYTEST_ARGS)

# The long end-to-end checks whose parts make test covers elsewhere (cluster/gpu_check.sh's V1 leg, the
# data loop, ...): marked nightly, left out of make test, run here (each file on a worker of its own).
test-nightly: $(STAMP)
	$(WRITE_BYTECODE) $(VPY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m nightly $(PYTEST_ARGS)

# The fast tiers (docs/testing.md): a test there that starts Ray or an engine fails (tests/helpers/tiers.py).
test-fast: $(STAMP)
	$(WRITE_BYTECODE) $(VPY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile tests/unit tests/contracts $(PYTEST_ARGS)

check-gpu-profile:
	PYTHON=$(PY) cluster/check_gpu_profile.sh

clean-model:
	rm -rf $(MODEL)
