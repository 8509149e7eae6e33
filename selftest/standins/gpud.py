"""Stand-in GPUd (leptonai/gpud): its local API, answering from the node's scenario.

Shipped by the test bed as `gpud`, a zipapp holding this file as __main__.py and the real GPUd
responses of selftest/data/gpud under data/gpud/, inside a tarball laid out like GPUd's
releases (gpud_<version>_linux_<arch>/gpud; standins.py builds it). It serves on
127.0.0.1:15132 (`--listen-address`), over HTTPS with a self-signed certificate made with the
openssl CLI at the first start, as GPUd does by default:

- GET /healthz: {"status": "ok", "version": "v1"}, GPUd's answer;
- GET /v1/states: the response the scenario key `gpud.states` names (default: the healthy
  "plugin only" one; a single element, such as the XID 74 one, is served inside the array
  GPUd answers with);
- GET /v1/events: [] (no event recorded: there is no real sample of events to replay).

The scenario is the fake NVML's key=value file ($FAKE_NVML_SCENARIO, else
/etc/fake-nvml/scenario.conf), read at every request, as GPUd reports what it sees now.

`gpud run` serves in the foreground (GPUd without systemd). `gpud up` starts it in the
background and returns once it answers: the real one installs and starts a systemd unit, and
the bed's nodes have no systemd. `gpud down` stops it. Stdlib only: it runs on the node.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

VERSION = "v0.5.1"
DEFAULT_LISTEN = "127.0.0.1:15132"
DEFAULT_DATA_DIR = "/var/lib/gpud"
DEFAULT_SCENARIO = "/etc/fake-nvml/scenario.conf"
DEFAULT_STATES = "gpud_docs_v1_states_plugin_only_healthy.json"
HEALTHZ = {"status": "ok", "version": "v1"}
START_TIMEOUT_S = 10.0


def scenario_value(key: str) -> str | None:
    """The scenario's last value for key, or None (no file, or no such key)."""
    path = os.environ.get("FAKE_NVML_SCENARIO") or DEFAULT_SCENARIO
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:
        name, eq, value = line.strip().partition("=")
        if eq and not name.startswith("#") and name.strip() == key:
            found = value.strip()
    return found


def sample(name: str) -> bytes:
    """A response file packed into the zipapp (data/gpud/NAME)."""
    if "/" in name:
        raise OSError(f"{name}: not a sample name")
    return __loader__.get_data(os.path.join(os.path.dirname(__file__), "data", "gpud", name))


def states() -> list:
    """/v1/states as GPUd answers it: an array of {component, states}."""
    doc = json.loads(sample(scenario_value("gpud.states") or DEFAULT_STATES))
    return doc if isinstance(doc, list) else [doc]


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = f"gpud/{VERSION}"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        routes = {"/healthz": lambda: HEALTHZ, "/v1/states": states, "/v1/events": lambda: []}
        if path not in routes:
            self._send(404, {"code": 404, "message": f"{path} not found"})
            return
        try:
            self._send(200, routes[path]())
        except (OSError, ValueError) as exc:
            self._send(500, {"code": 500, "message": f"gpud stand-in: {exc}"})

    def _send(self, status: int, body: object) -> None:
        data = json.dumps(body, indent=2).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def certificate(data_dir: Path) -> tuple[Path, Path]:
    """The self-signed certificate and key, made once with the openssl CLI."""
    cert, key = data_dir / "gpud.crt", data_dir / "gpud.key"
    if not (cert.exists() and key.exists()):
        data_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt"]
            + ["ec_paramgen_curve:prime256v1", "-nodes", "-days", "3650", "-subj", "/CN=gpud"]
            + ["-keyout", str(key), "-out", str(cert)],
            check=True,
            capture_output=True,
        )
    return cert, key


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "0.0.0.0", int(port)


def run(address: str, data_dir: Path) -> int:
    cert, key = certificate(data_dir)
    server = http.server.ThreadingHTTPServer(split_address(address), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"gpud {VERSION} (gpuhealth test bed stand-in) serving on https://{address}", flush=True)
    server.serve_forever()
    return 0


def answers(address: str) -> bool:
    """Does GPUd answer /healthz on address (its self-signed certificate accepted)?"""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    host, port = split_address(address)
    url = f"https://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=1, context=context) as resp:
            return json.loads(resp.read()) == HEALTHZ
    except (OSError, ValueError):
        return False


def running(pid_file: Path) -> int | None:
    """The pid of the gpud the pid file names, if it still runs."""
    try:
        pid = int(pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if b"run" in cmdline else None


def up(address: str, data_dir: Path) -> int:
    pid_file = data_dir / "gpud.pid"
    pid = running(pid_file)
    if pid is not None:
        print(f"gpud already running (pid {pid})")
        return 0
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, os.path.abspath(sys.argv[0]), "run", "--listen-address", address]
    with open(data_dir / "gpud.log", "ab") as log:
        proc = subprocess.Popen(
            [*argv, "--data-dir", str(data_dir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    pid_file.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    while not answers(address):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (data_dir / "gpud.log").read_text(errors="replace")[-1000:]
            print(f"gpud did not start on {address}:\n{tail}", file=sys.stderr)
            return 1
        time.sleep(0.1)
    print(f"gpud {VERSION} started (pid {proc.pid}), listening on https://{address}")
    return 0


def down(data_dir: Path) -> int:
    pid_file = data_dir / "gpud.pid"
    pid = running(pid_file)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + START_TIMEOUT_S
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    pid_file.unlink(missing_ok=True)
    print("gpud stopped" if pid is not None else "gpud was not running")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpud", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"gpud {VERSION} (stand-in)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "up", "down"):
        command = sub.add_parser(name)
        command.add_argument("--data-dir", type=Path, default=Path(DEFAULT_DATA_DIR))
        if name != "down":
            command.add_argument("--listen-address", default=DEFAULT_LISTEN)
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args.listen_address, args.data_dir)
    if args.command == "up":
        return up(args.listen_address, args.data_dir)
    return down(args.data_dir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
