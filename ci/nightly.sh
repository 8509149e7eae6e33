#!/usr/bin/env bash
# gpuhealth's nightly regression run, shared by every template in ci/: runs the health suite
# against the fleet, then (whatever it found) renders the HTML report, prints and plots the
# history, and copies the history store into reports/ for the CI system to keep.
#
# Run it on the controller (the machine that reaches the nodes over SSH), from any directory:
#   GPUHEALTH_INVENTORY=/etc/gpuhealth/inventory /opt/gpuhealth/ci/nightly.sh
#
# Environment (only GPUHEALTH_INVENTORY is required):
#   GPUHEALTH_INVENTORY    Ansible inventory (file or directory) of the GPU nodes
#   GPUHEALTH_GROUP        inventory group to check (gpu_nodes)
#   GPUHEALTH_STATE        directory kept between runs (/var/lib/gpuhealth)
#   GPUHEALTH_HISTORY      history store: a SQLite file or a postgresql://... URL
#                          (default $GPUHEALTH_STATE/history.sqlite)
#   GPUHEALTH_LEVEL        quick, standard or full (standard)
#   GPUHEALTH_WORKERS      hosts checked in parallel, pytest -n (8)
#   GPUHEALTH_PYTEST_ARGS  more pytest options, shell-quoted: "--regressions warn -m 'not nccl'"
#
# Exit status: pytest's. 0: every node PASS or WARN and no regression; 1: findings or
# regressions. Any other value is an error of the run itself: pytest's own (2, 3, 4, 5), 4 when
# the run could not be set up, 3 when the suite passed but a report step failed (so that a
# broken report does not go unnoticed), 75 when another nightly run holds the state directory.
# Whatever the suite found, the report steps run and reports/ holds tonight's files.
set -euo pipefail

trap 'echo "gpuhealth: setup failed (line $LINENO)" >&2; exit 4' ERR

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

if [ -z "${GPUHEALTH_INVENTORY:-}" ]; then
  echo "gpuhealth: set GPUHEALTH_INVENTORY to the Ansible inventory of the GPU nodes" >&2
  exit 4
fi
state="${GPUHEALTH_STATE:-/var/lib/gpuhealth}"
group="${GPUHEALTH_GROUP:-gpu_nodes}"
history="${GPUHEALTH_HISTORY:-$state/history.sqlite}"
# The state folder's own store starts on the first night; a GPUHEALTH_HISTORY file must exist
# (a mistyped path is a usage error, not an empty history that skips every regression test).
create=()
if [ -z "${GPUHEALTH_HISTORY:-}" ]; then create=(--history-create); fi
level="${GPUHEALTH_LEVEL:-standard}"
workers="${GPUHEALTH_WORKERS:-8}"

mkdir -p "$state" reports

# One run at a time per state directory, whichever scheduler started it (CI, timer, by hand):
# the script runs again under flock, which holds the lock itself (-o: the suite's processes,
# ssh masters included, do not inherit it).
if [ "${GPUHEALTH_NIGHTLY_LOCKED:-}" != "$state" ]; then
  rc=0
  GPUHEALTH_NIGHTLY_LOCKED="$state" flock -n -o -E 75 "$state/nightly.lock" \
    bash "$repo/ci/nightly.sh" || rc=$?
  if [ "$rc" -eq 75 ]; then
    echo "gpuhealth: another nightly run holds $state/nightly.lock; not started" >&2
  fi
  exit "$rc"
fi

# Nothing of an earlier run may pass for tonight's: the CI system keeps what is there.
rm -rf reports/junit.xml reports/verdicts.json reports/allure-report reports/history.png \
  reports/history.sqlite reports/allure-history.jsonl

make venv

# GPUHEALTH_PYTEST_ARGS split as the shell would (quotes kept), without eval.
extra=()
if [ -n "${GPUHEALTH_PYTEST_ARGS:-}" ]; then
  args_file="reports/.pytest-args"
  .venv/bin/python -c 'import shlex, sys; print(*shlex.split(sys.argv[1]), sep="\0", end="")' \
    "$GPUHEALTH_PYTEST_ARGS" >"$args_file"
  if [ -s "$args_file" ]; then mapfile -d '' -t extra <"$args_file"; fi
  rm -f "$args_file"
fi

trap - ERR
rc=0
.venv/bin/pytest --hosts="ansible://$group?ansible_inventory=$GPUHEALTH_INVENTORY" \
  --level "$level" -n "$workers" --history "$history" ${create[@]+"${create[@]}"} \
  ${extra[@]+"${extra[@]}"} || rc=$?
echo "gpuhealth: pytest exited with $rc"

# From here on every step runs, whatever the one before it did.
failed=()
step() {
  local label="$1"
  shift
  echo "gpuhealth: $label"
  "$@" || failed+=("$label")
}

step "HTML report" make report ALLURE_HISTORY="$state/allure-history.jsonl"
# The morning answer first: one line per regression of tonight's runs (warn: pytest's status
# already says whether there were any), then the runs of the last 7 days.
step "what regressed tonight" \
  .venv/bin/gpuhealth history regressions --history "$history" --regressions warn
step "the last 7 days" .venv/bin/gpuhealth history --history "$history" --since 7d
step "history plot" \
  .venv/bin/gpuhealth history --history "$history" --plot reports/history.png --since 30d

# A consistent copy of the SQLite store even while another process writes to it (the backup
# API, not cp; no sqlite3 CLI needed). A PostgreSQL store is kept by its server.
backup='import sqlite3, sys
with sqlite3.connect(sys.argv[1]) as src, sqlite3.connect(sys.argv[2]) as dst:
    src.backup(dst)'
if [[ "$history" != *://* && -f "$history" ]]; then
  step "copy of the history store" \
    .venv/bin/python -c "$backup" "$history" reports/history.sqlite
fi
if [ -f "$state/allure-history.jsonl" ]; then
  step "copy of the Allure history" \
    cp "$state/allure-history.jsonl" reports/allure-history.jsonl
fi

if [ "${#failed[@]}" -gt 0 ]; then
  printf 'gpuhealth: report step failed: %s\n' "${failed[@]}" >&2
  if [ "$rc" -eq 0 ]; then rc=3; fi
fi
exit "$rc"
