"""The pure checks, on facts parsed from the real nvidia-smi samples (and edits of them)."""

from __future__ import annotations

import copy

import pytest

from gpuhealth import registry
from gpuhealth.checks import CheckSet, NodeView
from gpuhealth.families.gpu.scope import GPU
from gpuhealth.registry import Family
from gpuhealth.results import Result, passed
from selftest.facts import H100_TEXT, expected_baseline_skip, healthy_h100, sample
from selftest.facts import judge as run


def test_healthy_baseline_passes_every_check():
    facts = healthy_h100()
    subjects = [(name, None) for name in registry.names("node")]
    subjects += [(name, i) for i in range(8) for name in registry.names("gpu")]
    for name, index in subjects:
        result = run(name, facts, index)
        skip = expected_baseline_skip(name)
        if skip is None:
            assert result.status == "PASS", (name, index, result.text)
        else:
            assert result.status == "SKIP" and skip in result.text, (name, result.text)


def test_h100_sample_with_hw_slowdown_fails_throttle_on_all_8_gpus():
    facts = sample(H100_TEXT.name)
    results = [run("throttle", facts, i) for i in range(8)]
    assert [r.status for r in results] == ["FAIL"] * 8
    first = results[0].text
    assert first.startswith(
        "node17 gpu0 (GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa, serial 1650124031592"
    )
    assert "hw_slowdown" in first and "hw_power_brake_slowdown" in first
    assert ". Action INSPECT: hardware slowdown" in first


@pytest.mark.parametrize(
    ("version", "minimum", "status"),
    [
        ("570.86.15", "570", "PASS"),
        ("580.65.06", "570", "PASS"),
        ("565.57.01", "570", "FAIL"),
        ("535.161.08", "570", "FAIL"),
        ("570.86.15", "570.124.06", "FAIL"),
        ("570.133.20", "570.124.06", "PASS"),
    ],
)
def test_driver_gate_compares_versions_numerically(version, minimum, status):
    facts = healthy_h100()
    facts["driver"]["version"] = version
    result = run("driver_version", facts, min_driver_version=minimum)
    assert result.status == status, result.text
    if status == "FAIL":
        assert f"driver {version} is older than the required {minimum}" in result.text


@pytest.mark.parametrize(
    ("name", "driver"),
    [
        ("telegraf_tesla-t4_515.105.01_v11.xml", "515.105.01"),
        ("gpud_h100x8_535.161.08_query.txt", "535.161.08"),
        ("gpud_titanv_560.35.03_query.txt", "560.35.03"),
        ("telegraf_a100-sxm4-80gb_535.54.03_mig_v12.xml", "535.54.03"),
    ],
)
def test_old_driver_samples_fail_the_gate(name, driver):
    result = run("driver_version", sample(name), profile=None)
    assert result.status == "FAIL"
    assert driver in result.text


def test_rtx3060_on_570_passes_recovery_action_and_driver_gate():
    facts = sample("telegraf_rtx3060_570.124.04_v12.xml")
    assert run("recovery_action", facts, 0, profile=None).status == "PASS"
    assert run("driver_version", facts, profile=None).status == "PASS"


@pytest.mark.parametrize(
    ("value", "name", "advice"),
    [
        (1, "GPU_RESET", "reset the GPU"),
        (2, "NODE_REBOOT", "reboot"),
        (3, "DRAIN_P2P", "peer-to-peer"),
        (4, "DRAIN_AND_RESET", "drain the node"),
        # every value nvidia-ml-py names (nvmlGpuRecoveryAction_t), then one newer than that
        (5, "RECOVER_IMEX_DOMAIN", "recover the IMEX domain"),
        (6, "BUS_RESET", "PCIe bus"),
        (7, "SYSTEM_REBOOT", "whole system"),
        (8, "UNKNOWN(8)", "NVIDIA support"),
    ],
)
def test_recovery_action_other_than_none_fails_naming_it(value, name, advice):
    facts = healthy_h100()
    facts["gpus"][5]["recovery_action"] = value
    result = run("recovery_action", facts, 5)
    assert result.status == "FAIL"
    assert f"GPU recovery action is {name} ({value}), expected NONE" in result.text
    assert advice in result.advice
    assert run("recovery_action", facts, 4).status == "PASS"


def test_recovery_action_unsupported_fails_only_where_the_profile_requires_it():
    facts = sample(H100_TEXT.name)  # driver 535: not_supported
    assert run("recovery_action", facts, 0).status == "FAIL"
    result = run("recovery_action", facts, 0, require_recovery_action=False)
    assert result.status == "SKIP"
    assert "predates the GPU recovery action" in result.text


def test_uncorrectable_ecc_fails_with_counts_and_action():
    facts = healthy_h100()
    facts["gpus"][3]["ecc"]["volatile"]["uncorrected"] = 2
    result = run("ecc_errors", facts, 3)
    assert result.status == "FAIL"
    assert "volatile uncorrected ECC errors 2 > 0" in result.text
    assert "RMA" in result.advice
    assert run("ecc_errors", facts, 3, max_ecc_uncorrected_volatile=2).status == "PASS"


def test_corrected_ecc_above_limit_fails():
    facts = healthy_h100()
    facts["gpus"][0]["ecc"]["volatile"]["corrected"] = 20000
    assert run("ecc_errors", facts, 0).status == "FAIL"


def test_ecc_off_fails_on_datacenter_profile_and_skips_on_default():
    facts = sample("telegraf_rtx4000-sff-ada_595.84_v13.xml")
    assert run("ecc_errors", facts, 0, profile="l40s").status == "FAIL"
    assert run("ecc_errors", facts, 0, profile=None).status == "SKIP"


def test_t4_retired_pages_pass_and_pending_fails():
    facts = sample("telegraf_tesla-t4_515.105.01_v11.xml")
    assert run("retired_pages", facts, 0, profile=None).status == "PASS"
    facts["gpus"][0]["retired_pages"]["pending"] = True
    result = run("retired_pages", facts, 0, profile=None)
    assert result.status == "FAIL" and "pending" in result.text


@pytest.mark.parametrize(("key", "word"), [("pending", "reset"), ("failure", "RMA")])
def test_row_remapping_pending_or_failed_fails(key, word):
    facts = healthy_h100()
    facts["gpus"][1]["remapped_rows"][key] = True
    result = run("row_remapping", facts, 1)
    assert result.status == "FAIL"
    assert word in result.advice


def test_row_remapping_not_supported_skips_with_reason():
    result = run("row_remapping", sample("gpud_titanv_560.35.03_query.txt"), 0, profile=None)
    assert result.status == "SKIP" and "not supported" in result.text


@pytest.mark.parametrize(
    ("temp", "status", "text"),
    [
        (40, "PASS", "temperature 40 C"),
        (78, "WARN", ">= warning level 75 C"),
        (91, "FAIL", ">= limit 85 C"),
    ],
)
def test_temperature_levels(temp, status, text):
    facts = healthy_h100()
    facts["gpus"][2]["temperature_c"] = temp
    result = run("temperature", facts, 2)
    assert result.status == status and text in result.text


def test_temperature_too_close_to_the_gpus_own_slowdown_point_fails():
    facts = healthy_h100()
    gpu = facts["gpus"][2]
    gpu["temperature_c"], gpu["temp_slowdown_c"] = 70, 73
    result = run("temperature", facts, 2)
    assert result.status == "FAIL" and "slowdown point 73 C" in result.text


def test_sw_power_cap_only_warns():
    facts = healthy_h100()
    facts["gpus"][0]["clock_event_reasons"]["active"] = ["sw_power_cap"]
    assert run("throttle", facts, 0).status == "WARN"


def test_power_capped_below_sku_fails_and_overdraw_fails():
    facts = healthy_h100()
    facts["gpus"][0]["power_limit_w"] = 500.0
    assert "below the SKU's 700 W" in run("power", facts, 0).text
    facts = healthy_h100()
    facts["gpus"][0]["power_draw_w"] = 760.0
    assert run("power", facts, 0).status == "FAIL"


def test_pcie_downtrained_width_fails():
    facts = healthy_h100()
    facts["gpus"][0]["pcie"]["width_current"] = 8
    result = run("pcie_link", facts, 0)
    assert result.status == "FAIL" and "x8, expected x16" in result.text


@pytest.mark.parametrize(
    ("pstate", "utilization", "idle_reason", "status", "message"),
    [
        ("P0", 0, False, "WARN", "down-trained to gen1 of gen5 while busy (P0)"),
        ("P2", 87, False, "WARN", "down-trained to gen1 of gen5 while busy (87 % utilisation)"),
        # A process holds memory (no gpu_idle reason) on an idle GPU in P8: gen1 is normal.
        ("P8", 0, False, "PASS", "PCIe gen1 (idle; gen5 capable) x16"),
        (None, None, True, "PASS", "PCIe gen1 (idle; gen5 capable) x16"),
        (None, None, False, "PASS", "the GPU's load is unknown, so the link speed is not judged"),
    ],
    ids=["p0", "busy", "p8-with-process", "idle-reason", "unknown"],
)
def test_pcie_generation_is_judged_only_under_load(
    pstate, utilization, idle_reason, status, message
):
    facts = healthy_h100()
    gpu = facts["gpus"][0]
    gpu["pcie"]["gen_current"] = 1
    gpu["performance_state"], gpu["utilization_gpu_pct"] = pstate, utilization
    gpu["clock_event_reasons"]["active"] = ["gpu_idle"] if idle_reason else []
    gpu["processes"] = [] if idle_reason else [{"pid": 7, "name": "python", "used_memory_mib": 9}]
    result = run("pcie_link", facts, 0)
    assert result.status == status and message in result.text


def test_nvlink_link_down_fails_naming_the_link():
    facts = healthy_h100()
    facts["gpus"][6]["nvlink"][11]["up"] = False
    result = run("nvlink", facts, 6)
    assert result.status == "FAIL" and "17 of 18 NVLink links up (links down: 11)" in result.text


def test_nvlink_expected_but_unsupported_fails_and_pcie_profiles_skip():
    facts = sample("telegraf_rtx3060_570.124.04_v12.xml")
    assert run("nvlink", facts, 0, profile="l4").status == "SKIP"
    facts["gpus"][0]["unavailable"]["nvlink"] = {"kind": "not_supported", "detail": "PCIe board"}
    assert run("nvlink", facts, 0, profile="h100-sxm").status == "FAIL"


def test_stray_processes_fail_with_pids():
    result = run("idle_processes", sample("telegraf_tesla-t4_515.105.01_v11.xml"), 0, profile=None)
    assert result.status == "FAIL" and "pid 5762 (python, 1005 MiB)" in result.text
    facts = sample("telegraf_tesla-t4_515.105.01_v11.xml")
    assert run("idle_processes", facts, 0, profile=None, expect_idle=False).status == "SKIP"


def test_missing_gpu_fails_every_gpu_check_of_its_index():
    facts = healthy_h100()
    del facts["gpus"][7]
    facts["gpu_count"] = 7
    assert run("gpu_count", facts).text.startswith(
        "node17: expected 8 GPUs, found 7; 8 NVIDIA GPUs on the PCI bus, the driver lists 7: "
        "00000000:DB:00.0 lost (on the bus, not listed by the driver). Action REBOOT_NODE:"
    )
    for name in registry.names("gpu"):
        result = run(name, facts, 7)
        if registry.checks()[name].level != "quick":
            continue  # a load test that was not run says so before it looks for GPUs
        assert result.status == "FAIL", (name, result.text)
        # all 8 still on the bus: the driver lost one, which a reboot brings back (not RMA)
        assert "found 7 (all 8 on the PCI bus): GPU index 7 missing on node17" in result.text
        assert "Action REBOOT_NODE" in result.text
    facts["pci"]["nvidia_gpus"] = facts["pci"]["nvidia_gpus"][:7]  # gone from the bus too
    gone = run("ecc_errors", facts, 7)
    assert "expected 8 GPUs, found 7: GPU index 7 missing on node17" in gone.text
    assert "Action RMA" in gone.text


GPU_MODULES = {
    "gpuhealth.families.gpu.checks",
    "gpuhealth.families.kernel.checks",
    "gpuhealth.families.reclaim.checks",
}


def no_gpu_machine() -> dict:
    """The healthy node's host sections, without any NVIDIA driver or GPU."""
    facts = healthy_h100()
    facts.update(source="none", gpu_count=None, gpus=[], pci={"nvidia_gpus": []})
    facts["driver"] = {"loaded": False, "version": None, "unavailable": {}}
    facts["memory_reclaim"]["gpus"] = []
    return facts


def test_no_gpu_machine_skips_unless_gpus_are_expected():
    facts = no_gpu_machine()
    for name in registry.names("node") + registry.names("gpu"):
        index = 0 if registry.checks()[name].scope == "gpu" else None
        result = run(name, facts, index, profile=None)
        assert result.status in ("PASS", "SKIP"), (name, result.text)
        if registry.checks()[name].fn.__module__ in GPU_MODULES:
            assert result.status == "SKIP" and "no NVIDIA GPU/driver on node17" in result.text
    assert run("host_resources", facts, profile=None).status == "PASS"
    assert run("gpu_count", facts, profile=None, gpu_count=8).text.startswith(
        "node17: expected 8 GPUs, found 0; 0 NVIDIA GPUs on the PCI bus. Action RMA:"
    )
    assert run("driver_version", facts, profile=None, gpu_count=8).status == "FAIL"
    assert run("temperature", facts, 3, profile=None, gpu_count=8).status == "FAIL"


def test_gpus_on_the_bus_without_driver_fail_the_driver_gate():
    facts = {
        "driver": {"loaded": False},
        "pci": {"nvidia_gpus": ["00000000:19:00.0"] * 8},
        "gpus": [],
    }
    result = run("driver_version", facts, profile=None)
    assert (
        result.status == "FAIL"
        and "8 NVIDIA GPUs on the PCI bus but no NVIDIA driver" in result.text
    )


def test_truncated_evidence_is_not_evaluated_not_passed():
    facts = sample("gpud_h100_535.183.01_query_truncated.txt", live=False)
    result = run("ecc_errors", facts, 5)
    assert result.status == "SKIP" and "not evaluated" in result.text


@pytest.mark.parametrize("kind", ["error", "timeout"])
def test_data_the_probe_failed_to_get_fails(kind):
    facts = healthy_h100()
    gpu = facts["gpus"][4]
    gpu["temperature_c"] = None
    gpu["unavailable"]["temperature_c"] = {"kind": kind, "detail": "nvmlDeviceGetTemperature hung"}
    result = run("temperature", facts, 4)
    assert result.status == "FAIL"
    assert "could not read GPU temperature: nvmlDeviceGetTemperature hung" in result.text


def test_null_without_reason_is_a_failure_not_a_pass():
    facts = healthy_h100()
    facts["gpus"][0]["recovery_action"] = None
    assert run("recovery_action", facts, 0).status == "FAIL"


def test_mixed_vbios_families_fail_uniformity():
    facts = healthy_h100()
    facts["gpus"][3]["vbios_version"] = "97.00.01.00.01"
    result = run("gpu_uniformity", facts)
    assert result.status == "FAIL" and "gpu3 97.00.01.00.01" in result.text
    assert run("gpu_uniformity", healthy_h100(), vbios_prefix="96.00.74").status == "PASS"
    assert run("gpu_uniformity", healthy_h100(), vbios_prefix="96.00.99").status == "FAIL"


def test_one_name_on_two_parts_fails_uniformity():
    """Review find: "NVIDIA B200" on two device ids gave profile default (mixed GPUs) and
    gpu_uniformity passed, comparing names only."""
    facts = healthy_h100()
    facts["gpus"][7]["pci_device_id"] = "0x233110DE"
    result = run("gpu_uniformity", facts)
    assert result.status == "FAIL" and "(PCI device ids 0x233010DE, 0x233110DE)" in result.text


def test_persistence_mode_off_fails():
    facts = healthy_h100()
    facts["gpus"][2]["persistence_mode"] = False
    assert "persistence mode off on gpu2" in run("persistence_mode", facts).text


def test_checks_do_not_modify_the_facts():
    facts = sample(H100_TEXT.name)
    before = copy.deepcopy(facts)
    for name in registry.names("node"):
        run(name, facts)
    for name in registry.names("gpu"):
        run(name, facts, 0)
    assert facts == before


def test_idle_processes_judges_what_is_left_after_the_reclaim_wait():
    facts = healthy_h100()
    job = {"pid": 4242, "name": "python", "used_memory_mib": 20480}
    facts["gpus"][6].update(processes=[job], memory_used_mib=20480)
    # The job exited during the probe's reclaim wait: nothing is left to blame.
    result = run("idle_processes", facts, 6)
    assert result.status == "PASS" and "memory: see memory_reclaim" in result.text
    facts["memory_reclaim"]["gpus"][6]["processes"] = [job]
    assert (
        "stray compute processes: pid 4242 (python, 20480 MiB)"
        in run("idle_processes", facts, 6).text
    )
    # Without a reclaim wait (a saved log), the first look is judged, memory included.
    del facts["memory_reclaim"]
    facts["gpus"][6]["processes"] = []
    result = run("idle_processes", facts, 6)
    assert result.status == "FAIL" and "20480 MiB GPU memory in use on an idle GPU" in result.text


def test_every_recovery_action_nvidia_ml_py_names_is_named_and_judged():
    """nvmlGpuRecoveryAction_t as the installed nvidia-ml-py defines it: a newer binding with a
    value gpuhealth does not name fails this test (and the value drains meanwhile)."""
    import pynvml

    from gpuhealth.families.gpu.checks import RECOVERY
    from gpuhealth.families.gpu.schema import RECOVERY_ACTIONS

    prefix = "NVML_GPU_RECOVERY_ACTION_"
    named = {v: k[len(prefix) :] for k, v in vars(pynvml).items() if k.startswith(prefix)}
    assert named == RECOVERY_ACTIONS
    assert set(RECOVERY) == set(named) - {0}


def test_a_section_the_probe_failed_to_read_fails_but_one_older_facts_lack_is_not_evaluated():
    """None: this probe tried and failed (a failure). Missing key: the facts come from a probe
    older than the family (judged offline): not evaluated, never a pass."""
    facts = healthy_h100()
    facts["storage"] = None
    failed_read = run("storage_paths", facts)
    assert failed_read.status == "FAIL"
    assert "the probe returned no storage data" in failed_read.text
    del facts["storage"]
    older = run("storage_paths", facts)
    assert older.status == "SKIP"
    assert "these facts have no storage section (collected by probe" in older.text


def _families_of(*sets: CheckSet | Family) -> tuple[Family, ...]:
    return tuple(
        s if isinstance(s, Family) else Family(s.family, s.family.title(), s) for s in sets
    )


@pytest.fixture
def fresh_registry(monkeypatch):
    """The registry's ranks and checks worked out again from families a test gives."""

    def use(*sets: CheckSet | Family) -> None:
        monkeypatch.setattr(registry, "families", lambda: _families_of(*sets))
        registry.ranks.cache_clear()
        registry.scopes.cache_clear()
        registry.checks.cache_clear()

    yield use
    registry.ranks.cache_clear()
    registry.scopes.cache_clear()
    registry.checks.cache_clear()


def _a_check(node: NodeView) -> Result:
    """A check."""
    return passed("fine")


def test_report_groups_are_ranked_by_the_families(fresh_registry):
    """A check reports in a group its own family or another ranks; a group nobody ranks (a
    typo) and a group ranked twice differently stop the registry from loading."""
    first, second = CheckSet("first", ranks={"hardware": 0}), CheckSet("second")
    second.node("borrowed", "hardware", in_use=True, section="system")(_a_check)
    fresh_registry(first, second)
    assert registry.ranks() == {"hardware": 0} and list(registry.checks()) == ["borrowed"]

    typo = CheckSet("typo", ranks={"hardware": 0})
    typo.node("misfiled", "hardwre", in_use=True, section="system")(_a_check)
    fresh_registry(typo)
    with pytest.raises(RuntimeError, match="no family ranks its group 'hardwre'"):
        registry.checks()

    fresh_registry(first, CheckSet("other", ranks={"hardware": 3}))
    with pytest.raises(RuntimeError, match="'hardware' is ranked 0 and 3"):
        registry.ranks()


def test_a_check_reads_a_named_section_and_a_named_scope_is_found(fresh_registry):
    """A check says which facts section it reads (itself, or its CheckSet for all of them);
    a per-item check registered by its scope's name gets the scope a family declares, and one
    no family declares stops the registry from loading."""
    with pytest.raises(ValueError, match="check unread: no facts section"):
        CheckSet("bare").node("unread", "hardware", in_use=True)(_a_check)
    lent = CheckSet("lent", ranks={"hardware": 0}, section="system")
    lent.per("gpu", "per_slot", "hardware", in_use=True)(_a_check)
    fresh_registry(lent)
    with pytest.raises(RuntimeError, match="no family declares scope 'gpu'"):
        registry.checks()
    declares = Family("slots", "Slots", CheckSet("slots"), scopes=(GPU,))
    fresh_registry(lent, declares)
    assert registry.check("per_slot").per is GPU
