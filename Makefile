# accel-agent: `make demo` and `make test` work on a fresh Debian (bookworm) machine as root.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PROMTOOL := $(VENV)/bin/promtool
# Debian packages: libvirt headers (libvirt-python builds against them; libvirt0 ships the
# RNG schemas and the test:/// driver), fuse3 for the simulator, systemd for unit checks,
# postgresql for Placement as production runs it (tests/functional/test_placement_fleet.py,
# make bench-fleet: a cluster of their own on loopback, not the package's).
APT_PACKAGES := libvirt-dev pkg-config gcc python3-dev python3-venv fuse3 libfuse3-3 \
	libxml2-utils systemd libsystemd-dev pci.ids postgresql
DEMO_DIR ?= /run/accel-agent-demo
DEMO_SYSFS := $(DEMO_DIR)/sysfs
DEMO_CONF := $(DEMO_DIR)/accel-agent.conf
PYTEST_ARGS ?=
# The unit and functional tiers run on this many pytest-xdist workers (each
# test is independent: its own temporary directory, simulator mount, sockets
# and helpers); worksteal lets an idle worker take queued tests from a busy
# one, so the long random-kill tests do not end up in one queue.
TEST_WORKERS ?= 2

.PHONY: all deps venv demo test test-unit test-functional test-realkernel test-nova test-package lint \
	sample-config bench bench-hosts bench-fleet soak prove-faults test-stress dist deb docs clean

all: test

deps: .stamps/apt
# Again when the Makefile changes: a package added to APT_PACKAGES (libsystemd-dev
# for the journal extra) must reach checkouts that made the stamp before.
.stamps/apt: Makefile
	@mkdir -p .stamps
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:" $$missing; \
		if [ "$$(id -u)" != 0 ]; then echo "need root to apt-get install $$missing" >&2; exit 1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@touch $@

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml constraints.txt .stamps/apt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# compat mode: a plain .pth path entry instead of an import hook, which every
	# accelctl start would otherwise pay for (~6 ms)
	$(PY) -m pip install -q -c constraints.txt -e '.[test,journal]' --config-settings editable_mode=compat
	@touch $@

demo: venv
	@bash tools/demo.sh "$(DEMO_DIR)"

test: venv $(PROMTOOL)
	$(PY) -m ruff check .
	@# Nova's venv (mostly downloads: 2-4 min on a fresh machine) builds in the
	@# background while the unit and functional tiers run; test-nova then waits
	@# for it (novavenv locks the build) or, if it failed, builds it again and says why.
	@mkdir -p .stamps; [ "$${ACCEL_NOVA:-}" = 0 ] || \
		{ nohup $(PY) -m tests.nova.novavenv >.stamps/nova-venv.log 2>&1 & }
	@# The real-kernel labs run in the background beside the unit, functional, Nova
	@# and package tiers (tools/test-tiers.sh says why and how).
	@PROMTOOL=$(CURDIR)/$(PROMTOOL) PY=$(PY) MAKE="$(MAKE)" TEST_WORKERS=$(TEST_WORKERS) \
		PYTEST_ARGS="$(PYTEST_ARGS)" bash tools/test-tiers.sh

test-unit: venv $(PROMTOOL)
	PROMTOOL=$(CURDIR)/$(PROMTOOL) $(PY) -m pytest tests/unit $(PYTEST_ARGS)

# promtool checks docs/prometheus-alerts.yml (tests/unit/test_alerts.py). Only the
# binary is taken from Debian's prometheus package (19 MB download; promtool is a
# static Go binary): installing the package would start a Prometheus server here.
$(PROMTOOL): | $(VENV)/.installed
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && cd "$$tmp" && \
	{ apt-get download prometheus 2>/dev/null || \
		{ apt-get update -qq && apt-get download prometheus; }; } && \
	dpkg-deb --fsys-tarfile prometheus_*.deb | tar -x ./usr/bin/promtool && \
	install -m 0755 usr/bin/promtool "$(CURDIR)/$(PROMTOOL)"
	@$(PROMTOOL) --version | head -n 1

test-functional: venv
	$(PY) -m pytest tests/functional $(PYTEST_ARGS)

test-realkernel: venv
	@bash tests/realkernel/run.sh

# Nova 34's own libvirt driver code on the agent's attach handles (tests/nova/README.md);
# Nova in its own venv, cached in /var/cache/accel-agent-nova (ACCEL_NOVA=0 skips).
# The venv is built first, outside pytest, so its build time shows in the log.
test-nova: venv
	@if [ "$${ACCEL_NOVA:-}" != 0 ]; then \
		$(PY) -m tests.nova.novavenv >/dev/null || exit 1; \
		if [ -s .stamps/nova-venv.log ]; then \
			sed 's/^/(built during the tests above) /' .stamps/nova-venv.log; \
			rm -f .stamps/nova-venv.log; fi; \
	fi
	$(PY) -m pytest -p no:xdist tests/nova $(PYTEST_ARGS)

# Build the .deb, then check it (lintian too) and install it with apt into a
# bookworm chroot (debootstrap, cached in /var/tmp/accel-agent-test).
TEST_PACKAGE_APT_PACKAGES := debootstrap lintian
# The packages are built again only when a source changed since dist/'s
# (tools/deb-fresh.sh, by `make deb`, which installs its own build packages): in
# `make test` whichever of this tier and the systemd lab asks first builds them,
# the other waits for them (the script's lock).
test-package: venv
	@MAKE="$(MAKE)" bash tools/deb-fresh.sh
	@missing=$$(for p in $(TEST_PACKAGE_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 $$missing >/dev/null; \
	fi
	$(PY) -m pytest tests/package $(PYTEST_ARGS)

lint: venv
	$(PY) -m ruff check .

# docs/api.md, docs/config.md and the metric table of docs/metrics.md, from
# openapi.json, the options and the metrics registry (kept in sync by a test).
docs: venv
	$(PY) tools/gendocs.py

sample-config: venv
	$(VENV)/bin/oslo-config-generator --config-file etc/oslo-config-generator/accel-agent.conf

bench: venv .stamps/bench-apt
	$(PY) -m benchmarks --output BENCHMARKS.md

# (n) alone, printed and not written to BENCHMARKS.md: the listing on each host
# shape of benchmarks/hosttrees.py (TREES=flat,worst picks some; QUICK=1: 5 rounds).
bench-hosts: venv .stamps/bench-apt
	$(PY) -m benchmarks --only n $(if $(TREES),--trees $(TREES)) $(if $(QUICK),--quick)

# (h) a fleet of 50 real agents against one Placement as production runs it (gunicorn
# workers on Debian's PostgreSQL, installed with apt when missing, a cluster of its own
# on loopback, removed afterwards): about 80 minutes on 2 cores, bounded by its phases.
# QUICK=1: 10 agents, every interval and phase 10x shorter (~10 minutes); AGENTS=N.
# Its block goes into BENCHMARKS.md, where make bench keeps it.
bench-fleet: venv
	$(PY) -m benchmarks.fleet $(if $(QUICK),--quick) $(if $(AGENTS),--agents $(AGENTS)) \
		--output BENCHMARKS.md

# The random-kill harnesses at length (about an hour for 1,000 kills of one
# operation at a time, two to three hours for 1,000 SIGKILLs of the running
# daemon, on 2 cores); their figures go into BENCHMARKS.md, where make bench
# keeps them.
SOAK_KILLS ?= 1000
SOAK_DAEMON_KILLS ?= 1000
soak: venv
	$(PY) -m benchmarks.soak --kills $(SOAK_KILLS) --log soak.log --output BENCHMARKS.md
	$(PY) -m benchmarks.soak --model daemon --kills $(SOAK_DAEMON_KILLS) \
		--log soak-daemon.log --output BENCHMARKS.md

# Each deliberate fault of tests/faults/ must make the test it names fail.
prove-faults: venv
	bash tools/prove-faults.sh

# The unit and functional tiers STRESS_RUNS times in a row while both cores
# are kept busy by stress-ng: every run must pass (a flaky test fails this).
STRESS_RUNS ?= 10
test-stress: venv
	bash tools/stress-tests.sh $(STRESS_RUNS)

# mdevctl (Debian's 1.2.0) is the reference the cold-listing benchmark compares against.
.stamps/bench-apt:
	@dpkg -s mdevctl >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mdevctl >/dev/null; }
	@mkdir -p .stamps && touch $@

# The wheel and the sdist in dist/ (the version comes from accel_agent/__init__.py).
dist: venv
	rm -rf dist
	$(PY) -m build --sdist --wheel --outdir dist .
	rm -rf build/lib build/bdist.*

# The Debian packages in dist/, built from that sdist (tools/build-deb.sh):
# accel-agent (the agent in its own venv under /opt/accel-agent, with man pages
# and bash completion generated from its parsers) and accel-agent-simulator.
DEB_APT_PACKAGES := debhelper dh-virtualenv dpkg-dev python3-venv python3-dev libvirt-dev \
	libsystemd-dev pkg-config gcc
deb: dist .stamps/deb-apt
	bash tools/build-deb.sh

.stamps/deb-apt:
	@missing=$$(for p in $(DEB_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 $$missing >/dev/null; \
	fi
	@mkdir -p .stamps && touch $@

clean:
	rm -rf $(VENV) .stamps .pytest_cache .ruff_cache tests/realkernel/results dist build
