"""GPUd: the API responses (real samples from GPUd's docs), the GPUd checks, the probe's
sub-probe against a local stand-in GPUd (HTTP and self-signed HTTPS on loopback), and triage."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.families.gpud import parse_gpud as gpud
from gpuhealth.families.gpud import probe as gpud_probe
from gpuhealth.parsing import ParseError
from selftest.facts import judge, probe
from selftest.suite import run_suite

DATA = Path(__file__).parent / "data" / "gpud"
HOST = socket.gethostname()
HEALTHY = "gpud_docs_v1_states_plugin_only_healthy.json"
XID74 = "gpud_docs_v1_states_xid74_unhealthy_element.json"
TRIGGER = "gpud_docs_trigger_check_plugin_exit1_unhealthy.json"
# /v1/events in the shape GPUd documents (api/v1 types; no real sample in the fixtures).
EVENTS = [
    {
        "component": "accelerator-nvidia-error-xid",
        "startTime": "2026-11-21T02:00:00Z",
        "endTime": "2026-11-22T02:00:00Z",
        "events": [
            {
                "component": "accelerator-nvidia-error-xid",
                "time": "2026-11-22T01:12:03Z",
                "name": "error_xid",
                "type": "Critical",
                "message": "XID 74 detected on PCI:0000:04:00",
            },
            {
                "component": "accelerator-nvidia-error-xid",
                "time": "2026-11-22T01:13:00Z",
                "name": "error_xid",
                "type": "Info",
                "message": "XID 74 acknowledged",
            },
        ],
    },
    {"component": "accelerator-nvidia-ecc", "startTime": "", "endTime": "", "events": None},
]


def text(name: str) -> str:
    return (DATA / name).read_text()


def states_response(name: str) -> str:
    """A whole /v1/states response: the one-element sample is wrapped in its list."""
    doc = json.loads(text(name))
    return json.dumps(doc if isinstance(doc, list) else [doc])


def evaluate(name: str, facts: dict[str, Any]) -> Any:
    return judge(name, facts)


def live_facts(states: list[dict[str, Any]] | None, **extra: Any) -> dict[str, Any]:
    section = {
        "address": "https://127.0.0.1:15132",
        "healthz": {"status": "ok", "version": "v1"},
        "states": states,
        "unavailable": {},
    }
    section.update(extra)
    return {"source": "nvml", "gpud": section}


# ---------------------------------------------------------------- parser


def test_xid74_element_is_one_unhealthy_state_with_reboot():
    doc = gpud.load(text(XID74), "sample")
    assert gpud.kind(doc) == "states"
    assert gpud.states(doc) == [
        {
            "component": "accelerator-nvidia-error-xid",
            "name": "error_xid",
            "health": "Unhealthy",
            "reason": "XID 74 (NVLINK Error) detected on PCI:0000:04:00",
            "error": None,
            "repair_actions": ["REBOOT_SYSTEM"],
            "description": None,
            "time": None,
        }
    ]


def test_whole_healthy_response_and_bare_trigger_check_list():
    (healthy,) = gpud.states(gpud.load(text(HEALTHY), "sample"))
    assert (healthy["component"], healthy["health"], healthy["reason"]) == (
        "echo",
        "Healthy",
        "no data yet",
    )
    (plugin,) = gpud.states(gpud.load(text(TRIGGER), "sample"))
    assert plugin["component"] == "exit-1" and plugin["error"] == "exit status 1"
    assert plugin["time"] == "..." and plugin["description"] == "reboot me"


def test_old_boolean_healthy_field_is_read():
    (state,) = gpud.states({"component": "x", "states": [{"name": "x", "healthy": False}]})
    assert state["health"] == "Unhealthy"


def test_events_are_flattened_with_their_component():
    found = gpud.events(EVENTS)
    assert [(e["type"], e.get("message")) for e in found] == [
        ("Critical", "XID 74 detected on PCI:0000:04:00"),
        ("Info", "XID 74 acknowledged"),
        (None, None),  # events null: none, or GPUd could not read them
    ]
    assert found[2] == {"component": "accelerator-nvidia-ecc", "type": None, "unknown": True}
    assert gpud.kind(EVENTS[0]) == "events"


def test_bad_documents_are_errors():
    with pytest.raises(ParseError, match="not valid JSON: line 1"):
        gpud.load("<html>502 Bad Gateway</html>", "GPUd /v1/states")
    with pytest.raises(ParseError, match="not a GPUd /v1/states response"):
        gpud.states({"status": "ok"})
    with pytest.raises(ParseError, match="has no 'health'"):
        gpud.states([{"component": "x", "states": [{"name": "x"}]}])


# ---------------------------------------------------------------- checks


def test_xid74_unhealthy_fails_with_reason_and_reboot():
    result = evaluate("gpud_health", live_facts(gpud.states(gpud.load(text(XID74), "s"))))
    assert result.status == "FAIL"
    assert "accelerator-nvidia-error-xid/error_xid Unhealthy: XID 74 (NVLINK Error)" in (
        result.text
    )
    assert "GPUd suggests REBOOT_SYSTEM" in result.text
    assert result.advice == "drain and reboot the node (GPUd: REBOOT_SYSTEM)"


def test_healthy_states_pass():
    result = evaluate("gpud_health", live_facts(gpud.states(gpud.load(text(HEALTHY), "s"))))
    assert result.status == "PASS" and "1 states of 1 components Healthy" in result.text


def test_degraded_warns():
    states = gpud.states(gpud.load(text(HEALTHY), "s"))
    states[0]["health"] = "Degraded"
    result = evaluate("gpud_health", live_facts(states))
    assert result.status == "WARN" and "echo/check Degraded" in result.text


def test_gpud_not_answering_fails_and_not_installed_skips():
    down = live_facts(None, healthz=None)
    down["gpud"]["unavailable"] = {
        "healthz": {"kind": "error", "detail": "[Errno 111] Connection refused"}
    }
    result = evaluate("gpud_health", down)
    assert result.status == "FAIL" and "Connection refused" in result.text
    assert "systemctl status gpud" in result.advice
    off = {"skipped": "GPUd not expected on this host (gpud_installed: false)"}
    skipped = evaluate("gpud_health", {"source": "nvml", "gpud": off})
    assert skipped.status == "SKIP" and "gpud_installed: false" in skipped.text


def test_critical_events_fail():
    section = {"since": "2026-11-21T02:00:00Z", "events": gpud.events(EVENTS)}
    result = evaluate("gpud_events", {"source": "nvml", "gpud_events": section})
    assert result.status == "FAIL" and result.action.value == "INSPECT"
    assert "1 Critical/Fatal GPUd events since 2026-11-21T02:00:00Z" in result.text
    section["events"] = [e for e in section["events"][1:] if not e.get("unknown")]
    assert evaluate("gpud_events", {"source": "nvml", "gpud_events": section}).status == "PASS"


def test_null_event_lists_are_not_evaluated_never_passed():
    """GPUd answers `events: null` both for none and when it could not read them."""
    section = {"since": None, "events": gpud.events([{"component": "ecc", "events": None}])}
    result = evaluate("gpud_events", {"source": "nvml", "gpud_events": section})
    assert result.status == "SKIP" and "not evaluated for 1 components (ecc)" in result.text


def test_no_component_states_fail_and_null_states_are_unknown():
    empty = evaluate("gpud_health", live_facts([]))
    assert empty.status == "FAIL" and "no component states" in empty.text
    unknown = gpud.states([{"component": "ecc", "states": None}])
    result = evaluate("gpud_health", live_facts(unknown))
    assert result.status == "WARN" and "ecc state unknown: GPUd gave no state" in result.text


# ---------------------------------------------------------------- the probe's sub-probe


class _Handler(BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, str]] = {}
    delay_s = 0.0

    def do_GET(self) -> None:
        time.sleep(self.delay_s)
        status, body = self.routes.get(self.path.split("?")[0], (404, '{"message":"nope"}'))
        self.server.seen.append(self.path)  # type: ignore[attr-defined]
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def stand_in_gpud(
    states: str, context: ssl.SSLContext | None = None, delay_s: float = 0.0
) -> Iterator[tuple[str, list[str]]]:
    """A local GPUd answering /healthz, /v1/states and /v1/events; yields (host:port, paths)."""
    handler = type(
        "Handler",
        (_Handler,),
        {
            "routes": {
                "/healthz": (200, '{"status":"ok","version":"v1"}'),
                "/v1/states": (200, states),
                "/v1/events": (200, json.dumps(EVENTS)),
            },
            "delay_s": delay_s,
        },
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.block_on_close = False  # do not wait for a handler still sleeping (hung GPUd)
    server.seen = []  # type: ignore[attr-defined]
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", server.seen  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


def collect(address: str, installed: bool = True, **expect: Any) -> tuple[dict, dict, list]:
    """The probe's gpud and gpud_events sections for GPUd at `address`, and its errors."""
    sections, errors = probe("gpud", gpud_installed=installed, gpud_address=address, **expect)
    return sections["gpud"], sections["gpud_events"], errors


def test_probe_reads_states_and_events_over_http(monkeypatch):
    # A node's proxy settings must not divert the loopback API (port 9 refuses connections).
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    with stand_in_gpud(states_response(XID74)) as (address, seen):
        states, events, errors = collect(f"http://{address}")
    assert errors == []
    assert states["healthz"] == {"status": "ok", "version": "v1"}
    assert states["states"][0]["health"] == "Unhealthy"
    assert [e["type"] for e in events["events"]] == ["Critical", "Info", None]
    since = int(seen[-1].split("startTime=")[1])
    assert abs(time.time() - 24 * 3600 - since) < 60  # gpud_events_window_h


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> ssl.SSLContext:
    """A server context with a fresh self-signed certificate, like GPUd's default one."""
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=gpud",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def test_probe_accepts_gpud_self_signed_https_on_loopback(self_signed):
    with stand_in_gpud(states_response(HEALTHY), self_signed) as (address, _):
        section, _, errors = collect(address)
    assert errors == [] and section["address"] == f"https://{address}"
    assert section["states"][0]["health"] == "Healthy"


def test_self_signed_certificates_are_accepted_for_loopback_only():
    for url in ("https://127.0.0.1:15132", "https://localhost:15132", "https://[::1]:15132"):
        assert gpud_probe._context(url).verify_mode == ssl.CERT_NONE, url
    remote = gpud_probe._context("https://10.1.2.3:15132")
    assert remote.verify_mode == ssl.CERT_REQUIRED and remote.check_hostname
    assert gpud_probe._context("http://127.0.0.1:15132") is None


def test_probe_records_a_gpud_that_does_not_answer(monkeypatch):
    with stand_in_gpud(states_response(HEALTHY)) as (address, _):
        pass  # the server is gone: its port now refuses connections
    section, _, errors = collect(f"http://{address}")
    assert section["healthz"] is None and section["states"] is None
    assert section["unavailable"]["healthz"]["kind"] == "error"
    assert errors[0]["probe"] == "gpud" and "refused" in errors[0]["error"]
    result = evaluate("gpud_health", {"source": "nvml", "gpud": section})
    assert result.status == "FAIL" and "did not give its /healthz answer" in result.text


def test_probe_times_out_on_a_hung_gpud():
    with stand_in_gpud(states_response(HEALTHY), delay_s=2) as (address, _):
        started = time.monotonic()
        section, _, _ = collect(f"http://{address}", gpud_timeout_s=0.3)
        assert time.monotonic() - started < 1.5
    assert section["unavailable"]["healthz"]["kind"] == "timeout"


def test_probe_records_garbage_from_gpud():
    with stand_in_gpud("<html>oops</html>") as (address, _):
        section, _, _ = collect(f"http://{address}")
    assert section["states"] is None
    assert "not valid JSON" in section["unavailable"]["states"]["detail"]


def test_probe_does_not_ask_where_gpud_is_not_installed():
    states, events, errors = collect("127.0.0.1:1", installed=False)
    skipped = {"skipped": "GPUd not expected on this host (gpud_installed: false)"}
    assert (states, events, errors) == (skipped, skipped, [])


class _Redirect(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(302)
        self.send_header("Location", "https://10.255.255.1:15132/v1/states")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_redirect_is_refused_not_followed():
    """Certificate checks are off for loopback only: a redirect off it must not be taken."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/states"
        started = time.monotonic()
        body, why = gpud_probe.fetch(url, 5)
    finally:
        server.shutdown()
        server.server_close()
    assert body is None and why is not None
    assert why["kind"] == "error" and "HTTP 302" in why["detail"]
    assert time.monotonic() - started < 2  # answered at once, no attempt at 10.255.255.1


# ---------------------------------------------------------------- triage


def triage(*paths: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuhealth.cli", "triage", "--json", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    doc = json.loads(proc.stdout)
    doc["rc"] = proc.returncode
    return doc


def by_check(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["check"]: f for f in doc["findings"] if f["check"].startswith("gpud")}


def test_triage_of_states_samples():
    bad = triage(DATA / XID74)
    assert bad["rc"] == 1 and by_check(bad)["gpud_health"]["status"] == "FAIL"
    assert "REBOOT_SYSTEM" in by_check(bad)["gpud_health"]["message"]
    good = triage(DATA / HEALTHY)
    assert good["rc"] == 0 and by_check(good)["gpud_health"]["status"] == "PASS"
    plugin = triage(DATA / TRIGGER)
    assert by_check(plugin)["gpud_health"]["status"] == "FAIL"


def test_triage_of_an_events_response(tmp_path):
    path = tmp_path / "events.json"
    path.write_text(json.dumps(EVENTS))
    doc = triage(path)
    assert by_check(doc)["gpud_events"]["status"] == "FAIL"
    assert by_check(doc)["gpud_health"]["status"] == "SKIP"


@pytest.mark.suite
def test_suite_fails_the_node_gpud_calls_unhealthy(tmp_path):
    """The real suite and probe (shipped over testinfra's local backend) ask the stand-in."""
    with stand_in_gpud(states_response(XID74)) as (address, seen):
        inventory = tmp_path / "hosts.yml"
        inventory.write_text(
            f"all:\n  hosts:\n    {HOST}:\n      gpud_installed: true\n"
            f"      gpud_address: http://{address}\n"
        )
        run = run_suite(tmp_path / "r", "--inventory", str(inventory), "-m", "gpud")
    assert run.outcomes() == {
        f"test_gpud_health[{HOST}]": "failed",
        f"test_gpud_events[{HOST}]": "failed",
    }, run.output[-3000:]
    assert "/healthz" in seen and "/v1/states" in seen
    verdict = run.verdicts["nodes"][HOST]
    assert verdict["verdict"] == "FAIL"
    assert "XID 74 (NVLINK Error) detected on PCI:0000:04:00" in verdict["reasons"][0]
    assert verdict["actions"] == ["REBOOT_NODE", "INSPECT"]
    assert verdict["advice"][0] == "drain and reboot the node (GPUd: REBOOT_SYSTEM)"
    facts = json.loads((tmp_path / "r" / "facts" / f"{HOST}.json").read_text())
    assert facts["gpud_events"]["events"][0]["type"] == "Critical"


@pytest.mark.parametrize(
    ("pasted", "form"),
    [
        ("{doc},\n", "one element cut out of the list, its comma kept"),
        ("[{doc},\n]\n", "a list whose last element keeps its comma"),
        ("  {doc}\n", "one component's element alone"),
    ],
)
def test_a_state_element_pasted_as_people_paste_it_is_read(tmp_path, pasted, form):
    element = text("gpud_docs_v1_states_xid74_unhealthy_element.json").strip()
    path = tmp_path / "states.json"
    path.write_text(pasted.replace("{doc}", element))
    found = by_check(triage(path))
    assert found["gpud_health"]["status"] == "FAIL", form
    assert "XID 74" in found["gpud_health"]["message"], form


def test_trailing_commas_are_dropped_outside_strings_only():
    doc = gpud.load('{"reason": "a,]", "actions": ["X",], "q": "\\",}",}', "GPUd /v1/states")
    assert doc == {"reason": "a,]", "actions": ["X"], "q": '",}'}
    with pytest.raises(ParseError, match="not valid JSON"):
        gpud.load('{"a": 1,, }', "GPUd /v1/states")
