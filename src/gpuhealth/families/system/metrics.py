"""What the system family gives history: the machine's identities (`system.machine`), which
the run store follows a node's history by, whatever its host name (store.resolve_machine).

Strongest first: the system serial (the vendor's service tag, which a board repair carries
over), the SMBIOS system UUID, the board serial (changes with the board), then the OS's
machine id (re-imaging changes it). Firmware placeholders are no identity.
"""

from __future__ import annotations

import re
from typing import Any

from gpuhealth.metrics import Measures

# The probe's MACHINE_IDS and the store's ID_KINDS, in this order (judging imports neither:
# test_history_identity keeps the three the same).
NODE_ID_KINDS = ("product_serial", "product_uuid", "board_serial", "machine_id")
# What firmware writes where it has no identity to give (compared in lower case).
PLACEHOLDERS = frozenset(
    {
        "0123456789",
        "123456789",
        "1234567890",
        "base board serial number",
        "chassis serial number",
        "default string",
        "empty",
        "invalid",
        "n/a",
        "na",
        "none",
        "not applicable",
        "not available",
        "not specified",
        "o.e.m.",
        "oem",
        "serial",
        "system serial number",
        "to be filled by o.e.m.",
        "to be filled by oem",
        "uninitialized",
        "unknown",
        "03000200-0400-0500-0006-000700080009",  # a BIOS vendor's stock system UUID
    }
)


def real_id(kind: str, value: Any) -> str | None:
    """An identity as read, or None where it is a placeholder (one repeated character, a
    stock text), not printable (as the probe refuses it; saved facts may still carry one, and
    PostgreSQL stores no NUL) or, for the machine id, not the 32 hex digits systemd writes.
    UUIDs and machine ids in lower case (tools print them either way)."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    bare = re.sub(r"[\s:-]", "", text).lower()
    if len(set(bare)) <= 1 or text.lower() in PLACEHOLDERS or not text.isprintable():
        return None
    if kind in ("product_uuid", "machine_id"):
        text = text.lower()
    if kind == "machine_id" and not re.fullmatch(r"[0-9a-f]{32}", text):
        return None
    return text


def node_ids(facts: dict[str, Any]) -> dict[str, str]:
    """The machine's usable identities, strongest first: empty in facts from before they
    were collected, or where none could be read (history then follows the host name)."""
    system = facts.get("system")
    machine = system.get("machine") if isinstance(system, dict) else None
    if not isinstance(machine, dict):
        return {}
    found = {kind: real_id(kind, machine.get(kind)) for kind in NODE_ID_KINDS}
    return {kind: value for kind, value in found.items() if value is not None}


def identity(facts: dict[str, Any]) -> dict[str, Any]:
    """The node's machine identities (`ids`)."""
    return {"ids": node_ids(facts)}


MEASURES = Measures(identity=identity)
