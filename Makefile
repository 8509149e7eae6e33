# `make check`: the health suite against this machine. `make test`: the project's own tests.
# Both set up everything they need on a fresh Debian/Ubuntu machine (as root: apt packages).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TOOLS  := .tools
PYTEST_ARGS ?=
.PHONY: deps test-deps venv check report test bench fuzz lint clean

# System tools (as root on Debian/Ubuntu: apt-get installs the package of each missing tool,
# and only those; a tool from elsewhere on PATH is used as it is). .ci/setup-deps.sh lists them.
deps:
	@PYTHON=$(PYTHON) sh .ci/setup-deps.sh base

test-deps:
	@sh .ci/setup-deps.sh test

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

# Render $(REPORTS)/allure-results with Allure 3 (from npm, offline), grouped host > check
# family > GPU. Up to SINGLE_FILE_MAX tests (~150 nodes) as one self-contained HTML file that
# opens from disk; above that as a folder the browser loads piece by piece (one file would be
# ~90 MB per 128 nodes and take seconds per MB to open): serve it, e.g. with
# `python3 -m http.server -d reports/allure-report`. The bed's end-to-end test renders its
# report with this target too (REPORTS=<its reports dir>).
# Allure keeps each test's history across runs (per-test history, trend charts) in
# ALLURE_HISTORY, next to the default run store (reports/history.sqlite); a nightly job that
# keeps its store elsewhere passes ALLURE_HISTORY=<that folder>/allure-history.jsonl.
REPORTS ?= reports
ALLURE_HISTORY ?= $(REPORTS)/allure-history.jsonl
SINGLE_FILE_MAX ?= 20000
report: $(TOOLS)/node_modules/.bin/allure
	@if [ -d $(REPORTS)/allure-results ]; then \
	  tests=$$(find $(REPORTS)/allure-results -name '*-result.json' | wc -l); \
	  form=--single-file; [ $$tests -le $(SINGLE_FILE_MAX) ] || form=; \
	  rm -rf $(REPORTS)/allure-report && \
	  $(TOOLS)/node_modules/.bin/allure awesome $(REPORTS)/allure-results \
	    --config $(CURDIR)/allurerc.json \
	    -o $(REPORTS)/allure-report $$form --report-name gpuhealth \
	    --history-path $(abspath $(ALLURE_HISTORY)) \
	    --group-by parentSuite,suite,subSuite >/dev/null && \
	  echo "HTML report: $(abspath $(REPORTS))/allure-report/index.html" && \
	  if [ -z "$$form" ]; then echo "($$tests tests: a folder; serve it:" \
	    "python3 -m http.server -d $(abspath $(REPORTS))/allure-report)"; fi; \
	else echo "no $(REPORTS)/allure-results yet: run make check first"; fi

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check src selftest tests
	$(BIN)/mypy
	$(BIN)/yamllint -s .
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/ansible-lint --offline --profile production -q

# Unit and suite-level tests in parallel, then the SSH test bed ones (root: namespaces, mounts;
# skipped otherwise) on one worker, printing their timings; both run, either failing fails.
test: venv test-deps lint
	@rc=0; $(BIN)/pytest -c selftest/pytest.ini selftest -m "not bed" -n auto $(PYTEST_ARGS) || rc=$$?; \
	$(BIN)/pytest -c selftest/pytest.ini selftest -m bed -s $(PYTEST_ARGS) || rc=$$?; exit $$rc

# The health suite live on a test bed of BENCH_NODES SSH nodes (root; ~6 min at 32 on 2 CPUs):
# -n 1/2/4 from cold, with open ssh masters and with none, then playbooks/collect.yml
# (forks 5, 32) and offline judging of its documents. Every run is held to the bed's known
# verdicts and one probe per host; prints one table. BENCH_ARGS='--repeat 3' for medians.
BENCH_NODES ?= 32
BENCH_ARGS ?=
bench: venv
	$(BIN)/python bench/bed_scale.py --nodes $(BENCH_NODES) $(BENCH_ARGS)

# A longer fuzz campaign for nights: fresh random cases, FUZZ_EXAMPLES per target (make test
# runs 700 fixed ones). A failure prints the minimal input: make it a test in
# selftest/test_found_by_fuzzing.py.
FUZZ_EXAMPLES ?= 20000
fuzz: venv
	GPUHEALTH_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) GPUHEALTH_FUZZ_FRESH=1 \
	  $(BIN)/pytest -c selftest/pytest.ini selftest/test_fuzz.py -n auto $(PYTEST_ARGS)

clean:
	rm -rf reports/allure-results reports/allure-report reports/facts reports/*.xml reports/*.json
