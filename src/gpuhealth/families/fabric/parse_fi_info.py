"""`fi_info` (libfabric) short output: one block per provider/domain/endpoint type.

    provider: efa
        fabric: efa
        domain: rdmap16s27-rdm
        version: 119.0
        type: FI_EP_RDM
        protocol: FI_PROTO_EFA

With no matching device `fi_info` prints only `fi_getinfo: -61` (newer releases add
`(No data available)`) on stderr: -61 is -FI_ENODATA, "no provider/device fits the hints".
Text before the first block is skipped, so a pasted log may start with its shell prompt.
"""

import re
from typing import Any, Dict, List, Optional

from gpuhealth.parsing import ParseError

# -FI_ENODATA: fi_getinfo found nothing matching the hints (no device, provider not loaded).
NO_DATA = -61
_GETINFO = re.compile(r"^fi_getinfo: (-?\d{1,18})(?!\d)")
# The value is stripped after the match: a lazy `(.*?)\s*$` is quadratic in runs of spaces.
_FIELD = re.compile(r"^\s+([a-z_]+):(.*)$")
_REQUIRED = ("fabric", "domain", "version", "type")


def parse(text: str) -> Dict[str, Any]:
    """Provider blocks (`entries`, each a dict of the block's fields) and the fi_getinfo error.

    Raises ParseError (naming the line) on a line inside the blocks that is not `key: value`,
    on a block without the fields every fi_info release prints, or when the text holds
    neither a block nor a fi_getinfo error.
    """
    entries: List[Dict[str, str]] = []
    starts: List[int] = []
    getinfo_error = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = _GETINFO.match(line)
        if match:
            getinfo_error = int(match.group(1))
            continue
        if line.startswith("provider:"):
            entries.append({"provider": line.partition(":")[2].strip()})
            starts.append(number)
            continue
        if not entries:
            continue
        field = _FIELD.match(line)
        if field is None:
            raise ParseError(f"line {number}: not a fi_info field: {line.strip()[:80]!r}")
        entries[-1][field.group(1)] = field.group(2).strip()
    for entry, number in zip(entries, starts):
        missing = [key for key in _REQUIRED if key not in entry]
        if missing:
            raise ParseError(
                f"line {number}: provider {entry['provider']!r} block lacks {', '.join(missing)}"
            )
    if not entries and getinfo_error is None:
        raise ParseError("line 1: no fi_info provider block and no fi_getinfo error")
    return {"entries": entries, "getinfo_error": getinfo_error}


def libfabric_version(provider_version: Optional[str]) -> Optional[str]:
    """The libfabric release behind an in-tree provider's version, e.g. 119.0 -> 1.19.0.

    libfabric versions its in-tree providers as FI_VERSION(major * 100 + minor, revision * 10)
    (OFI_VERSION_DEF_PROV); anything else (an out-of-tree provider) gives None.
    """
    match = re.fullmatch(r"(\d{1,18})\.(\d{1,18})", provider_version or "")
    if not match or int(match.group(1)) < 100:
        return None
    major, minor = int(match.group(1)), int(match.group(2))
    return f"{major // 100}.{major % 100}.{minor // 10}"


def summary(parsed: Dict[str, Any], provider: str = "efa") -> Dict[str, Any]:
    """What the checks judge: the provider's RDM domains (one per device), its version, and the
    outcome.

    `status` is `ok` (blocks listed), `no_devices` (fi_getinfo -61) or `error` (another
    fi_getinfo error), with `error` saying which.
    """
    mine = [e for e in parsed["entries"] if e["provider"] == provider]
    version = mine[0]["version"] if mine else None
    error = parsed["getinfo_error"]
    if parsed["entries"]:
        status, message = "ok", None
    elif error == NO_DATA:
        status, message = "no_devices", f"fi_getinfo: {error} (no device fits the hints)"
    else:
        status, message = "error", f"fi_getinfo: {error}"
    return {
        "status": status,
        "error": message,
        "getinfo_error": error,
        # libfabric 2.x lists each device's RDM domain under two fabrics (efa, efa-direct):
        # a device counts once.
        "domains": list(dict.fromkeys(e["domain"] for e in mine if e["type"] == "FI_EP_RDM")),
        "provider_version": version,
        "libfabric_version": libfabric_version(version),
        "entries": parsed["entries"],
    }
