#!/bin/sh
# The system tools `make` needs, installed with apt only where a tool is missing.
#
#   sh .ci/setup-deps.sh base   what `make venv`, `make check` and `make report` run on
#   sh .ci/setup-deps.sh test   what `make test` adds: the real components the tests drive
#
# Each tool is looked for wherever it came from (Debian, Kubernetes' own apt repository,
# NodeSource, a tarball on PATH) and accepted when it does what the tests use; only the Debian
# package of a tool that is missing is installed. Installing a whole list instead breaks
# machines that already have a tool from elsewhere: Debian's kubernetes-client and the `kubectl`
# package of pkgs.k8s.io both ship /usr/bin/kubectl, and dpkg refuses the second.
# Prints one line naming what it installed and why, nothing when everything is there; exits 1
# when a tool is missing and this is no root with apt-get, or a tool found cannot be used.
# PYTHON (python3) is the interpreter checked; PG_LIBDIR (/usr/lib/postgresql) is where
# selftest/test_history.py looks for initdb.
set -u

PYTHON=${PYTHON:-python3}
PG_LIBDIR=${PG_LIBDIR:-/usr/lib/postgresql}
packages=""   # Debian packages to install, each once
reasons=""    # "package (what was missing)", for the one line printed
unusable=""   # tools found that cannot be used, with why

need() {
	case " $packages " in *" $1 "*) return ;; esac
	packages="${packages:+$packages }$1"
	reasons="${reasons:+$reasons, }$1 ($2)"
}

bad() {
	unusable="${unusable:+$unusable; }$1"
}

tool() { # tool COMMAND PACKAGE: the package that provides a command, when it is missing
	command -v "$1" >/dev/null 2>&1 || need "$2" "$1 missing"
}

base() {
	if ! command -v "$PYTHON" >/dev/null 2>&1; then
		need python3 "$PYTHON missing"
		need python3-venv "$PYTHON missing"
	elif ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
		bad "$PYTHON is $("$PYTHON" -V 2>&1): gpuhealth needs Python 3.10 or later"
	elif ! "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then
		need python3-venv "$PYTHON -m venv unavailable"
	fi
	tool gcc gcc # the fake libnvidia-ml.so.1 is built from C
	tool make make
	tool node nodejs # Allure 3 renders the HTML report
	tool npm npm
	tool openssl openssl
}

check_initdb() { # PostgreSQL for the run store's tests: the newest initdb under PG_LIBDIR
	found=""
	for bin in "$PG_LIBDIR"/*/bin/initdb; do
		[ -x "$bin" ] && found=$bin
	done
	if [ -z "$found" ]; then
		need postgresql "no $PG_LIBDIR/*/bin/initdb"
		return
	fi
	# "initdb (PostgreSQL) 15.18 (Debian ...)": psycopg 3 drives servers from PostgreSQL 10.
	version=$("$found" --version 2>/dev/null) || version=""
	major=${version#*) }
	major=${major%%[!0-9]*}
	if [ -z "$major" ]; then
		bad "$found --version printed no version ('$version')"
	elif [ "$major" -lt 10 ]; then
		bad "$found is PostgreSQL $major: the run store's tests need 10 or later"
	fi
}

check_kubectl() { # any kubectl that can apply a patch offline, as selftest/test_kubernetes.py does
	if ! command -v kubectl >/dev/null 2>&1; then
		need kubernetes-client "kubectl missing"
		return
	fi
	help=$(command kubectl patch --help 2>&1) || help=""
	case $help in
	*--local*) ;;
	*) bad "$(command -v kubectl) has no \`kubectl patch --local\` (the tests apply patches offline)" ;;
	esac
}

test_tools() {
	check_initdb
	tool systemd-analyze systemd # the ci/ templates' units are verified
	tool slurmctld slurmctld     # a real Slurm on the test bed drains and resumes nodes
	tool slurmd slurmd
	tool scontrol slurm-client
	tool munged munge
	tool prometheus-node-exporter prometheus-node-exporter # the textfile collector, read back
	tool promtool prometheus                               # the alert rules, unit-tested
	tool numactl numactl                                   # node-check's host checks here
	check_kubectl
}

case ${1:-} in
base) base ;;
test) test_tools ;;
*)
	echo "usage: $0 base|test" >&2
	exit 2
	;;
esac

if [ -n "$unusable" ]; then
	echo "setup: cannot use $unusable" >&2
	exit 1
fi
[ -n "$packages" ] || exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	echo "setup: missing $reasons: install these packages (apt-get install $packages), or run" \
		"make as root on Debian/Ubuntu" >&2
	exit 1
fi
# shellcheck disable=SC2086 # one word per package
log=$(apt-get update -qq 2>&1 &&
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages 2>&1) && status=0 || status=$?
if [ "$status" != 0 ]; then
	printf '%s\n' "$log" >&2
	echo "setup: apt-get install $packages failed (exit $status); needed: $reasons" >&2
	exit "$status"
fi
echo "setup: installed $reasons"
