# `make check`: the health suite against this machine. `make test`: the project's own tests.
# Both set up everything they need on a fresh Debian/Ubuntu machine (as root: apt packages).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TOOLS  := .tools
PYTEST_ARGS ?=
APT_PACKAGES := python3 python3-venv gcc make nodejs npm openssl

.PHONY: deps venv check report test fuzz lint clean

deps:
	@missing=""; \
	for cmd in $(PYTHON) gcc node npm openssl; do command -v $$cmd >/dev/null || missing="$$missing $$cmd"; done; \
	$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || missing="$$missing venv"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing system packages (missing:$$missing)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	  else echo "missing:$$missing - install: $(APT_PACKAGES)" >&2; exit 1; fi; \
	fi

$(STAMP): pyproject.toml | deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(STAMP)

# The health suite on this machine (local://). Exit status is the suite's; reports are written
# either way: reports/junit.xml, reports/allure-results/, reports/verdicts.json, reports/facts/.
check: venv
	@rc=0; $(BIN)/pytest $(PYTEST_ARGS) || rc=$$?; \
	$(MAKE) --no-print-directory report || true; exit $$rc

$(TOOLS)/node_modules/.bin/allure: | deps
	mkdir -p $(TOOLS)
	npm install --silent --no-audit --no-fund --prefix $(TOOLS) allure@3 >/dev/null

# Render $(REPORTS)/allure-results as one self-contained HTML file (Allure 3 from npm, offline)
# that opens from disk, grouped host > check family > GPU. The bed's end-to-end test renders
# its report with this target too (REPORTS=<its reports dir>).
REPORTS ?= reports
report: $(TOOLS)/node_modules/.bin/allure
	@if [ -d $(REPORTS)/allure-results ]; then \
	  rm -rf $(REPORTS)/allure-report && \
	  $(TOOLS)/node_modules/.bin/allure awesome $(REPORTS)/allure-results \
	    --config $(CURDIR)/allurerc.json \
	    -o $(REPORTS)/allure-report --single-file --report-name gpuhealth \
	    --group-by parentSuite,suite,subSuite >/dev/null && \
	  echo "HTML report: $(abspath $(REPORTS))/allure-report/index.html"; \
	else echo "no $(REPORTS)/allure-results yet: run make check first"; fi

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check src selftest tests
	$(BIN)/mypy
	$(BIN)/yamllint -s .
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/ansible-lint --offline --profile production -q

# Unit and suite-level tests in parallel, then the SSH test bed ones (root: namespaces, mounts;
# skipped otherwise) on one worker, printing their timings; both run, either failing fails.
test: venv lint
	@rc=0; $(BIN)/pytest -c selftest/pytest.ini selftest -m "not bed" -n auto $(PYTEST_ARGS) || rc=$$?; \
	$(BIN)/pytest -c selftest/pytest.ini selftest -m bed -s $(PYTEST_ARGS) || rc=$$?; exit $$rc

# A longer fuzz campaign for nights: fresh random cases, FUZZ_EXAMPLES per target (make test
# runs 700 fixed ones). A failure prints the minimal input: make it a test in
# selftest/test_found_by_fuzzing.py.
FUZZ_EXAMPLES ?= 20000
fuzz: venv
	GPUHEALTH_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) GPUHEALTH_FUZZ_FRESH=1 \
	  $(BIN)/pytest -c selftest/pytest.ini selftest/test_fuzz.py -n auto $(PYTEST_ARGS)

clean:
	rm -rf reports/allure-results reports/allure-report reports/facts reports/*.xml reports/*.json
