"""Build .deb packages and a flat apt repository for the test bed's local mirror.

Nodes have no route out, so everything they install comes from here. Stand-in
packages (fake libnvidia-ml, nvidia-smi, dcgmi, nccl-tests ...) are one
``build_deb`` call each; ``build_repo`` then (re)indexes the directory.
"""

from __future__ import annotations

import email.utils
import gzip
import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

EXEC_DIRS = ("bin/", "sbin/", "libexec/")


def _is_executable(path: str, data: bytes) -> bool:
    """Scripts, ELF files and anything in a bin dir get mode 0755."""
    return data.startswith((b"#!", b"\x7fELF")) or any(d in path for d in EXEC_DIRS)


def build_deb(
    out_dir: Path | str,
    name: str,
    version: str,
    files: Mapping[str, bytes | Path],
    depends: Iterable[str] = (),
    description: str = "gpuhealth test bed stand-in package",
    scripts: Mapping[str, str] | None = None,
    arch: str = "all",
    provides: Iterable[str] = (),
    symlinks: Mapping[str, str] | None = None,
    control: Mapping[str, str] | None = None,
) -> Path:
    """Build NAME_VERSION_ARCH.deb in out_dir with a real control file; return its path.

    ``files`` maps absolute install paths to contents (bytes, or a Path to copy);
    ``symlinks`` maps absolute install paths to link targets (libfoo.so.1 -> libfoo.so.1.2);
    ``scripts`` maps maintainer script names (postinst, prerm ...) to their text;
    ``control`` adds control fields (Conflicts, Replaces, Homepage ...).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"deb-{name}-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # the "./" entry: dpkg must not see a 0700 tempdir as the root
        size = 0
        for inst_path, content in files.items():
            data = content.read_bytes() if isinstance(content, Path) else content
            target = root / inst_path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o755 if _is_executable(inst_path, data) else 0o644)
            size += len(data)
        for inst_path, link_target in (symlinks or {}).items():
            link = root / inst_path.lstrip("/")
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(link_target)
        fields = {
            "Package": name,
            "Version": version,
            "Architecture": arch,
            "Maintainer": "gpuhealth test bed <testbed@invalid>",
            "Installed-Size": str(max(1, size // 1024)),
            "Depends": ", ".join(depends),
            "Provides": ", ".join(provides),
            "Section": "misc",
            "Priority": "optional",
            "Description": description,
            **(control or {}),
        }
        debian = root / "DEBIAN"
        debian.mkdir()
        text = "".join(f"{k}: {v}\n" for k, v in fields.items() if v)
        (debian / "control").write_text(text)
        for script, body in (scripts or {}).items():
            (debian / script).write_text(body)
            (debian / script).chmod(0o755)
        # As dpkg names files: without the epoch ("1:4.2.3-1" -> "4.2.3-1").
        deb = out_dir / f"{name}_{version.split(':', 1)[-1]}_{arch}.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)],
            check=True,
            capture_output=True,
        )
    return deb


def build_repo(repo_dir: Path | str, debs: Iterable[Path | str] = ()) -> Path:
    """Copy debs into repo_dir and write Packages, Packages.gz and Release (flat repo "./")."""
    repo = Path(repo_dir)
    repo.mkdir(parents=True, exist_ok=True)
    for deb in map(Path, debs):
        if deb.resolve().parent != repo.resolve():
            shutil.copy2(deb, repo / deb.name)
    packages = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", ".", "/dev/null"],
        cwd=repo,
        check=True,
        capture_output=True,
    ).stdout
    (repo / "Packages").write_bytes(packages)
    (repo / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    indexes = {n: (repo / n).read_bytes() for n in ("Packages", "Packages.gz")}
    release = [
        "Origin: gpuhealth-testbed",
        "Label: gpuhealth-testbed",
        f"Date: {email.utils.formatdate(usegmt=True)}",
        "Architectures: all amd64 arm64",
    ]
    for field, algo in (("MD5Sum", hashlib.md5), ("SHA256", hashlib.sha256)):
        release.append(f"{field}:")
        release += [f" {algo(d).hexdigest()} {len(d)} {n}" for n, d in indexes.items()]
    (repo / "Release").write_text("\n".join(release) + "\n")
    return repo


FILES_DIR = "files"  # release tarballs next to the apt repo, as <mirror>/files/NAME


def add_files(repo_dir: Path | str, files: Iterable[Path | str]) -> list[str]:
    """Copy files into <repo>/files/ with a NAME.sha256 each (`sha256sum` format, which
    `sha256sum -c` and Ansible's get_url `checksum: sha256:<url>` read); their names."""
    folder = Path(repo_dir) / FILES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for source in map(Path, files):
        data = source.read_bytes()
        (folder / source.name).write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        (folder / f"{source.name}.sha256").write_text(f"{digest}  {source.name}\n")
        names.append(source.name)
    return names


def download_debian_debs(names: Iterable[str], dest: Path | str) -> list[Path]:
    """Fetch real Debian .debs with the host's apt (cached: only missing names are fetched)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    missing = [n for n in names if not list(dest.glob(f"{n}_*.deb"))]
    if missing:
        cmd = ["apt-get", "download", *missing]
        if subprocess.run(cmd, cwd=dest, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update"], check=True, capture_output=True)
            subprocess.run(cmd, cwd=dest, check=True, capture_output=True)
    return sorted(p for n in names for p in dest.glob(f"{n}_*.deb"))


# Real Debian packages every bed mirror carries; stand-ins are added by later work.
DEBIAN_PACKAGES = ("numactl", "libnuma1")


def default_debs(cache_dir: Path | str) -> list[Path]:
    """All packages a fresh bed mirror should contain."""
    return download_debian_debs(DEBIAN_PACKAGES, Path(cache_dir) / "debs")
