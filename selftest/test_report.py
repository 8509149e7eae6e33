"""Per-node verdicts: one reason per distinct problem, actions most urgent first, and never a
PASS for a host nothing vouched for."""

from __future__ import annotations

from gpuhealth.report import Outcome, VerdictBook, gpu_ranges, overall


def outcome(check: str, status: str, gpu: int | None, message: str, action: str) -> Outcome:
    label = "n1" if gpu is None else f"n1 gpu{gpu}"
    return Outcome(check, status, "n1", gpu, message, label, action, f"do {action}")


def test_one_reason_per_problem_across_gpus_and_actions_by_urgency():
    book = VerdictBook()
    for gpu in (0, 1, 2, 3, 5):
        book.add(outcome("recovery_action", "FAIL", gpu, "recovery action not supported", "RERUN"))
    book.add(outcome("ecc_errors", "FAIL", 4, "volatile uncorrected ECC errors 2 > 0", "RESET_GPU"))
    book.add(outcome("temperature", "WARN", 6, "78 C > 75 C", "INSPECT"))
    (node,) = book.finish()
    assert node.verdict == "FAIL"
    assert node.reasons == [
        "n1 gpu0-3, gpu5: recovery action not supported [recovery_action]",
        "n1 gpu4: volatile uncorrected ECC errors 2 > 0 [ecc_errors]",
    ]
    assert node.actions == ["RESET_GPU", "RERUN"]
    assert node.advice == ["do RERUN", "do RESET_GPU"]
    assert len(node.warnings) == 1 and node.counts["FAIL"] == 6


def test_a_host_no_check_judged_is_not_checked_never_pass():
    book = VerdictBook()
    book.node("n1")
    for name in ("a", "b"):
        book.add(outcome(name, "SKIP", None, "does not apply", "NONE"))
    book.node("n2")
    book.add(Outcome("x", "PASS", "n3", None, "fine", "n3"))
    verdicts = {v.host: v for v in book.finish()}
    assert verdicts["n1"].verdict == "NOT_CHECKED"
    assert verdicts["n1"].reasons == ["no check passed or failed on n1 (2 skipped)"]
    assert verdicts["n2"].reasons == ["no check passed or failed on n2 (none was run)"]
    assert verdicts["n1"].actions == ["RERUN"]
    assert verdicts["n3"].verdict == "PASS"
    assert overall(list(verdicts.values())) == "NOT_CHECKED"
    assert overall([]) == "NOT_CHECKED"


def test_gpu_ranges():
    assert gpu_ranges([5, 0, 1, 2, 3, 3]) == "gpu0-3, gpu5"
    assert gpu_ranges([7]) == "gpu7"


def test_the_driver_gate_comes_before_what_it_explains():
    book = VerdictBook()
    book.add(outcome("recovery_action", "FAIL", 0, "recovery action not supported", "FIX_CONFIG"))
    book.add(outcome("efa_device_count", "FAIL", None, "no EFA device", "INSPECT"))
    book.add(outcome("driver_version", "FAIL", None, "driver 560 < 570", "FIX_CONFIG"))
    (node,) = book.finish()
    assert [r.split(": ", 1)[1] for r in node.reasons] == [
        "driver 560 < 570 [driver_version]",
        "recovery action not supported [recovery_action]",
        "no EFA device [efa_device_count]",
    ]
