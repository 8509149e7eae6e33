"""The `imex` section: the nvidia-imex service and its domain as `nvidia-imex-ctl -N` shows it.

Read only where the node's limits say it is in a multi-node NVLink domain (`imex_required`):
elsewhere IMEX is neither installed nor expected. The service state comes from systemctl, as
the system family asks it; the domain from the IMEX daemon's command service, which answers
for every node of the domain, so one node's probe sees a peer that is down too.
Node side: Python 3.6 and the standard library.
"""

import shutil
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from gpuhealth.facts import Unavailable, skipped, why
from gpuhealth.families.imex import parse_addresses, parse_imex_ctl, schema
from gpuhealth.families.system import probe as system_probe
from gpuhealth.parsing import ParseError
from gpuhealth.probe import command, node
from gpuhealth.schema import written

if TYPE_CHECKING:
    from gpuhealth.probe.main import Context

SECTIONS = written(schema.SECTIONS)
SERVICE = "nvidia-imex"
CTL = ["nvidia-imex-ctl", "-N"]


def read_domain(timeout_s: float) -> Tuple[Optional[Dict[str, Any]], Optional[Unavailable]]:
    """`nvidia-imex-ctl -N`, parsed, or None and why: `not_supported` when the tool is not
    installed, `timeout` when it hangs, `error` for a non-zero exit or unreadable output."""
    if shutil.which(CTL[0]) is None:
        return None, why("not_supported", f"{CTL[0]} not found on PATH (package nvidia-imex)")
    result = command.run(CTL, timeout_s)
    if result.timed_out:
        return None, why("timeout", result.error or "nvidia-imex-ctl -N timed out")
    failure = result.failure()
    if failure:
        return None, why("error", f"nvidia-imex-ctl -N: {failure}")
    try:
        return parse_imex_ctl.parse(result.stdout), None
    except ParseError as exc:
        return None, why("error", f"nvidia-imex-ctl -N: unreadable output: {exc}")


def collect(ctx: "Context") -> Dict[str, Any]:
    """The `imex` section, where the node's limits expect IMEX or nvidia-imex-ctl is installed:
    a host the inventory names no profile for is probed with the default limits before its
    GPUs are known, and judged as the GB200 tray it turns out to be."""
    if not ctx.setting("imex_required") and shutil.which(CTL[0]) is None:
        return {
            "imex": skipped(
                "IMEX not expected on this host (imex_required: false) and nvidia-imex-ctl "
                "not installed"
            )
        }
    section: Dict[str, Any] = {"service": None, "domain": None, "unavailable": {}}
    # Which row of the domain is this node: its own addresses (IMEX lists nodes by address).
    section["addresses"] = parse_addresses.local_addresses(
        node.read_text(ctx.root, "/proc/net/fib_trie"),
        node.read_text(ctx.root, "/proc/net/if_inet6"),
    )
    states, reason = system_probe.service_states(
        (SERVICE,), float(ctx.setting("system_command_timeout_s"))
    )
    if reason is None:
        section["service"] = states[SERVICE]
    else:
        section["unavailable"]["service"] = reason
        if reason["kind"] != "not_supported":  # no systemd (a container): nothing broken
            ctx.error("imex", reason["detail"], "systemctl is-active " + SERVICE)
    section["domain"], reason = read_domain(float(ctx.setting("imex_ctl_timeout_s")))
    if reason is not None:
        section["unavailable"]["domain"] = reason
        if reason["kind"] != "not_supported":
            ctx.error("imex", reason["detail"], " ".join(CTL))
    return {"imex": section}
