"""IMEX: the nvidia-imex service and the state of its domain (`nvidia-imex-ctl -N`) on the
nodes of a multi-node NVLink domain (GB200/GB300 NVL72).

Set `imex_required: true` for those nodes (and `imex_expected_nodes`, e.g. 18 for a whole
NVL72 rack); elsewhere both tests skip with the reason. Select them with `-m imex`.
"""

import pytest

from gpuhealth.families.imex.checks import faults
from gpuhealth.families.imex.limits import ImexLimits
from gpuhealth.plugin import attach_json, judge

pytestmark = pytest.mark.imex


def test_imex_service(node):
    """nvidia-imex active where imex_required is true."""
    judge("imex_service", node)


def test_imex_domain(node):
    """Every node of the IMEX domain READY on one version, all connections C, Domain State UP."""
    record = node.view.facts.get("imex")
    domain = record.get("domain") if isinstance(record, dict) else None
    expected = node.view.limits.get(ImexLimits).imex_expected_nodes
    if domain and faults(domain, expected):
        attach_json(node, f"imex domain {node.view.host}.json", domain)
    judge("imex_domain", node)
