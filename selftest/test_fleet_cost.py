"""What each host costs once per run, held to its slower, plainer form (issue 24, item 5).

Judging 1,024 saved documents pays every per-document step 1,024 times: the screen for values
no report can store (documents._storable, before the walk that names a value's path) and the
facts document written for people in the Allure report (plugin.readable_json, instead of
json's pure-Python `indent`). Each must give what the plain form gives.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuhealth import documents
from gpuhealth.plugin import readable_json
from selftest.facts import healthy_h100, write_facts
from selftest.mutations import FACT_VALUES, mutated_facts
from selftest.suite import run_suite
from selftest.test_fuzz import EXAMPLES, fuzz


def same_verdict(doc: dict[str, Any]) -> None:
    """The screen passes a document exactly when the walk with paths finds nothing in it."""
    found = documents._first_unstorable(doc)
    assert documents._storable(doc) == (found is None), found
    assert documents._unstorable(doc) == found


def test_the_screen_agrees_with_the_walk_on_damaged_documents():
    fuzz(mutated_facts(healthy_h100()), same_verdict, EXAMPLES // 4)


def nested(depth: int) -> Any:
    """A value `depth` containers deep (alternately objects and lists) around a text."""
    found: Any = "x"
    for level in range(depth):
        found = [found] if level % 2 else {"x": found}
    return found


@pytest.mark.parametrize(
    "value",
    [
        2**63 - 1,
        2**63,
        -(2**63),
        -(2**63) - 1,
        "a" * documents.MAX_TEXT,
        "a" * (documents.MAX_TEXT + 1),
        nested(documents.MAX_DEPTH - 1),
        nested(documents.MAX_DEPTH),
        float("-inf"),
        1e308,
        *FACT_VALUES,
    ],
)
def test_the_screen_agrees_with_the_walk_at_each_limit(value):
    doc = healthy_h100()
    doc["gpus"][2]["ecc"]["volatile"]["corrected"] = value
    same_verdict(doc)


def test_a_document_the_screen_doubts_is_named_by_the_walk():
    """A type JSON never gives (a tuple from a caller of validated()) is left to the walk."""
    doc = {"schema_version": 3, "odd": (1, 2)}
    assert not documents._storable(doc)
    assert documents._unstorable(doc) is None


def test_readable_json_reads_back_as_the_document_on_fewer_lines():
    doc = healthy_h100()
    text = readable_json(doc)
    assert json.loads(text) == doc
    assert text.count("\n") < json.dumps(doc, indent=1).count("\n") / 2
    lines = text.splitlines()
    # A counter group on one line; an object that nests one item per line, indented.
    assert any(line.strip().startswith('"volatile": {"corrected": 0') for line in lines)
    assert ' "gpus": [' in lines and "  {" in lines


def test_readable_json_writes_what_json_writes_for_any_value():
    def prop(doc: dict[str, Any]) -> None:
        text = readable_json(doc)
        assert "".join(text.split()) == "".join(json.dumps(doc).split())
        assert json.dumps(json.loads(text)) == json.dumps(doc)  # NaN compares unequal

    fuzz(mutated_facts(healthy_h100()), prop, EXAMPLES // 4)
    odd_keys = {1: [{"a": [1]}], None: {"x": {"y": 1}}, 1.5: "\u00e9\n", False: []}
    assert json.loads(readable_json(odd_keys)) == json.loads(json.dumps(odd_keys))


@pytest.mark.suite
def test_the_facts_attachment_is_the_document(tmp_path):
    doc = healthy_h100()
    facts = write_facts(tmp_path / "facts", n1=doc)
    run = run_suite(tmp_path / "r", "--facts", str(facts), "--profile", "h100-sxm")
    assert run.rc == 0, run.output
    attached = list((tmp_path / "r" / "allure-results").glob("*-attachment.json"))
    assert len(attached) == 1
    assert json.loads(attached[0].read_text()) == documents.validated(doc, "n1")
