"""The `gpud` and `gpud_events` sections: GPUd's own verdict on the node, from its local API.

GPUd watches the node continuously (XIDs, NVLink, ECC, fabric manager...), so asking it is
cheap and sees what a one-shot probe cannot. It is asked from the node itself, over loopback,
and only where the inventory says it is installed (`gpud_installed`). GPUd serves HTTPS with a
self-signed certificate by default: the certificate is accepted unverified for a loopback
address only; `gpud_address: http://127.0.0.1:15132` selects plain HTTP.
"""

import ipaddress
import socket
import ssl
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple
from urllib.parse import urlsplit

from gpuhealth.facts import Unavailable, skipped, why
from gpuhealth.families.gpud import parse_gpud, schema
from gpuhealth.parsing import ParseError
from gpuhealth.schema import written

if TYPE_CHECKING:
    from gpuhealth.probe.main import Context

SECTIONS = written(schema.SECTIONS)
# More than any GPUd answer: a day of events of a busy node is a few hundred KB.
MAX_BODY_BYTES = 16 * 1024 * 1024
# socket.timeout became an alias of TimeoutError only in Python 3.10.
_TIMEOUTS = (TimeoutError, socket.timeout)


def base_url(address: str) -> str:
    """`host:port` means HTTPS (GPUd's default); an explicit `http://` or `https://` is kept."""
    address = address.strip().rstrip("/")
    return address if "://" in address else "https://" + address


def is_loopback(url: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _context(url: str) -> Optional[ssl.SSLContext]:
    if not url.startswith("https://"):
        return None
    context = ssl.create_default_context()
    if is_loopback(url):
        # GPUd's certificate is self-signed; on loopback nobody can sit in the middle.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """GPUd never redirects: a redirect (perhaps off loopback, where the certificate check is
    off) is answered as the error it is, never followed."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def fetch(url: str, timeout_s: float) -> Tuple[Optional[str], Optional[Unavailable]]:
    """(body, None), or (None, why) with an `unavailable` kind: timeout or error.

    Never through a proxy: nodes often export https_proxy without a no_proxy for loopback.
    """
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}),
        urllib.request.HTTPSHandler(context=_context(url)),
        _NoRedirect(),
    )
    try:
        with opener.open(request, timeout=timeout_s) as resp:
            body = resp.read(MAX_BODY_BYTES + 1)
    except _TIMEOUTS:
        return None, why("timeout", f"{url}: no answer within {timeout_s:g} s")
    except urllib.error.HTTPError as exc:
        return None, why("error", f"{url}: HTTP {exc.code} {exc.reason}")
    except urllib.error.URLError as exc:
        kind = "timeout" if isinstance(exc.reason, _TIMEOUTS) else "error"
        return None, why(kind, f"{url}: {exc.reason}")
    except (OSError, ValueError) as exc:
        return None, why("error", f"{url}: {exc}")
    if len(body) > MAX_BODY_BYTES:
        return None, why("error", f"{url}: answer larger than {MAX_BODY_BYTES} bytes")
    return body.decode("utf-8", errors="replace"), None


def _note(ctx: Any, reason: Unavailable) -> None:
    ctx.error("gpud", reason["detail"])


def _states(ctx: Any, url: str, timeout_s: float) -> Dict[str, Any]:
    """`/healthz` and every component's health from `/v1/states`."""
    section: Dict[str, Any] = {
        "address": url,
        "healthz": None,
        "states": None,
        "unavailable": {},
    }
    body, reason = fetch(url + "/healthz", timeout_s)
    if body is not None:
        try:
            section["healthz"] = parse_gpud.load(body, "GPUd /healthz")
        except ParseError as exc:
            reason = why("error", str(exc))
    if reason:
        section["unavailable"]["healthz"] = reason
        _note(ctx, reason)
        # A GPUd that does not answer /healthz will not answer /v1/states either.
        section["unavailable"]["states"] = why(reason["kind"], "GPUd not answering")
        return section
    _fetch_into(ctx, section, "states", url + "/v1/states", parse_gpud.states, timeout_s)
    return section


def _events(ctx: Any, url: str, timeout_s: float, window_h: float) -> Dict[str, Any]:
    """The window's `/v1/events`, every type (the checks pick the critical ones)."""
    since = int(time.time() - window_h * 3600)
    section: Dict[str, Any] = {
        "address": url,
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since)),
        "events": None,
        "unavailable": {},
    }
    endpoint = f"{url}/v1/events?startTime={since}"
    _fetch_into(ctx, section, "events", endpoint, parse_gpud.events, timeout_s)
    return section


def _fetch_into(
    ctx: Any,
    section: Dict[str, Any],
    key: str,
    url: str,
    convert: Callable[[Any], Any],
    timeout_s: float,
) -> None:
    """section[key] from a GPUd endpoint, or why not in section["unavailable"][key]."""
    body, reason = fetch(url, timeout_s)
    if body is not None:
        what = "GPUd /" + url.split("/", 3)[-1].split("?")[0]
        try:
            section[key] = convert(parse_gpud.load(body, what))
        except ParseError as exc:
            reason = why("error", str(exc))
    if reason:
        section["unavailable"][key] = reason
        _note(ctx, reason)


def collect(ctx: "Context") -> Dict[str, Any]:
    """The `gpud` and `gpud_events` sections, where the inventory says GPUd is installed."""
    if not ctx.setting("gpud_installed"):
        text = "GPUd not expected on this host (gpud_installed: false)"
        return {"gpud": skipped(text), "gpud_events": skipped(text)}
    url = base_url(ctx.setting("gpud_address"))
    timeout_s = float(ctx.setting("gpud_timeout_s"))
    window_h = float(ctx.setting("gpud_events_window_h"))
    return {
        "gpud": _states(ctx, url, timeout_s),
        "gpud_events": _events(ctx, url, timeout_s, window_h),
    }
