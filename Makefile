# Two commands: `make run` and `make test`. Each creates .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DATA   ?= var
LISTEN ?= 127.0.0.1:8080

.PHONY: run test lint bench clean postgres browser

# PostgreSQL server binaries for the test suite's second backend (DESIGN §10, B3): the tests
# start their own throwaway server from initdb/pg_ctl/postgres, found on PATH or in
# /usr/lib/postgresql/*/bin (Debian) or /usr/pgsql-*/bin (RHEL). Installed when absent.
PG_FOUND := for d in $$(dirname "$$(command -v initdb 2>/dev/null || echo /nonexistent/x)") \
	/usr/lib/postgresql/*/bin /usr/pgsql-*/bin; do \
	[ -x "$$d/initdb" ] && [ -x "$$d/pg_ctl" ] && [ -x "$$d/postgres" ] && exit 0; done; exit 1

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	@echo "better-compute control plane: http://$(LISTEN)  (root token: $(DATA)/root.token)"
	$(BIN)/better-compute-controlplane demo --data $(DATA) --listen $(LISTEN)

postgres:
	@if ( $(PG_FOUND) ); then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	else echo "make: PostgreSQL server binaries (initdb, pg_ctl, postgres) are missing and cannot be installed: need root or passwordless sudo; install PostgreSQL, then rerun" >&2; exit 1; fi; \
	if command -v apt-get >/dev/null; then \
		echo "make: installing PostgreSQL server binaries (apt-get install postgresql) for the tests"; \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null; \
	elif command -v dnf >/dev/null; then \
		echo "make: installing PostgreSQL server binaries (dnf install postgresql-server) for the tests"; \
		$$SUDO dnf install -y -q postgresql-server >/dev/null; \
	else echo "make: PostgreSQL server binaries (initdb, pg_ctl, postgres) are missing and no apt-get or dnf here to install them: install PostgreSQL, then rerun" >&2; exit 1; fi; \
	( $(PG_FOUND) ) || { echo "make: installing PostgreSQL did not provide initdb, pg_ctl and postgres; install PostgreSQL by hand, then rerun" >&2; exit 1; }

# Chromium for the web console's browser test (M2): Playwright drives the system's chromium
# (Debian: chromium, RHEL: chromium-browser); `playwright install` is never run (it downloads
# browsers). Installed when absent.
CHROMIUM_FOUND := command -v chromium >/dev/null || command -v chromium-browser >/dev/null

browser:
	@if $(CHROMIUM_FOUND); then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	else echo "make: chromium is missing and cannot be installed: need root or passwordless sudo; install Chromium, then rerun" >&2; exit 1; fi; \
	if command -v apt-get >/dev/null; then \
		echo "make: installing Chromium (apt-get install chromium) for the console test"; \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null; \
	elif command -v dnf >/dev/null; then \
		echo "make: installing Chromium (dnf install chromium) for the console test"; \
		$$SUDO dnf install -y -q chromium dejavu-sans-fonts >/dev/null; \
	else echo "make: chromium is missing and no apt-get or dnf here to install it: install Chromium, then rerun" >&2; exit 1; fi; \
	( $(CHROMIUM_FOUND) ) || { echo "make: installing Chromium did not provide a chromium command; install it by hand, then rerun" >&2; exit 1; }

# The suite on both backends (B3) at once: SQLite, and PostgreSQL (a server per worker, that
# the tests start) beside it, each spread over TEST_WORKERS processes (pytest-xdist): most of a
# test's time is spent waiting (on daemons it starts, servers, fsync, timeouts), so more
# workers than cores keep the cores busy. The PostgreSQL run's output follows the SQLite run's.
# Fails if either fails.
TEST_WORKERS ?= 3
test: $(STAMP) postgres browser
	@mkdir -p $(DATA); \
	BC_TEST_BACKEND=postgresql $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) >$(DATA)/test-postgresql.log 2>&1 & postgres=$$!; \
	echo "== SQLite"; $(BIN)/python -m pytest -q -n $(TEST_WORKERS); sqlite=$$?; \
	wait $$postgres; pg=$$?; echo "== PostgreSQL"; cat $(DATA)/test-postgresql.log; \
	exit $$(( sqlite != 0 || pg != 0 ))

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# wrk, the C load client bench/fleet.py uses beside its aiohttp client when installed (Debian,
# Ubuntu: wrk). Installed when absent; when it cannot be, the benchmarks run with aiohttp alone.
bench: $(STAMP)
	-@command -v wrk >/dev/null || { \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	else echo "make: wrk is missing and cannot be installed (need root or passwordless sudo): bench/fleet.py measures with aiohttp alone" >&2; exit 0; fi; \
	if command -v apt-get >/dev/null; then \
		echo "make: installing wrk (apt-get install wrk) for bench/fleet.py"; \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk >/dev/null; \
	elif command -v dnf >/dev/null; then \
		echo "make: installing wrk (dnf install wrk) for bench/fleet.py"; \
		$$SUDO dnf install -y -q wrk >/dev/null; \
	fi; \
	command -v wrk >/dev/null || echo "make: wrk could not be installed: bench/fleet.py measures with aiohttp alone" >&2; }
	$(BIN)/python bench/api.py
	$(BIN)/python bench/fleet.py
	$(BIN)/python bench/liveness.py
	$(BIN)/python bench/reconciler.py
	$(BIN)/python bench/liveness.py --postgres
	$(BIN)/python bench/agent_footprint.py
	$(BIN)/python bench/reservations.py
	$(BIN)/python bench/packing.py
	$(BIN)/python bench/durability.py
	$(BIN)/python bench/crash.py
	$(BIN)/python bench/crash.py --postgres --rounds 3
	$(BIN)/python bench/backends.py
	$(BIN)/python bench/writes.py
	$(BIN)/python bench/writes.py --sqlite
	$(BIN)/python bench/plan.py
	$(BIN)/python bench/fleet_sim.py --nodes 2000 --seconds 60

clean:
	rm -rf $(VENV) $(DATA) .pytest_cache
