"""The `gpud` and `gpud_events` sections: GPUd's own verdict on the node, from its local API.

GPUd watches the node continuously (XIDs, NVLink, ECC, fabric manager...), so asking it is
cheap and sees what a one-shot probe cannot. It is asked from the node itself, over loopback,
and only where the inventory says it is installed (`gpud_installed`). GPUd serves HTTPS with a
self-signed certificate by default: the certificate is accepted unverified for a loopback
address only; `gpud_address: http://127.0.0.1:15132` selects plain HTTP.
"""

from __future__ import annotations

import ipaddress
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from gpuhealth.parsers import ParseError, gpud

DEFAULT_ADDRESS = "127.0.0.1:15132"
TIMEOUT_S = 5.0
# How far back /v1/events is asked: a day of history covers the last nightly run.
EVENTS_WINDOW_S = 24 * 3600


def base_url(address: str) -> str:
    """`host:port` means HTTPS (GPUd's default); an explicit `http://` or `https://` is kept."""
    address = address.strip().rstrip("/")
    return address if "://" in address else f"https://{address}"


def is_loopback(url: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _context(url: str) -> ssl.SSLContext | None:
    if not url.startswith("https://"):
        return None
    context = ssl.create_default_context()
    if is_loopback(url):
        # GPUd's certificate is self-signed; on loopback nobody can sit in the middle.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def fetch(url: str, timeout_s: float) -> tuple[str | None, dict[str, str] | None]:
    """(body, None), or (None, why) with an `unavailable` kind: timeout or error.

    Never through a proxy: nodes often export https_proxy without a no_proxy for loopback.
    """
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=_context(url))
    )
    try:
        with opener.open(request, timeout=timeout_s) as resp:
            return resp.read().decode("utf-8", errors="replace"), None
    except TimeoutError:
        return None, {"kind": "timeout", "detail": f"{url}: no answer within {timeout_s:g} s"}
    except urllib.error.HTTPError as exc:
        return None, {"kind": "error", "detail": f"{url}: HTTP {exc.code} {exc.reason}"}
    except urllib.error.URLError as exc:
        reason = exc.reason
        kind = "timeout" if isinstance(reason, TimeoutError) else "error"
        return None, {"kind": kind, "detail": f"{url}: {reason}"}
    except (OSError, ValueError) as exc:
        return None, {"kind": "error", "detail": f"{url}: {exc}"}


def _settings(config: dict[str, Any]) -> tuple[bool, str]:
    expect = config.get("expect") or {}
    return bool(expect.get("gpud_installed")), base_url(
        expect.get("gpud_address") or DEFAULT_ADDRESS
    )


def _note(errors: list[dict[str, Any]], why: dict[str, str]) -> None:
    errors.append({"probe": "gpud", "error": why["detail"]})


def collect_states(config: dict[str, Any], errors: list[dict[str, Any]]) -> dict[str, Any]:
    """`/healthz` and every component's health from `/v1/states`."""
    expected, url = _settings(config)
    if not expected:
        return {"expected": False}
    section: dict[str, Any] = {
        "expected": True,
        "address": url,
        "healthz": None,
        "states": None,
        "unavailable": {},
    }
    body, why = fetch(f"{url}/healthz", TIMEOUT_S)
    if body is not None:
        try:
            section["healthz"] = gpud.load(body, "GPUd /healthz")
        except ParseError as exc:
            why = {"kind": "error", "detail": str(exc)}
    if why:
        section["unavailable"]["healthz"] = why
        _note(errors, why)
        # A GPUd that does not answer /healthz will not answer /v1/states either.
        section["unavailable"]["states"] = {"kind": why["kind"], "detail": "GPUd not answering"}
        return section
    _fetch_into(section, "states", f"{url}/v1/states", gpud.states, errors)
    return section


def collect_events(config: dict[str, Any], errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The last day of `/v1/events`, every type (the checks pick the critical ones)."""
    expected, url = _settings(config)
    if not expected:
        return {"expected": False}
    since = int(time.time()) - EVENTS_WINDOW_S
    section: dict[str, Any] = {
        "expected": True,
        "address": url,
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since)),
        "events": None,
        "unavailable": {},
    }
    _fetch_into(section, "events", f"{url}/v1/events?startTime={since}", gpud.events, errors)
    return section


def _fetch_into(
    section: dict[str, Any],
    key: str,
    url: str,
    convert: Callable[[Any], Any],
    errors: list[dict[str, Any]],
) -> None:
    """section[key] from a GPUd endpoint, or why not in section["unavailable"][key]."""
    body, why = fetch(url, TIMEOUT_S)
    if body is not None:
        try:
            section[key] = convert(gpud.load(body, f"GPUd /{url.split('/', 3)[-1].split('?')[0]}"))
        except ParseError as exc:
            why = {"kind": "error", "detail": str(exc)}
    if why:
        section["unavailable"][key] = why
        _note(errors, why)
