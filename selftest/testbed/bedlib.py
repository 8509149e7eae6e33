"""Multi-host SSH test bed on one machine: nodes = netns + overlay root + sshd.

Each node is a network namespace on a private bridge, with PID/UTS/mount
namespaces, its own overlay root over a cached debootstrap rootfs and
``sshd -D -e`` as PID 1, so Ansible and testinfra talk real SSH to it.
Teardown never trusts state.json: leftovers are found by name prefix, by the
run dir in command lines and in /proc/self/mountinfo, so a crashed run is
always recoverable. Stdlib only; must run as root.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import mirror

VERSION = 1  # bump to force a rootfs rebuild
SUITE = "bookworm"
# build-essential: roles build nccl-tests from source on the nodes, as on real GPU nodes; the
# mirror carries no Debian toolchain, so it is part of the image (the role's apt task for it
# then finds it installed). ca-certificates brings the openssl CLI the GPUd stand-in uses.
# python3-venv likewise for the gpuhealth_agent role's venv. slurmd, slurm-client and munge:
# the bed's nodes are Slurm compute nodes (Debian's slurm-wlm), as an admin set them up.
PACKAGES = (
    "openssh-server",
    "python3",
    "python3-apt",
    "python3-venv",
    "iproute2",
    "procps",
    "ca-certificates",
    "build-essential",
    "slurmd",
    "slurm-client",
    "munge",
)
RECIPE = {"version": VERSION, "suite": SUITE, "variant": "minbase", "packages": sorted(PACKAGES)}

RUN_DIR = Path(os.environ.get("GPUHEALTH_TESTBED_RUN", "/run/gpuhealth-testbed"))
CACHE_DIR = Path(os.environ.get("GPUHEALTH_TESTBED_CACHE", "/var/cache/gpuhealth-testbed"))
NET = os.environ.get("GPUHEALTH_TESTBED_NET", "10.213.0")  # the bed's own /24
BRIDGE, BRIDGE_IP = "ghbr0", f"{NET}.1"
NETNS_PREFIX, VETH_PREFIX = "ghbed-", "ghv-"
MIRROR_PORT = 8642
DEVICES = {
    "null": "1 3",
    "zero": "1 5",
    "full": "1 7",
    "random": "1 8",
    "urandom": "1 9",
    "tty": "5 0",
}
NODE_MIRROR_DIR = "/srv/gpuhealth-mirror"  # the repo bind-mounted read-only: file: use
# The node's /proc/modules: a copy of the host's taken at node start, bind-mounted over it, so
# stand-in driver packages can "load" their kernel modules on the node (standins.py).
NODE_MODULES = "/run/testbed-kernel/modules"
# Programs whose command line naming the run dir marks them as ours (nodes, mirror, ssh masters).
# munged, slurmctld (and its slurmscriptd): slurmbed's controller side, daemons we adopt.
OWN_PROGRAMS = (
    "ssh",
    "sshd",
    "unshare",
    "ip",
    "sh",
    "chroot",
    "setsid",
    "munged",
    "slurmctld",
    "slurmscriptd",
)
HOST_TOOLS = {
    "debootstrap": "debootstrap",
    "dpkg-scanpackages": "dpkg-dev",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "ip": "iproute2",
}
# What sshd logs at LogLevel VERBOSE for every command it runs (session.c, do_exec).
SESSION = "Starting session: command for "
DEBIAN_SUITES = {"bullseye", "bookworm", "trixie", "forky", "sid", "stable", "testing", "unstable"}


class BedError(RuntimeError):
    """The bed could not be brought up or torn down cleanly."""


@dataclass
class Node:
    name: str
    address: str
    netns: str
    veth: str
    upper: str
    work: str
    merged: str
    pids: list[int] = field(default_factory=list)


@dataclass
class Bed:
    run_dir: Path
    nodes: list[Node]
    ssh_config: Path
    inventory: Path
    mirror_url: str
    mirror_dir: Path
    rootfs: Path
    key: Path
    # Extra inventory vars per node (gpu_profile, gpu_count ...), kept in inventory.yml.
    host_vars: dict[str, dict[str, object]] = field(default_factory=dict)

    def ssh(
        self, node: str, command: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess:
        """Run a shell command on a node through the bed's ssh_config (multiplexed)."""
        argv = ["ssh", "-F", str(self.ssh_config), node, command]
        return subprocess.run(
            argv, input=input, capture_output=True, text=True, check=check, timeout=120
        )

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def set_host_vars(self, host_vars: dict[str, dict[str, object]]) -> None:
        """Merge inventory vars into nodes' entries and rewrite inventory.yml."""
        for name, values in host_vars.items():
            self.node(name)  # only nodes of this bed
            self.host_vars.setdefault(name, {}).update(values)
        _write_inventory(self)
        self.save()

    def sessions(self, name: str) -> int:
        """How many commands the node's sshd has run so far (its VERBOSE "Starting session:
        command" log lines): an exec counter outside anything the tests ship to the node."""
        log = Path(self.node(name).upper).parent / "node.log"
        return sum(1 for line in log.read_text(errors="replace").splitlines() if SESSION in line)

    def stop_node(self, name: str) -> None:
        """Kill a node (its whole PID namespace): its address stays, nothing listens on it."""
        node = self.node(name)
        for pid in node.pids:
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "unshare":
                    os.kill(pid, signal.SIGKILL)  # --kill-child takes sshd and its sessions
        if not _wait(lambda: not _port_open(node.address, 22), timeout=10):
            raise BedError(f"{name} still answers on port 22 after being stopped")
        _reap_adopted()

    def ansible_env(self) -> dict[str, str]:
        """Environment for ansible/ansible-playbook that keeps all state inside the run dir."""
        return {
            **os.environ,
            "ANSIBLE_INVENTORY": str(self.inventory),
            "ANSIBLE_HOME": str(self.run_dir / "ansible"),
            "ANSIBLE_LOCAL_TEMP": str(self.run_dir / "ansible" / "tmp"),
            "ANSIBLE_HOST_KEY_CHECKING": "False",
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.run_dir / "cp"),
        }

    def publish(self, debs: Iterable[Path | str]) -> None:
        """Add packages to the running mirror (nodes see them after apt-get update)."""
        mirror.build_repo(self.mirror_dir, debs)

    def publish_files(self, files: Iterable[Path | str]) -> list[str]:
        """Put release tarballs on the mirror (files/, each with a .sha256); their URLs."""
        names = mirror.add_files(self.mirror_dir, files)
        return [f"{self.mirror_url}{mirror.FILES_DIR}/{name}" for name in names]

    def disconnect(self, name: str) -> None:
        """Close the multiplexed ssh connection to a node, so the next command gets a fresh
        session from the node's sshd (e.g. after raising its resource limits)."""
        argv = ["ssh", "-F", str(self.ssh_config), "-O", "exit", name]
        subprocess.run(argv, capture_output=True, timeout=10)

    def save(self) -> None:
        data = {k: str(v) for k, v in asdict(self).items() if k not in ("nodes", "host_vars")}
        data["nodes"] = [asdict(n) for n in self.nodes]
        data["host_vars"] = self.host_vars
        (self.run_dir / "state.json").write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, run_dir: Path = RUN_DIR) -> Bed | None:
        """The bed described by state.json, or None if there is no (readable) state."""
        try:
            data = json.loads((run_dir / "state.json").read_text())
            nodes = [Node(**n) for n in data.pop("nodes")]
            host_vars = data.pop("host_vars", {})
            paths = {k: Path(v) for k, v in data.items() if k != "mirror_url"}
            return cls(nodes=nodes, mirror_url=data["mirror_url"], host_vars=host_vars, **paths)
        except (OSError, ValueError, KeyError, TypeError):
            return None


# ---------------------------------------------------------------- helpers


def _run(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    proc = subprocess.run(argv, text=True, **kw)
    if check and proc.returncode != 0:
        raise BedError(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _require_root() -> None:
    if os.geteuid() != 0:
        raise BedError("the test bed needs root (namespaces, mounts, bridge)")


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    """Serialise bed operations (two pytest sessions, or CLI + tests) on one machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def exclusive(run_dir: Path = RUN_DIR) -> Iterator[None]:
    """Hold the machine's one bed for a whole session (a test module, `bed demo`).

    `up` starts by tearing down whatever bed exists, so a second session (another pytest run,
    an xdist worker on another file) must wait here rather than pull the nodes from under the
    first one.
    """
    with _flock(run_dir.with_name(run_dir.name + ".session.lock")):
        yield


def _wait(pred, timeout: float, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(interval)
    return True


def become_subreaper() -> None:
    """Adopt orphaned bed processes so ``down`` can reap them.

    Nodes, the mirror and ssh masters are detached; if PID 1 does not reap
    orphans (seen on the firecracker build VMs) they would linger as zombies.
    """
    pr_set_child_subreaper = 36
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


def ensure_host_tools() -> None:
    """apt-get install whatever host tool is missing (fresh CI machine)."""
    missing = sorted({pkg for tool, pkg in HOST_TOOLS.items() if not shutil.which(tool)})
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    if _run(*cmd, check=False, env=env).returncode != 0:
        _run("apt-get", "update")
        _run(*cmd, env=env)


def debian_mirror() -> str:
    """The Debian archive URI the host's apt already uses (never hard-coded)."""
    if os.environ.get("GPUHEALTH_TESTBED_DEBIAN_MIRROR"):
        return os.environ["GPUHEALTH_TESTBED_DEBIAN_MIRROR"]
    entries: list[tuple[str, list[str], list[str]]] = []  # (uri, suites, components)
    apt = Path("/etc/apt")
    for f in [apt / "sources.list", *sorted(apt.glob("sources.list.d/*.list"))]:
        for line in f.read_text().splitlines() if f.is_file() else []:
            words = re.sub(r"\[[^]]*\]", "", line.split("#")[0]).split()
            if len(words) >= 4 and words[0] == "deb":
                entries.append((words[1], [words[2]], words[3:]))
    for f in sorted(apt.glob("sources.list.d/*.sources")):
        for stanza in f.read_text().split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(("#", " ")):
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
                for uri in fields.get("uris", "").split():
                    entries.append(
                        (
                            uri,
                            fields.get("suites", "").split(),
                            fields.get("components", "").split(),
                        )
                    )
    for uri, suites, comps in entries:
        if "main" in comps and DEBIAN_SUITES & set(suites) and uri.startswith(("http", "file")):
            return uri
    raise BedError("no Debian archive in the apt sources; set GPUHEALTH_TESTBED_DEBIAN_MIRROR")


# ---------------------------------------------------------------- rootfs


def recipe_hash() -> str:
    return hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:12]


def ensure_rootfs(cache_dir: Path = CACHE_DIR) -> Path:
    """Return the cached node rootfs, building it once per recipe (debootstrap + apt)."""
    name = f"rootfs-{recipe_hash()}"
    root, meta = cache_dir / name, cache_dir / f"{name}.json"
    if root.is_dir() and meta.is_file():
        return root
    with _flock(cache_dir / ".lock"):
        if root.is_dir() and meta.is_file():
            return root
        ensure_host_tools()
        start = time.monotonic()
        tmp = cache_dir / f"{name}.tmp"
        _remove_tree(tmp)
        log = cache_dir / "build.log"
        with open(log, "w") as out:

            def step(*argv: str) -> None:
                if subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode:
                    raise BedError(f"rootfs build failed at {shlex.join(argv)}; see {log}")

            step("debootstrap", "--variant=minbase", SUITE, str(tmp), debian_mirror())
            policy = tmp / "usr/sbin/policy-rc.d"  # never start services in the chroot/nodes
            policy.write_text("#!/bin/sh\nexit 101\n")
            policy.chmod(0o755)
            shutil.copy2("/etc/resolv.conf", tmp / "etc/resolv.conf")
            env = ["env", "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C"]
            step("chroot", str(tmp), *env, "apt-get", "update")
            step(
                "chroot",
                str(tmp),
                *env,
                "apt-get",
                "install",
                "-y",
                "--no-install-recommends",
                *PACKAGES,
            )
            step("chroot", str(tmp), "apt-get", "clean")
        # Per-node host keys and sources are written at `up`; drop the build-time ones.
        for p in [*tmp.glob("etc/ssh/ssh_host_*"), *tmp.glob("var/lib/apt/lists/*_*")]:
            p.unlink()
        (tmp / "etc/resolv.conf").write_text("")
        tmp.rename(root)
        meta.write_text(json.dumps({**RECIPE, "build_seconds": time.monotonic() - start}) + "\n")
    return root


def _prune_rootfs(current: Path) -> None:
    """Remove the rootfs of earlier recipes: only once no bed runs, as one may be its lower dir
    (`up` calls this after tearing the old bed down)."""
    with _flock(current.parent / ".lock"):
        for old in current.parent.glob("rootfs-*"):
            if old.name not in (current.name, f"{current.name}.json"):
                _remove_tree(old) if old.is_dir() else old.unlink()


def rootfs_build_seconds(cache_dir: Path = CACHE_DIR) -> float | None:
    """How long the cold build of the current rootfs took (recorded at build time)."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        meta = cache_dir / f"rootfs-{recipe_hash()}.json"
        return float(json.loads(meta.read_text())["build_seconds"])
    return None


# ---------------------------------------------------------------- discovery & teardown


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path).rstrip("/")
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")  # \040 etc.
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def _remove_tree(path: Path) -> None:
    """rm -rf that first detaches mounts and never crosses into another filesystem."""
    for point in _mounts_under(path):
        _run("umount", "-l", point, check=False)
    if path.exists() or path.is_symlink():
        _run("rm", "-rf", "--one-file-system", str(path))


def _ancestors() -> set[int]:
    """This process and its parents: never kill the caller (e.g. `bed down` from a shell)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def bed_processes(run_dir: Path = RUN_DIR) -> dict[int, str]:
    """Live processes of the bed: anything in a bed netns, or ours naming the run dir."""
    found: dict[int, str] = {}
    for ns in bed_netns():
        for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
            found[int(pid)] = f"in netns {ns}"
    mine, needle = _ancestors(), str(run_dir).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in mine:
            continue
        with contextlib.suppress(OSError):
            prog = proc.joinpath("comm").read_text().strip()  # immune to setproctitle
            cmdline = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ")
            if (prog in OWN_PROGRAMS or prog.startswith("python")) and needle in cmdline:
                found[int(proc.name)] = cmdline.decode(errors="replace")[:200]
    return found


def bed_netns() -> list[str]:
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(NETNS_PREFIX)]


def bed_links() -> list[str]:
    out = _run("ip", "-o", "link", "show", check=False).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]
    return [n for n in names if n == BRIDGE or n.startswith(VETH_PREFIX)]


def leftovers(run_dir: Path = RUN_DIR) -> list[str]:
    """Everything a torn-down bed must not leave behind (empty list = clean)."""
    left = [f"process {pid}: {what}" for pid, what in bed_processes(run_dir).items()]
    left += [f"netns {ns}" for ns in bed_netns()]
    left += [f"link {link}" for link in bed_links()]
    left += [f"mount {m}" for m in _mounts_under(run_dir)]
    if run_dir.exists():
        left.append(f"dir {run_dir}")
    return left


def _gone(pid: int) -> bool:
    """Reap pid if it is our child; True once it no longer runs (zombies count as gone)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def _reap_adopted() -> None:
    """Reap zombie bed processes we adopted as subreaper (own session, so not our Popen's)."""
    me, sid = str(os.getpid()), os.getsid(0)
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            comm, rest = proc.joinpath("stat").read_text().rsplit(")", 1)
            state, ppid, _, session = rest.split()[:4]
            prog = comm.split("(", 1)[1]
            if (
                state == "Z"
                and ppid == me
                and int(session) != sid
                and (prog in OWN_PROGRAMS or prog.startswith("python"))
            ):
                os.waitpid(int(proc.name), os.WNOHANG)


def control_sockets(run_dir: Path) -> list[Path]:
    """The ssh masters' sockets: the bed's ssh_config's (cm-*) and Ansible's (cp/*)."""
    return list(run_dir.glob("cm-*")) + list(run_dir.glob("cp/*"))


def close_masters(run_dir: Path) -> None:
    """Ask every multiplexed ssh master of the bed to exit."""
    for sock in control_sockets(run_dir):
        _run("ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x", check=False, timeout=5)


def _kill_all(run_dir: Path) -> None:
    close_masters(run_dir)
    for _ in range(3):  # new processes may appear while killing (ssh masters forking)
        pids = bed_processes(run_dir)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                # SIGKILL: `unshare --fork` ignores SIGTERM; --kill-child takes the PID ns.
                os.kill(pid, signal.SIGKILL)
        if not _wait(lambda p=pids: all(_gone(x) for x in p), timeout=10):
            raise BedError(f"processes survive SIGKILL: {sorted(pids)}")
        if not pids:
            break
    _reap_adopted()


def _teardown(run_dir: Path) -> None:
    _kill_all(run_dir)
    for point in _mounts_under(run_dir):
        _run("umount", "-l", point, check=False)
    for link in bed_links():  # deleting one veth end removes its peer synchronously
        if link != BRIDGE:
            _run("ip", "link", "del", link, check=False)
    if BRIDGE in bed_links():
        _run("ip", "link", "del", BRIDGE, check=False)
    for ns in bed_netns():
        _run("ip", "netns", "del", ns, check=False)
    _remove_tree(run_dir)
    _wait(lambda: not leftovers(run_dir), timeout=5, interval=0.1)
    if left := leftovers(run_dir):
        raise BedError("teardown left: " + "; ".join(left))


def down(run_dir: Path = RUN_DIR) -> None:
    """Tear the bed down completely; works without (or with stale) state.json."""
    _require_root()
    with _flock(run_dir.with_name(run_dir.name + ".lock")):
        _teardown(run_dir)


# ---------------------------------------------------------------- bring-up


def _spawn(argv: list[str], log: Path) -> None:
    """Start a detached process (own session) whose output goes to log."""
    with open(log, "ab") as out:
        subprocess.run(
            ["setsid", "--fork", *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
        )


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _node_script(node: Node, rootfs: Path, mirror_dir: Path) -> str:
    """Shell run as PID 1 of the node's namespaces: build the root, pivot into it, exec sshd."""
    m = shlex.quote(node.merged)
    opts = shlex.quote(f"lowerdir={rootfs},upperdir={node.upper},workdir={node.work}")
    lines = [
        f"mount -t overlay overlay -o {opts} {m}",
        f"mount -t proc proc {m}/proc",
        f"mount -t sysfs -o ro sysfs {m}/sys",
        f"mount -t tmpfs -o mode=755,size=64m tmpfs {m}/run && mkdir -p {m}/run/sshd",
        f"mount -t tmpfs -o mode=755,size=4m tmpfs {m}/dev",
        *(f"mknod -m 666 {m}/dev/{n} c {nums}" for n, nums in DEVICES.items()),
        f"mkdir {m}/dev/pts {m}/dev/shm && mount -t tmpfs -o mode=1777 tmpfs {m}/dev/shm",
        f"mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts {m}/dev/pts",
        f"ln -s pts/ptmx {m}/dev/ptmx && ln -s /proc/self/fd {m}/dev/fd",
        *(
            f"ln -s /proc/self/fd/{i} {m}/dev/{n}"
            for i, n in enumerate(["stdin", "stdout", "stderr"])
        ),
        f"mkdir -p {m}{NODE_MIRROR_DIR} && mount --bind -o ro {shlex.quote(str(mirror_dir))} "
        f"{m}{NODE_MIRROR_DIR}",
        # (a kernel without loadable module support has no /proc/modules to stand in for)
        f"if [ -e /proc/modules ]; then mkdir -p {m}{Path(NODE_MODULES).parent} && "
        f"cat /proc/modules > {m}{NODE_MODULES} && "
        f"mount --bind {m}{NODE_MODULES} {m}/proc/modules; fi",
        f"hostname {node.name}",
        # pivot_root rather than a bare chroot: the node then sees only its own mounts.
        f"cd {m} && mkdir -p .oldroot && pivot_root . .oldroot && cd /",
        "umount -l /.oldroot && rmdir /.oldroot",
        "exec /usr/sbin/sshd -D -e",
    ]
    return "set -eu\n" + "\n".join(lines) + "\n"


def _prepare_upper(node: Node, nodes: list[Node], pubkey: str) -> list[str]:
    """Seed the node's overlay upper dir: host key, sshd policy, apt source, hosts."""
    upper = Path(node.upper)
    for d, mode in (("etc/ssh/sshd_config.d", 0o755), ("root/.ssh", 0o700), ("etc/apt", 0o755)):
        (upper / d).mkdir(parents=True, exist_ok=True)
        (upper / d).chmod(mode)
    (upper / "root").chmod(0o700)
    hostkey = upper / "etc/ssh/ssh_host_ed25519_key"
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", node.name, "-f", str(hostkey))
    _write(
        upper / "etc/ssh/sshd_config.d/testbed.conf",
        "HostKey /etc/ssh/ssh_host_ed25519_key\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nUseDNS no\n"
        "LogLevel VERBOSE\n",  # logs every command it runs: Bed.sessions() counts them
    )
    _write(upper / "root/.ssh/authorized_keys", pubkey, 0o600)
    _write(
        upper / "etc/apt/sources.list", f"deb [trusted=yes] http://{BRIDGE_IP}:{MIRROR_PORT}/ ./\n"
    )
    _write(upper / "etc/hostname", node.name + "\n")
    hosts = "".join(f"{n.address} {n.name}\n" for n in nodes)
    _write(upper / "etc/hosts", f"127.0.0.1 localhost\n{BRIDGE_IP} bed-host\n{hosts}")
    return hostkey.with_suffix(".pub").read_text().split(" ")[:2]


def _check_subnet_free() -> None:
    for line in _run("ip", "-o", "-4", "addr", "show").stdout.splitlines():
        words = line.split()
        if words[3].startswith(f"{NET}.") and words[1] != BRIDGE:
            raise BedError(f"{NET}.0/24 already used on {words[1]}; set GPUHEALTH_TESTBED_NET")


def up(
    nodes: int | Sequence[str] = 3, run_dir: Path = RUN_DIR, extra_debs: Iterable[Path | str] = ()
) -> Bed:
    """Bring up nodes from a clean slate (a count: n1..nN; or their names, which become their
    host names and inventory names); tears down whatever a crash left."""
    _require_root()
    names = [f"n{i}" for i in range(1, nodes + 1)] if isinstance(nodes, int) else list(nodes)
    if not 1 <= len(names) <= 200:
        raise BedError("1 <= nodes <= 200")
    bad = [n for n in names if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", n)]
    if bad or len(set(names)) != len(names):
        raise BedError(f"node names must be distinct host names, got {names}")
    ensure_host_tools()
    rootfs = ensure_rootfs()
    with _flock(run_dir.with_name(run_dir.name + ".lock")):
        _teardown(run_dir)
        _prune_rootfs(rootfs)
        try:
            return _bring_up(names, run_dir, rootfs, extra_debs)
        except BaseException:
            _teardown(run_dir)
            raise


def _bring_up(
    names: list[str], run_dir: Path, rootfs: Path, extra_debs: Iterable[Path | str]
) -> Bed:
    _check_subnet_free()
    run_dir.mkdir(mode=0o700, parents=True)
    key = run_dir / "id_ed25519"
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuhealth-testbed", "-f", str(key))
    pubkey = key.with_suffix(".pub").read_text()

    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{BRIDGE_IP}/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")

    mirror_dir = run_dir / "mirror"
    mirror.build_repo(mirror_dir, [*mirror.default_debs(CACHE_DIR), *extra_debs])
    _spawn(
        [
            "python3",
            "-m",
            "http.server",
            str(MIRROR_PORT),
            "--bind",
            BRIDGE_IP,
            "--directory",
            str(mirror_dir),
        ],
        run_dir / "mirror.log",
    )

    nodes = []
    for i, name in enumerate(names, 1):
        d = run_dir / name
        nodes.append(
            Node(
                name=name,
                address=f"{NET}.{10 + i}",
                netns=f"{NETNS_PREFIX}n{i}",
                veth=f"{VETH_PREFIX}n{i}",
                upper=str(d / "upper"),
                work=str(d / "work"),
                merged=str(d / "merged"),
            )
        )
    known_hosts = []
    for node in nodes:
        for sub in (node.upper, node.work, node.merged):
            Path(sub).mkdir(parents=True)
        hostkey = _prepare_upper(node, nodes, pubkey)
        known_hosts.append(f"{node.name},{node.address} {' '.join(hostkey)}\n")
        _run("ip", "netns", "add", node.netns)
        _run(
            "ip",
            "link",
            "add",
            node.veth,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            node.netns,
        )
        _run("ip", "link", "set", node.veth, "master", BRIDGE, "up")
        _run("ip", "-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
        _run("ip", "-n", node.netns, "link", "set", "eth0", "up")
        _run("ip", "-n", node.netns, "link", "set", "lo", "up")
        script = _node_script(node, rootfs, mirror_dir)
        _spawn(
            [
                "ip",
                "netns",
                "exec",
                node.netns,
                "unshare",
                "--mount",
                "--uts",
                "--pid",
                "--fork",
                "--kill-child",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
            ],
            Path(node.upper).parent / "node.log",
        )

    (run_dir / "known_hosts").write_text("".join(known_hosts))
    bed = Bed(
        run_dir=run_dir,
        nodes=nodes,
        ssh_config=run_dir / "ssh_config",
        inventory=run_dir / "inventory.yml",
        rootfs=rootfs,
        key=key,
        mirror_url=f"http://{BRIDGE_IP}:{MIRROR_PORT}/",
        mirror_dir=mirror_dir,
    )
    _write_ssh_config(bed)
    _write_inventory(bed)

    targets = [(node.address, 22, node.name) for node in nodes] + [
        (BRIDGE_IP, MIRROR_PORT, "mirror")
    ]
    for host, port, what in targets:
        if not _wait(lambda h=host, p=port: _port_open(h, p), timeout=20):
            logs = [run_dir / "mirror.log", run_dir / what / "node.log"]
            tail = "".join(p.read_text()[-2000:] for p in logs if p.is_file())
            raise BedError(f"{what} did not start listening on {host}:{port}\n{tail}")
    checks = [
        subprocess.Popen(
            ["ssh", "-F", str(bed.ssh_config), node.name, "true"], stderr=subprocess.PIPE
        )
        for node in nodes
    ]
    for node, proc in zip(nodes, checks, strict=True):
        if proc.wait(timeout=30) != 0:
            raise BedError(f"ssh to {node.name} failed: {proc.stderr.read().decode()}")
    for node in nodes:
        node.pids = [int(p) for p in _run("ip", "netns", "pids", node.netns).stdout.split()]
    bed.save()
    return bed


def _write_ssh_config(bed: Bed) -> None:
    common = (
        f"  User root\n  Port 22\n  IdentityFile {bed.key}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {bed.run_dir / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n  ControlMaster auto\n"
        f"  ControlPath {bed.run_dir}/cm-%C\n  ControlPersist 60s\n"
        "  BatchMode yes\n  ConnectTimeout 5\n  LogLevel ERROR\n"
    )
    text = "".join(
        f"Host {node.name} {node.address}\n  HostName {node.address}\n{common}\n"
        for node in bed.nodes
    )
    bed.ssh_config.write_text(text)


def _write_inventory(bed: Bed) -> None:
    """YAML inventory (strings JSON-quoted); connection vars per host so group_vars can't win."""
    q = json.dumps
    hostvars = {
        "ansible_user": "root",
        "ansible_port": "22",
        "ansible_ssh_private_key_file": str(bed.key),
        "ansible_ssh_common_args": f"-F {bed.ssh_config}",
        "ansible_control_path_dir": str(bed.run_dir / "cp"),
        "ansible_python_interpreter": "/usr/bin/python3",
    }
    lines = ["all:", "  children:", "    gpu_nodes:", "      hosts:"]
    for node in bed.nodes:
        lines += [f"        {node.name}:", f"          ansible_host: {q(node.address)}"]
        extra = bed.host_vars.get(node.name, {})
        lines += [f"          {k}: {q(v)}" for k, v in {**extra, **hostvars}.items()]
    lines += ["      vars:", f"        testbed_mirror_url: {q(bed.mirror_url)}"]
    bed.inventory.write_text("\n".join(lines) + "\n")


def ssh_ok(bed: Bed, node: str) -> bool:
    """Does the node answer ssh (used by `bed status`)?"""
    with contextlib.suppress(subprocess.TimeoutExpired):
        return bed.ssh(node, "true", check=False).returncode == 0
    return False
