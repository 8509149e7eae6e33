"""Ship the probe to a node and bring its facts document back, in one round trip.

The probe is a package of several stdlib-only modules. They travel as one compressed payload on
the command's standard input, and a few lines of bootstrap code in the command line read it and
serve the modules to `import` from memory on the node, so nothing is installed or written there.
The command line stays a few hundred bytes whatever the payload weighs: Linux caps one argument
at 128 KiB (MAX_ARG_STRLEN), and sshd hands the whole command to the node's shell as one.
"""

from __future__ import annotations

import ast
import base64
import copy
import importlib
import importlib.util
import io
import json
import math
import shlex
import subprocess
import tokenize
import zlib
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from gpuhealth.deadline import DeadlineExceeded, within
from gpuhealth.documents import FactsError, validated
from gpuhealth.families import NAMES
from gpuhealth.schema import CORE_PROFILE_KEYS

_BOOTSTRAP = """\
import base64, importlib.abc, importlib.util, json, os, sys, zlib
try:
    b = json.loads(zlib.decompress(base64.b64decode(sys.stdin.buffer.readline())).decode())
except Exception as e:
    sys.exit("gpuhealth: the probe payload on stdin is missing or cut short (%s)" % e)
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
S, P = b["modules"], set(b["packages"])
class L(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in S:
            return importlib.util.spec_from_loader(name, self, is_package=name in P)
    def create_module(self, spec):
        return None
    def exec_module(self, m):
        exec(compile(S[m.__name__], "<gpuhealth>/" + m.__name__, "exec"), m.__dict__)
sys.meta_path.insert(0, L())
from gpuhealth.probe.main import main
main(b["config"])
os._exit(0)
"""


class ProbeError(RuntimeError):
    """The probe could not be run or returned nothing usable; `unreachable` says which."""

    def __init__(self, message: str, unreachable: bool) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def _source(name: str) -> tuple[str, bool] | None:
    """(source, is_package) of a gpuhealth module, or None if there is no such module."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:  # `from module import name` of a non-module name
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin).read_text(), spec.submodule_search_locations is not None


def _imports(tree: ast.AST) -> list[str]:
    """The gpuhealth modules a module imports at run time (`if TYPE_CHECKING:` blocks are for
    the type checker only and are not followed)."""
    found: list[str] = []
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "gpuhealth":
                found.append(node.module)
                found.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend(a.name for a in node.names if a.name.split(".")[0] == "gpuhealth")
    return found


def compact(source: str) -> str:
    """The module without its docstrings, comment lines and blank lines: the same code in a
    third less of the payload each probe carries. A body that was only a docstring gets
    `pass`; strings that span lines are kept whole."""
    tree = ast.parse(source)
    text = source.splitlines()
    drop: set[int] = set()
    passes: dict[int, int] = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0] if node.body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
            and not text[first.lineno - 1][: first.col_offset].strip()
            and not text[(first.end_lineno or first.lineno) - 1][first.end_col_offset :].strip()
        ):
            drop.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
            if len(node.body) == 1:
                passes[first.lineno] = first.col_offset
    keep: set[int] = set()  # lines inside a string that spans lines: their text is data
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and not tok.line[: tok.start[1]].strip():
            drop.add(tok.start[0])
        elif tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
            keep.update(range(tok.start[0] + 1, tok.end[0] + 1))
    lines = []
    for number, line in enumerate(text, 1):
        if number in passes:
            lines.append(" " * passes[number] + "pass")
        elif number in drop or (not line.strip() and number not in keep):
            continue
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def node_modules() -> tuple[dict[str, str], list[str]]:
    """The modules that run on the node: the probe's core, every family's `probe.py`, and what
    they import (followed from their imports; `families.NAMES` says which families exist).

    Only what the probe needs travels: controller-side code has no business on the node.
    """
    sources: dict[str, str] = {}
    packages: list[str] = []
    todo = ["gpuhealth.probe.main", *(f"gpuhealth.families.{n}.probe" for n in NAMES)]
    while todo:
        name = todo.pop()
        if name in sources:
            continue
        found = _source(name)
        if found is None:
            continue
        text, is_package = found
        sources[name] = text
        if is_package:
            packages.append(name)
        parent = name.rpartition(".")[0]
        if parent:
            todo.append(parent)
        todo.extend(_imports(ast.parse(text)))
    return sources, sorted(packages)


@cache
def _shipped() -> tuple[dict[str, str], list[str]]:
    """The node modules as they travel (compacted once per process)."""
    modules, packages = node_modules()
    return {name: compact(text) for name, text in modules.items()}, packages


@cache
def node_profile_keys() -> frozenset[str]:
    """The profile keys the node may read: the probe's own and each family's PROFILE_KEYS
    (its schema.py), which the node enforces when a family reads one."""
    keys = set(CORE_PROFILE_KEYS)
    for name in NAMES:
        keys.update(importlib.import_module(f"gpuhealth.families.{name}.schema").PROFILE_KEYS)
    return frozenset(keys)


class ProbeCall(NamedTuple):
    """How to run the probe on a node: a short shell command, and what to write on its stdin."""

    command: str
    stdin: str  # the compressed payload in base64, one line: it survives any text channel


def probe_call(
    config: dict[str, Any], python: str = "python3", timeout_s: float = 120
) -> ProbeCall:
    """The shell command that runs the probe on a node, bounded by `timeout` there too, and the
    payload (modules and config) it reads from its standard input."""
    modules, packages = _shipped()
    # The probe knows its deadline, so no wait inside it (the memory reclaim) outlasts it.
    # Only the profile keys the node side declares travel: the rest are the checks' business.
    expect = {k: v for k, v in (config.get("expect") or {}).items() if k in node_profile_keys()}
    config = {**config, "expect": expect, "deadline_s": timeout_s}
    payload = {"modules": modules, "packages": packages, "config": config}
    blob = base64.b64encode(zlib.compress(json.dumps(payload).encode(), 9)).decode()
    command = (
        f"timeout -k 5 {math.ceil(timeout_s)} {shlex.quote(python)} -c {shlex.quote(_BOOTSTRAP)}"
    )
    return ProbeCall(command, blob + "\n")


def parse_output(stdout: str) -> dict[str, Any]:
    """The facts document from the probe's stdout (the last JSON line; login banners precede)."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
                raise ProbeError(f"probe printed no usable JSON: {exc}", unreachable=False) from exc
            try:
                return validated(doc, "the probe's answer")
            except FactsError as exc:
                raise ProbeError(str(exc), unreachable=False) from exc
    raise ProbeError("probe printed no facts document", unreachable=False)


def _connection_error(exc: BaseException) -> str:
    # testinfra's ssh backend raises RuntimeError(CommandResult) when ssh exits 255.
    result = exc.args[0] if exc.args else None
    stderr = getattr(result, "stderr", None)
    if isinstance(stderr, str) and stderr.strip():
        return f"ssh failed: {stderr.strip()[-500:]}"
    return f"connection failed: {type(exc).__name__}: {exc}"[:600]


# testinfra's backends whose `run` goes through `run_local` (a local process: the command
# itself, or ssh with it), which passes its stdin on to the command.
_LOCAL_PROCESS = ("local", "ssh", "safe-ssh")


def _run_local_with_input(backend: Any, data: bytes, command: str, *args: str) -> Any:
    """testinfra's `BaseBackend.run_local`, with `data` written on the command's stdin."""
    cmd = backend.encode(backend.quote(command, *args))
    proc = subprocess.Popen(
        cmd, shell=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    stdout, stderr = proc.communicate(data)  # a command that exits unread is no error here
    return backend.result(proc.returncode, cmd, stdout, stderr)


def _run_paramiko(backend: Any, command: str, data: bytes) -> Any:
    """testinfra's paramiko `run` on a channel of its connection, `data` sent as stdin (and no
    terminal: a pty would echo the payload and cut it into lines)."""
    cmd = backend.encode(backend.get_command(command))
    channel = backend.client.get_transport().open_session()
    channel.exec_command(cmd)
    channel.sendall(data)
    channel.shutdown_write()
    stdout = b"".join(channel.makefile("rb"))
    stderr = b"".join(channel.makefile_stderr("rb"))
    return backend.result(channel.recv_exit_status(), cmd, stdout, stderr)


def run_with_input(host: Any, command: str, data: str) -> Any:
    """`host.run(command)` with `data` on the command's standard input, which testinfra's
    `run` cannot do: one round trip over the host's own connection (ssh options, sudo and an
    ansible:// host's connection settings included). Raises ProbeError for a connection that
    cannot carry it."""
    backend = host.backend
    kind = backend.get_connection_type()
    if kind == "ansible" and not backend.force_ansible:
        # as testinfra's ansible backend runs a command: over the host it resolves to
        inner = backend.ansible_runner.get_host(
            backend.host,
            ssh_config=backend.ssh_config,
            ssh_identity_file=backend.ssh_identity_file,
        )
        if inner is not None:
            return run_with_input(inner, backend.get_command(command), data)
    elif kind == "paramiko":
        return _run_paramiko(backend, command, data.encode())
    elif kind in _LOCAL_PROCESS:
        # A copy of the backend whose run_local feeds stdin; the host's own stays as it was.
        feeding = copy.copy(backend)
        feeding.run_local = lambda cmd, *args: _run_local_with_input(
            backend, data.encode(), cmd, *args
        )
        return feeding.run(command)
    # --force-ansible runs commands through ansible's shell module, which gets no stdin
    how = (
        "drop --force-ansible"
        if kind == "ansible" and backend.force_ansible
        else "use ssh://, paramiko://, local:// or ansible:// with an ssh, paramiko or local "
        "connection"
    )
    raise ProbeError(
        f"the probe's payload travels on standard input, which gpuhealth cannot send over "
        f"testinfra's {kind!r} connection: {how}",
        unreachable=False,
    )


def run_probe(
    host: Any, config: dict[str, Any], python: str = "python3", timeout_s: float = 120
) -> dict[str, Any]:
    """Run the probe over a testinfra host and return its facts document.

    The call is also bounded on the controller, in case the transport itself hangs.
    """
    call = probe_call(config, python, timeout_s)
    try:
        result = within(timeout_s + 30, lambda: run_with_input(host, *call))
    except DeadlineExceeded as exc:
        raise ProbeError(str(exc), unreachable=True) from None
    except ProbeError:
        raise
    except Exception as exc:
        raise ProbeError(_connection_error(exc), unreachable=True) from None
    if result.rc == 255 and not result.stdout:
        raise ProbeError(f"ssh failed: {result.stderr.strip()[-500:]}", unreachable=True)
    if result.rc == 124:
        raise ProbeError(f"probe killed after {timeout_s:g} s on the node", unreachable=False)
    if result.rc == 127:
        raise ProbeError(
            f"{python} or timeout not found on the node: {result.stderr.strip()[-300:]}",
            unreachable=False,
        )
    if result.rc != 0:
        raise ProbeError(
            f"probe exited {result.rc}: {result.stderr.strip()[-800:]}", unreachable=False
        )
    return parse_output(result.stdout)
