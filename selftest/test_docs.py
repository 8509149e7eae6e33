"""The README says what the code does: its tables are generated from the code, and its
"Adding a check family" walkthrough is followed to the letter in a copy of the tree."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from gpuhealth import registry
from gpuhealth.cli import keys_markdown, profiles_markdown
from gpuhealth.config import ProfileSet
from gpuhealth.results import Action
from selftest.suite import REPO, SuiteRun

README = (REPO / "README.md").read_text()


def chapter(title: str) -> str:
    """The text of one `## title` section of the README."""
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else len(README)]


def test_action_code_table_is_the_action_enum():
    rows = re.findall(r"^\| `([A-Z_]+)` \| (.+) \|$", chapter("Reading the reports"), re.M)
    assert rows == [(a.value, a.meaning) for a in Action]


def test_profile_key_table_is_generated_from_the_families():
    """Regenerate with `gpuhealth profiles --keys --markdown`."""
    text = chapter("Profiles and inventory variables")
    begin, end = "<!-- profile keys: begin -->\n", "\n<!-- profile keys: end -->"
    table = text[text.index(begin) + len(begin) : text.index(end)]
    assert table == keys_markdown()


def test_profile_table_is_generated_from_the_profiles():
    """Regenerate with `gpuhealth profiles --table`."""
    text = chapter("Profiles and inventory variables")
    begin, end = "<!-- profiles: begin -->\n", "\n<!-- profiles: end -->"
    table = text[text.index(begin) + len(begin) : text.index(end)]
    assert table == profiles_markdown(ProfileSet())
    for name in ("b200", "gb200", "gb300"):  # Blackwell, with what identifies it
        assert re.search(rf"^\| `{name}` \| /\S*B[23]00/, 0x", table, re.M), name


def test_every_check_is_judged_by_exactly_one_test_named_after_it():
    judged: Counter[str] = Counter()
    for module in sorted((REPO / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                calls = [
                    c.args[0].value
                    for c in ast.walk(node)
                    if isinstance(c, ast.Call)
                    and getattr(c.func, "id", None) == "judge"
                    and isinstance(c.args[0], ast.Constant)
                ]
                assert calls in ([], [node.name.removeprefix("test_")]), (module, node.name)
                judged.update(calls)
    assert judged == Counter(list(registry.checks()))


# ---------------------------------------------------------------- the walkthrough


def walkthrough() -> tuple[dict[str, str], str]:
    """The files the walkthrough writes (path -> content) and its NAMES line."""
    text = chapter("Adding a check family")
    files = {
        path: textwrap.dedent(body)
        for path, body in re.findall(
            r"^ *`([\w/.]+\.py)`:\n\n *```python\n(.*?)^ *```", text, re.M | re.S
        )
    }
    (names,) = re.findall(r"^ *(NAMES = \(\n.*?^ *\))$", text, re.M | re.S)
    return files, textwrap.dedent("   " + names)


def in_tree(tree: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run Python in the copied tree (its src/ ahead of the installed gpuhealth)."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(tree / "src"), "PATH": "/usr/bin:/bin"},
        **kwargs,
    )


def suite_in(
    tree: Path, facts: Path, inventory: Path, *options: str, cwd: Path
) -> subprocess.CompletedProcess:
    """The suite of the copied tree on saved facts and an inventory, with `options`."""
    return in_tree(
        tree,
        "-m",
        "pytest",
        "-c",
        str(tree / "pytest.ini"),
        "--facts",
        str(facts),
        "--inventory",
        str(inventory),
        *options,
        "-rA",
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the checkout with the walkthrough followed: copy, write, delete the rest."""
    tree = tmp_path_factory.mktemp("tree")
    shutil.copytree(REPO / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "tests", tree / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pytest.ini", tree)
    family = tree / "src/gpuhealth/families/clock"
    shutil.copytree(tree / "src/gpuhealth/families/reclaim", family)
    files, names = walkthrough()
    for path, body in files.items():
        (tree / path).write_text(body)
    for left in family.glob("*.py"):
        if str(left.relative_to(tree)) not in files:
            left.unlink()
    init = tree / "src/gpuhealth/families/__init__.py"
    init.write_text(re.sub(r"^NAMES = \(\n.*?^\)$", names, init.read_text(), flags=re.M | re.S))
    return tree


def test_the_walkthrough_writes_a_whole_family():
    files, names = walkthrough()
    assert sorted(files) == [
        *(
            f"src/gpuhealth/families/clock/{name}.py"
            for name in (
                "__init__",
                "checks",
                "family",
                "limits",
                "metrics",
                "parse_clocksource",
                "probe",
                "schema",
            )
        ),
        "tests/test_clock.py",
    ]
    assert names.endswith('"clock",\n)')


@pytest.mark.suite
def test_the_new_family_is_probed_shipped_and_judged(tree, tmp_path):
    keys = in_tree(tree, "-m", "gpuhealth.cli", "profiles", "--keys")
    assert re.search(r"^clock +clocksource_expected +null", keys.stdout, re.M), keys.stderr

    node = tmp_path / "node/sys/devices/system/clocksource/clocksource0"
    node.mkdir(parents=True)
    (node / "current_clocksource").write_text("hpet\n")
    (node / "available_clocksource").write_text("tsc hpet acpi_pm \n")
    # Through the real transport: the shipped bundle is found by following imports.
    script = (
        "import json, subprocess, sys\n"
        "from gpuhealth.cli import probe_config\n"
        "from gpuhealth.transport import node_modules, parse_output, probe_call\n"
        "assert 'gpuhealth.families.clock.parse_clocksource' in node_modules()[0]\n"
        f"config = probe_config(None, {str(tmp_path / 'node')!r})\n"
        "config['expect']['kernel_log_timeout_s'] = 1\n"
        "call = probe_call(config, sys.executable)\n"
        "out = subprocess.run(call.command, shell=True, input=call.stdin,\n"
        "                     capture_output=True, text=True).stdout\n"
        "print(json.dumps(parse_output(out)))\n"
    )
    probed = in_tree(tree, "-c", script)
    assert probed.returncode == 0, probed.stderr
    doc = json.loads(probed.stdout)
    assert doc["clock"] == {"current": "hpet", "available": ["tsc", "hpet", "acpi_pm"]}

    facts = tmp_path / "facts"
    facts.mkdir()
    (facts / "n1.json").write_text(json.dumps(doc))
    doc["clock"]["current"] = "tsc"
    (facts / "n2.json").write_text(json.dumps(doc))
    del doc["clock"]["current"]
    doc["clock"]["unavailable"] = {"current": {"kind": "error", "detail": "cannot read it"}}
    (facts / "n3.json").write_text(json.dumps(doc))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  vars:\n    clocksource_expected: tsc\n  hosts: {n1: {}, n2: {}, n3: {}}\n"
    )
    run = suite_in(
        tree,
        facts,
        inventory,
        f"--junitxml={tmp_path / 'junit.xml'}",
        f"--alluredir={tmp_path / 'allure'}",
        f"--verdicts={tmp_path / 'verdicts.json'}",
        f"--prometheus-textfile-dir={tmp_path}",
        f"--history={tmp_path / 'history.sqlite'}",
        "--history-create",
        "-k",
        "clocksource",
        cwd=tmp_path,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    suite = SuiteRun(run.returncode, run.stdout, tmp_path)
    assert suite.outcomes() == {
        "test_clocksource[n1]": "failed",
        "test_clocksource[n2]": "passed",
        "test_clocksource[n3]": "failed",
    }
    messages = suite.messages()
    assert messages["test_clocksource[n1]"].startswith(
        "Failed: n1: clocksource hpet, expected tsc. Action FIX_CONFIG: look for 'clocksource'"
    )
    assert messages["test_clocksource[n3]"].startswith(
        "Failed: n3: could not read current clocksource: cannot read it. Action RERUN"
    )
    # The family's metric, exported and kept by history with no code outside its folder.
    textfile = (tmp_path / "gpuhealth.prom").read_text()
    assert 'gpuhealth_node_clocksource_fallback{host="n1"} 1.0' in textfile
    assert 'gpuhealth_node_clocksource_fallback{host="n2"} 0.0' in textfile
    assert 'clocksource_fallback{host="n3"}' not in textfile  # not read: no series
    # The next night n2 has fallen back: its node_regression fails against its own past.
    night = tmp_path / "night2"
    night.mkdir()
    doc["clock"] = {"current": "hpet", "available": ["tsc", "hpet", "acpi_pm"]}
    doc["collected_at"] = "2030-01-02T03:00:00Z"
    (night / "n2.json").write_text(json.dumps(doc))
    inventory.write_text("all:\n  hosts: {n2: {}}\n")
    again = suite_in(
        tree,
        night,
        inventory,
        f"--junitxml={night / 'junit.xml'}",
        f"--history={tmp_path / 'history.sqlite'}",
        "-k",
        "node_regression",
        cwd=tmp_path,
    )
    assert again.returncode == 1, again.stdout + again.stderr
    regression = SuiteRun(again.returncode, again.stdout, night).messages()
    assert (
        "falls back from the TSC 0 -> 1 since the last run"
        in regression["test_node_regression[n2]"]
    )
