"""The stack's base image: a Debian root file system, imported once, served under library names.

No image comes from Docker Hub here. `build_rootfs` runs Debian's `debootstrap --variant=minbase`
with the packages tasks run (`PACKAGES`) from the Debian mirror this machine's apt already uses
(read from its sources, never a hard-coded host), and packs it as a tarball in the stack's image
cache, named by the recipe's hash; its sha256 is the digest recorded beside it. `ensure_base`
imports that tarball into the engine and pushes it to the loopback registry under every name in
`LIBRARY_NAMES` (`library/python:3.12-slim`, ...), so a task's `FROM python:3.12-slim` resolves
through the engine's registry mirror. A second `up` finds the tarball (no debootstrap), and a
registry that already holds the digest (no push).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from rl360_ext.containers.engine import docker
from rl360_ext.util.prereqs import Unavailable

SUITE = "bookworm"
PACKAGES = ("python3", "git", "procps")
# The names a task's FROM may use; each resolves to the base image through the registry mirror.
LIBRARY_NAMES = (
    "python:3.12-slim",
    "python:3.12",
    "python:3.11-slim",
    "debian:bookworm-slim",
    "debian:bookworm",
)
# Left out of the tarball: package caches, documentation and locales (about 100 MB).
_EXCLUDES = (
    "./var/cache/apt/archives/*.deb",
    "./var/lib/apt/lists/*",
    "./usr/share/doc/*",
    "./usr/share/man/*",
    "./usr/share/locale/*",
)
_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))


def recipe_key(suite: str = SUITE, packages: tuple[str, ...] = PACKAGES) -> str:
    """The cache name of a base image: a hash of what goes into it."""
    text = f"debootstrap minbase {suite} {','.join(sorted(packages))}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def debian_mirror(sources: tuple[Path, ...] = _SOURCES) -> str:
    """The first Debian archive URI in apt's sources (deb822 `URIs:` or one-line `deb URI`)."""
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("#"):
                continue
            match = re.match(r"^URIs:\s*(\S+)", line) or re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", line)
            if match and not match.group(1).rstrip("/").endswith("-security"):
                return match.group(1)
    raise Unavailable(
        "no Debian archive in apt's sources (/etc/apt/sources.list.d/debian.sources): debootstrap needs one"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def build_rootfs(cache: Path, say: Callable[[str], None]) -> tuple[Path, str]:
    """The base tarball in `cache` and its digest, made with debootstrap unless cached."""
    key = recipe_key()
    tarball, digest_file = cache / f"{key}.tar", cache / f"{key}.digest"
    if tarball.is_file() and digest_file.is_file():
        return tarball, digest_file.read_text().strip()
    if shutil.which("debootstrap") is None:
        raise Unavailable("no debootstrap (it makes the base image): apt-get install debootstrap")
    cache.mkdir(parents=True, exist_ok=True)
    mirror = debian_mirror()
    say(f"building the base image: debootstrap {SUITE} with {', '.join(PACKAGES)} (about a minute)")
    with tempfile.TemporaryDirectory(dir=cache, prefix="rootfs-") as scratch:
        rootfs = Path(scratch) / "root"
        done = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(rootfs),
                mirror,
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"debootstrap failed ({done.returncode}): {(done.stdout + done.stderr)[-800:]}"
            )
        partial = tarball.with_suffix(".partial")
        excludes = [f"--exclude={pattern}" for pattern in _EXCLUDES]
        subprocess.run(
            ["tar", "-C", str(rootfs), *excludes, "-cf", str(partial), "."], check=True, timeout=600
        )
    digest = _sha256(partial)
    partial.replace(tarball)
    digest_file.write_text(digest + "\n")
    return tarball, digest


def ensure_base(host: str, registry: str, cache: Path, say: Callable[[str], None]) -> dict[str, str]:
    """Import the base tarball (unless the engine has it) and push it under `LIBRARY_NAMES` to
    `registry` (`127.0.0.1:PORT`); the image id each library name resolves to."""
    tarball, digest = build_rootfs(cache, say)
    local = f"rl360-base:{digest.removeprefix('sha256:')[:16]}"
    image_id = docker(host, "image", "ls", "--quiet", "--no-trunc", local).strip()
    if not image_id:
        say(f"importing the base image {local}")
        image_id = docker(host, "import", str(tarball), local, timeout_s=600).strip()
    pushed: dict[str, str] = {}
    for name in LIBRARY_NAMES:
        remote = f"{registry}/library/{name}"
        docker(host, "tag", local, remote)
        docker(host, "push", remote, timeout_s=600)
        docker(host, "rmi", remote)
        pushed[name] = image_id
    return pushed
