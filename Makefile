# tfra_dynamic_embedding: environment, native ops, tests, demo. Details: DEVELOPERS.md.
#
#   make venv    .venv/ with TensorFlow (CPU), tf-keras, test tools, the package (editable) + its ops
#   make test    make venv, then every test once (pytest on 2 workers), then a check that
#                `bazel test //...` still loads and analyses (`make bazel-test` runs it in full)
#   make demo    run the end-to-end demo of the command line tool
#   make demo-cluster  the demo on a local cluster: tables on 2 PS processes, 2 asynchronous
#                      workers (tfra-de demo --ps 2 --workers 2; about a minute)
#   make ops     rebuild the native op libraries (incremental; the Redis one where hiredis is)
#   make bench   run the benchmarks in benchmarks/ (optional; never fails on speed)
#   make clean   remove build outputs (keeps .venv);  make distclean  also removes .venv

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CI: no progress bars in the log.
PIP_INSTALL := $(PY) -m pip --disable-pip-version-check --no-input install $(if $(CI),--progress-bar off,)
PYTEST_ARGS ?= -q -ra --durations=10
# pytest-xdist workers of `make test`'s first phase (one test file at a time each).
PYTEST_WORKERS ?= 2
BAZEL ?= $(shell command -v bazel-4 2>/dev/null || command -v bazel 2>/dev/null)
BAZEL_ARGS ?= $(if $(CI),--config=ci,)

# Stamps: dependencies are installed once per change of the requirement files, the editable
# install once per change of setup.py. The op library is rebuilt incrementally on every run
# (tools/build_ops.py answers "up to date" in ~0.1 s without importing TensorFlow).
DEPS_STAMP := $(VENV)/.tfra-deps.stamp
INSTALL_STAMP := $(VENV)/.tfra-install.stamp

.PHONY: help venv ops configure test pytest bazel-check bazel-test bazel-install system-deps demo demo-cluster bench clean distclean

help:
	@sed -n '2,10p' Makefile | sed 's/^# \{0,1\}//'

# --- environment -------------------------------------------------------------------------------

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "need Python >= 3.10, got " + sys.version.split()[0] + " (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	@rm -f $(DEPS_STAMP) $(INSTALL_STAMP)

$(DEPS_STAMP): requirements.txt requirements-nodeps.txt | $(PY)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) -r requirements.txt
	$(PIP_INSTALL) --no-deps -r requirements-nodeps.txt
	@touch $@

# The op library is built first so that its compiler output shows (pip hides a build backend's
# output); pip's own build step then finds it up to date.
$(INSTALL_STAMP): setup.py $(DEPS_STAMP)
	$(PY) tools/build_ops.py
	$(PIP_INSTALL) --no-build-isolation --no-deps -e .
	@touch $@

venv: $(INSTALL_STAMP)
	@$(MAKE) --no-print-directory ops configure

ops: | $(INSTALL_STAMP)
	$(PY) tools/build_ops.py

configure: | $(INSTALL_STAMP)
	@$(PY) tools/configure.py

# --- tests ---------------------------------------------------------------------------------------

# Every test runs once, under pytest: first all but the "exclusive" files on $(PYTEST_WORKERS)
# workers, a file at a time each (longest first: tests/conftest.py), then the exclusive ones
# (multi-process runs that need the machine to themselves) one at a time. Then Bazel loads and
# analyses //... without building or running it, so that `bazel test //...` keeps working
# offline (DEVELOPERS.md, "Tests").
# system-deps first: `venv` builds the op libraries, the Redis one only where hiredis is installed.
test: system-deps venv
	@$(MAKE) --no-print-directory pytest
	@$(MAKE) --no-print-directory bazel-check

# pytest exits 5 when it collects no test at all (e.g. a -k that matches no exclusive test):
# that is not a failure of the build.
pytest: | $(INSTALL_STAMP)
	@rc=0; $(PY) -m pytest tests -m "not exclusive" -n $(PYTEST_WORKERS) --dist loadfile \
	  --no-loadscope-reorder $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; rc=0; fi; \
	rc2=0; $(PY) -m pytest tests -m exclusive $(PYTEST_ARGS) || rc2=$$?; \
	if [ $$rc2 -eq 5 ]; then echo "pytest: no exclusive tests collected"; rc2=0; fi; \
	[ $$rc -eq 0 ] && [ $$rc2 -eq 0 ]

# Loading and analysis of every target (no compile, no test run): catches a broken BUILD file,
# WORKSPACE stub or @local_tf rule in seconds.
bazel-check: system-deps configure
	"$$(command -v bazel-4 || command -v bazel)" build --nobuild //... $(BAZEL_ARGS)

# Bazel exits 4 when the build succeeded but no test target ran: with tests/BUILD's targets that
# means a --test_tag_filters that matched them all, which must not pass as a green run.
bazel-test: system-deps configure
	@rc=0; "$$(command -v bazel-4 || command -v bazel)" test //... $(BAZEL_ARGS) || rc=$$?; \
	if [ $$rc -eq 4 ]; then echo "bazel: no test target ran (check BAZEL_ARGS: $(BAZEL_ARGS))"; fi; \
	exit $$rc

# Debian packages the build and the tests need, installed with apt-get when missing:
# bazel-bootstrap (Bazel 4.2.3, binary bazel-4) when no Bazel is on PATH; redis-server (with
# redis-cli) that the Redis table tests start on loopback; libhiredis-dev, the Redis C client.
system-deps:
	@missing=""; \
	command -v bazel-4 >/dev/null 2>&1 || command -v bazel >/dev/null 2>&1 || missing="$$missing bazel-bootstrap"; \
	{ command -v redis-server && command -v redis-cli; } >/dev/null 2>&1 || missing="$$missing redis-server"; \
	[ -e /usr/include/hiredis/hiredis.h ] || missing="$$missing libhiredis-dev"; \
	if [ -n "$$missing" ]; then \
	  echo "Installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi

# The old name of the step above.
bazel-install: system-deps

# --- running -------------------------------------------------------------------------------------

demo: venv
	$(PY) -m tfra_dynamic_embedding.cli demo

# The same demo on loopback: its embedding tables on 2 PS processes, trained by 2 asynchronous
# worker processes under ParameterServerStrategy (docs/distributed.md). `--ps 2` alone: one
# synchronous client.
demo-cluster: venv
	$(PY) -m tfra_dynamic_embedding.cli demo --ps 2 --workers 2

bench: venv
	@shopt -s nullglob; files=(benchmarks/*.py); \
	if [ $${#files[@]} -eq 0 ]; then echo "no benchmarks/*.py yet"; fi; \
	for f in "$${files[@]}"; do echo "== $$f"; $(PY) "$$f"; done

# --- cleaning ------------------------------------------------------------------------------------

clean:
	@if [ -n "$(BAZEL)" ] && [ -e bazel-bin ]; then $(BAZEL) clean; fi
	rm -rf build dist *.egg-info .pytest_cache .bazelrc.configure
	rm -f tfra_dynamic_embedding/tables/_tfra_de_ops.so tfra_dynamic_embedding/tables/_tfra_de_ops.so.tmp.*
	rm -f tfra_dynamic_embedding/tables/_tfra_de_redis_ops.so tfra_dynamic_embedding/tables/_tfra_de_redis_ops.so.tmp.*
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	@if [ -n "$(BAZEL)" ] && [ -e bazel-bin ]; then $(BAZEL) clean --expunge; fi
	rm -rf $(VENV)
