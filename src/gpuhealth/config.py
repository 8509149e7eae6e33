"""Per-SKU limit profiles and the inventory vars that override them.

Profiles are validated when the run starts, so a typo in a YAML file is one usage error that
names the file and key instead of hundreds of broken tests.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A bad profile or inventory; the message names the file (or host) and the key."""


_INT = (int,)
_NUM = (int, float)

# key -> (accepted types, may be null, what it means). Units are in the key names.
PROFILE_KEYS: dict[str, tuple[tuple[type, ...], bool, str]] = {
    "description": ((str,), True, "human description of the SKU"),
    "extends": ((str,), True, "profile this one builds on"),
    "match": ((list,), True, "regular expressions matched against the GPU product name"),
    "gpu_count": (_INT, True, "GPUs expected per node"),
    "min_driver_version": ((str,), False, "lowest acceptable driver, e.g. '570' or '570.124.06'"),
    "require_recovery_action": ((bool,), False, "fail when the driver cannot report it"),
    "require_ecc": ((bool,), False, "fail when ECC is off or unsupported"),
    "require_persistence_mode": ((bool,), False, "fail when persistence mode is off"),
    "vbios_prefix": ((str,), True, "every GPU's VBIOS version must start with this"),
    "max_ecc_uncorrected_volatile": (_INT, False, "uncorrectable ECC since driver load"),
    "max_ecc_uncorrected_aggregate": (_INT, False, "uncorrectable ECC over the GPU's life"),
    "max_ecc_corrected_volatile": (_INT, True, "correctable ECC since driver load"),
    "max_ecc_corrected_aggregate": (_INT, True, "correctable ECC over the GPU's life"),
    "max_retired_pages": (_INT, False, "retired pages (pre-Ampere) before an RMA"),
    "temp_warn_c": (_NUM, False, "GPU temperature that gives a warning"),
    "temp_fail_c": (_NUM, False, "GPU temperature that fails the node"),
    "min_slowdown_margin_c": (_NUM, False, "required headroom to the GPU's slowdown point"),
    "max_power_over_limit_pct": (_NUM, False, "power draw tolerated above the enforced limit"),
    "min_power_limit_w": (_NUM, True, "enforced power limit below this means a capped GPU"),
    "pcie_gen_expected": (_INT, True, "PCIe generation the link must reach"),
    "pcie_width_expected": (_INT, True, "PCIe lanes the link must have"),
    "nvlink_links_expected": (_INT, True, "NVLink links that must be up (0: none)"),
    "expect_idle": ((bool,), False, "the node must run no compute processes"),
    "max_idle_memory_used_mib": (_NUM, False, "GPU memory in use tolerated on an idle node"),
    # fabric family (checks/fabric.py): EFA on AWS, InfiniBand elsewhere. Counts are integers.
    "fabric": ((str,), False, "the node's RDMA fabric: none, efa or infiniband"),
    "efa_devices_expected": (_INT, True, "EFA devices (efa driver, fi_info RDM domains)"),
    "fi_info_timeout_s": (_NUM, False, "how long the probe waits for fi_info"),
    "ib_ports_expected": (_INT, True, "InfiniBand ports (Ethernet and bonds not counted)"),
    "ib_devices": ((list,), True, "RDMA devices the IB checks judge (null: all IB ports)"),
    "ib_min_rate_gbps": (_NUM, True, "lowest IB port rate (null: the fastest port's rate)"),
    "ib_max_link_downed": (_INT, True, "link_downed count per IB port (null: not judged)"),
    "ib_max_symbol_error": (_INT, True, "symbol_error count per IB port (null: not judged)"),
    "ib_max_port_rcv_errors": (_INT, True, "port_rcv_errors count per IB port"),
    "ib_max_local_link_integrity_errors": (_INT, True, "local_link_integrity_errors per port"),
    "ib_max_excessive_buffer_overrun_errors": (_INT, True, "excessive_buffer_overrun per port"),
    # system family (checks/system.py): NUMA layout, host resources, memlock, modules, services.
    # Sizes in _gb are GiB (2^30 bytes), as `df -h` and `free -g` print them.
    "numa_nodes_expected": (_INT, True, "NUMA nodes the kernel shows (null: not asserted)"),
    "gpus_even_over_numa_nodes": ((bool,), False, "GPUs split evenly over NUMA nodes with CPUs"),
    "min_cpus": (_INT, True, "online logical CPUs the node must have"),
    "min_memory_gb": (_NUM, True, "MemTotal the node must have"),
    "min_memory_available_pct": (_NUM, True, "MemAvailable as a share of MemTotal"),
    "min_root_free_gb": (_NUM, True, "free space on / (for non-root users, like df Avail)"),
    "scratch_paths": ((list,), True, "local scratch directories whose free space is checked"),
    "min_scratch_free_gb": (_NUM, True, "free space each scratch path must have"),
    "min_memlock_kb": (_INT, True, "memlock limit floor (null: unlimited for efa/infiniband)"),
    "require_nvidia_peermem": ((bool,), True, "null: when fabric is infiniband or efa"),
    "requires_fabric_manager": ((bool,), False, "NVSwitch baseboard: fabric manager must run"),
    "dcgm_installed": ((bool,), False, "nvidia-dcgm is installed on the node and must run"),
    "gpud_installed": ((bool,), False, "gpud is installed on the node and must run"),
    # storage family (checks/storage.py): paths jobs read/write, network mounts, Lustre health.
    # Sizes in _gb are GiB (2^30 bytes), as `df -h` prints them.
    "storage_paths": ((list,), True, "absolute paths, or {path, writable, min_free_gb} maps"),
    "storage_timeout_s": (_NUM, False, "per-path and per-mount timeout of the storage probe"),
    "storage_mount_types": ((list,), True, "fstype globs checked besides lustre, nfs, nfs4"),
    "storage_min_free_gb": (_NUM, True, "free space every storage path must have"),
    # kernel family (checks/kernel.py, checks/memory.py): XIDs, SXIDs, fabric manager log;
    # GPU memory reclaim (reuses max_idle_memory_used_mib as the threshold).
    "xid_window_h": (_NUM, False, "hours of kernel log the XID checks judge (0: since boot)"),
    "reclaim_wait_s": (_NUM, False, "how long the probe waits for GPU memory to be freed"),
    "reclaim_poll_s": (_NUM, False, "how often it polls GPU memory while waiting"),
    # active families (checks/nccl.py, checks/dcgm.py, checks/gpud.py; gpuhealth/active/):
    # load tests at --level standard|full, GPUd from the probe. Bandwidths in GB/s (busbw).
    "nccl_tests_dir": ((str,), False, "directory of the nccl-tests binaries (all_reduce_perf)"),
    "nccl_sizes": ((str,), False, "nccl-tests size arguments, e.g. '-b 8 -e 16G -f 2'"),
    "nccl_reference_size_bytes": (_INT, False, "busbw is judged at message sizes >= this"),
    "nccl_allreduce_min_busbw_gbps": (_NUM, True, "single-node all_reduce busbw (NVLink)"),
    "nccl_internode_min_busbw_gbps": (_NUM, True, "multi-node all_reduce busbw (the network)"),
    "nccl_timeout_s": (_NUM, False, "each nccl-tests launch is killed after this"),
    "nccl_launcher": ((str,), False, "multi-node launcher: mpirun (or its path) or srun"),
    "nccl_launcher_args": ((str,), False, "extra launcher options (-x VAR, --mca, --mpi=pmix)"),
    "dcgm_diag_level": (_INT, True, "dcgmi diag -r level (null: 2 at standard, 3 at full)"),
    "dcgm_diag_timeout_s": (_NUM, True, "dcgmi diag timeout (null: by level, 120 s to 6 h)"),
    "gpud_address": ((str,), False, "GPUd API on the node: host:port (https) or http://..."),
}

# Keys that describe a profile itself; inventory vars cannot override them.
_PROFILE_ONLY = {"description", "extends", "match"}


@dataclass(frozen=True)
class Profile:
    """A resolved profile: its name and every key of PROFILE_KEYS with a value."""

    name: str
    limits: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.limits[key]


def _check_key(where: str, key: str, value: Any) -> None:
    if key not in PROFILE_KEYS:
        hint = difflib.get_close_matches(key, PROFILE_KEYS, n=1)
        more = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ConfigError(f"{where}: unknown key {key!r}{more}")
    types, nullable, _ = PROFILE_KEYS[key]
    if value is None:
        if not nullable:
            raise ConfigError(f"{where}: key {key!r} may not be null")
        return
    if isinstance(value, bool) and bool not in types:
        raise ConfigError(f"{where}: key {key!r} must be {types[0].__name__}, got {value!r}")
    if key == "min_driver_version" and isinstance(value, int):
        return
    if not isinstance(value, types):
        names = " or ".join(t.__name__ for t in types)
        raise ConfigError(f"{where}: key {key!r} must be {names}, got {value!r}")
    if key == "fabric" and value not in ("none", "efa", "infiniband"):
        raise ConfigError(f"{where}: key 'fabric' must be none, efa or infiniband, got {value!r}")
    if key == "match":
        for pattern in value:
            try:
                re.compile(str(pattern))
            except re.error as exc:
                raise ConfigError(f"{where}: key 'match': bad pattern {pattern!r}: {exc}") from exc
    if key.startswith("storage_"):
        _check_storage(where, key, value)


def _check_storage(where: str, key: str, value: Any) -> None:
    """Storage keys beyond their type: absolute paths, known entry keys, positive numbers."""
    if key == "storage_timeout_s" and value <= 0:
        raise ConfigError(f"{where}: key {key!r} must be > 0, got {value!r}")
    if key == "storage_min_free_gb" and value < 0:
        raise ConfigError(f"{where}: key {key!r} must be >= 0, got {value!r}")
    if key == "storage_mount_types":
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise ConfigError(f"{where}: {key}[{i}]: {item!r} is not a filesystem type")
    if key != "storage_paths":
        return
    for i, item in enumerate(value):
        entry = item if isinstance(item, dict) else {"path": item}
        path = entry.get("path")
        unknown = sorted(set(entry) - {"path", "writable", "min_free_gb"})
        free = entry.get("min_free_gb")
        if unknown:
            problem = f"unknown key {unknown[0]!r} (known: path, writable, min_free_gb)"
        elif not isinstance(path, str):
            problem = f"{item!r} is neither a path nor a mapping with a 'path'"
        elif not path.startswith("/"):
            problem = f"{path!r} is not an absolute path"
        elif not isinstance(entry.get("writable", False), bool):
            problem = f"writable must be true or false, got {entry['writable']!r}"
        elif free is not None and (
            isinstance(free, bool) or not isinstance(free, _NUM) or free < 0
        ):
            problem = f"min_free_gb must be a number >= 0, got {free!r}"
        else:
            continue
        raise ConfigError(f"{where}: storage_paths[{i}]: {problem}")


class ProfileSet:
    """All profiles known to a run: the packaged ones plus an optional user directory."""

    def __init__(self, extra_dir: Path | None = None) -> None:
        self._raw: dict[str, tuple[str, dict[str, Any]]] = {}
        packaged = resources.files("gpuhealth") / "profiles"
        for entry in sorted(packaged.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".yml"):
                self._add(f"gpuhealth/profiles/{entry.name}", entry.read_text())
        if extra_dir is not None:
            if not extra_dir.is_dir():
                raise ConfigError(f"{extra_dir}: profile directory does not exist")
            for path in sorted(extra_dir.glob("*.yml")):
                self._add(str(path), path.read_text())
        self._resolved: dict[str, Profile] = {}
        for name in self._raw:
            self.get(name)

    def _add(self, where: str, text: str) -> None:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: a profile must be a mapping of keys to limits")
        for key, value in data.items():
            _check_key(where, str(key), value)
        name = Path(where).stem
        self._raw[name] = (where, data)

    @property
    def names(self) -> list[str]:
        """Known profile names, sorted."""
        return sorted(self._raw)

    def get(self, name: str, _chain: tuple[str, ...] = ()) -> Profile:
        """Resolve a profile through its `extends` chain; unknown names are a ConfigError."""
        if name in self._resolved:
            return self._resolved[name]
        if name not in self._raw:
            raise ConfigError(f"unknown profile {name!r}; known profiles: {', '.join(self.names)}")
        if name in _chain:
            raise ConfigError(f"profile {name!r}: 'extends' loops through {' -> '.join(_chain)}")
        where, data = self._raw[name]
        parent = data.get("extends")
        if parent is None and name != "default":
            parent = "default"
        limits: dict[str, Any] = {}
        if parent is not None:
            if parent not in self._raw:
                raise ConfigError(f"{where}: extends unknown profile {parent!r}")
            limits.update(self.get(parent, (*_chain, name)).limits)
            limits["match"] = None
        limits.update(data)
        missing = [k for k in PROFILE_KEYS if k not in limits and k != "extends"]
        if missing:
            raise ConfigError(f"{where}: missing keys {', '.join(missing)}")
        limits["min_driver_version"] = str(limits["min_driver_version"])
        profile = Profile(name, limits)
        self._resolved[name] = profile
        return profile

    def match(self, product_name: str | None) -> Profile:
        """The profile whose `match` patterns fit the GPU product name, else `default`."""
        if product_name:
            for name in self.names:
                patterns = self._raw[name][1].get("match") or []
                if any(re.search(str(p), product_name) for p in patterns):
                    return self.get(name)
        return self.get("default")


@dataclass(frozen=True)
class Expectations:
    """What the inventory says about one host, validated."""

    profile_name: str | None
    gpu_count: int | None
    overrides: dict[str, Any]


def expectations_from_vars(
    host: str, host_vars: dict[str, Any], profiles: ProfileSet
) -> Expectations:
    """Read and validate the gpuhealth inventory vars of one host.

    `gpu_profile` names the profile; every profile key set as an inventory var (group_vars,
    host_vars) overrides it, so expected state (`gpu_count`, `fabric`, `storage_paths`) and
    thresholds live in one vocabulary. `nvidia_driver_branch` is shared with the nvidia_driver
    role, so the branch a role installs is the branch the driver gate expects.
    """
    where = f"inventory host {host}"
    profile_name = host_vars.get("gpu_profile")
    if profile_name is not None:
        if not isinstance(profile_name, str):
            raise ConfigError(f"{where}: gpu_profile must be a string, got {profile_name!r}")
        try:
            profiles.get(profile_name)
        except ConfigError as exc:
            raise ConfigError(f"{where}: gpu_profile: {exc}") from exc
    gpu_count = host_vars.get("gpu_count")
    if gpu_count is not None and (
        isinstance(gpu_count, bool) or not isinstance(gpu_count, int) or gpu_count < 0
    ):
        raise ConfigError(f"{where}: gpu_count must be a whole number >= 0, got {gpu_count!r}")
    overrides: dict[str, Any] = {}
    for key, value in host_vars.items():
        if key in PROFILE_KEYS and key not in _PROFILE_ONLY and key != "gpu_count":
            _check_key(where, key, value)
            overrides[key] = value
        elif key not in PROFILE_KEYS:
            _reject_near_miss(where, str(key))
    branch = host_vars.get("nvidia_driver_branch")
    if branch is not None:
        if not re.fullmatch(r"\d+(\.\d+)*", str(branch)):
            raise ConfigError(f"{where}: nvidia_driver_branch must look like '570', got {branch!r}")
        overrides.setdefault("min_driver_version", str(branch))
    return Expectations(profile_name, gpu_count, overrides)


def _reject_near_miss(where: str, key: str) -> None:
    """An inventory var one typo away from a profile key would silently do nothing: refuse it."""
    hint = difflib.get_close_matches(key, PROFILE_KEYS, n=1, cutoff=0.88)
    if hint:
        raise ConfigError(f"{where}: unknown var {key!r} (did you mean {hint[0]!r}?)")


def resolve_limits(
    expectations: Expectations, profiles: ProfileSet, product_name: str | None
) -> Profile:
    """The limits for a host: the named profile (or the one matching its GPUs) plus overrides."""
    if expectations.profile_name:
        base = profiles.get(expectations.profile_name)
    else:
        base = profiles.match(product_name)
    limits = dict(base.limits)
    limits.update(expectations.overrides)
    if expectations.gpu_count is not None:
        limits["gpu_count"] = expectations.gpu_count
    limits["min_driver_version"] = str(limits["min_driver_version"])
    return Profile(base.name, limits)
