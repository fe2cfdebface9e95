"""Running the docker CLI against one engine, the labels rl360 puts on what it starts, and cleanup.

Owns the labels on a trial's container and built image (`OWNER_LABEL`: the owning server's
`pid.starttime`, `TRIAL_LABEL`: the trial's session id; Compose adds its project label, also on the
project's networks and volumes), the choice of what a server that is gone left behind (`stale`,
pure: containers whose owner no longer runs, and the Compose projects of its containers and images),
and removing it (`remove_stale`: containers, then the projects' networks, volumes and images).
Every call names the engine (`--host`), so nothing here depends on the caller's DOCKER_HOST.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from rl360_ext.util.prereqs import Unavailable

OWNER_LABEL = "rl360.owner"
TRIAL_LABEL = "rl360.trial"
PROJECT_LABEL = "com.docker.compose.project"
_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Labelled:
    """A container or image with rl360's owner label: its id, owner tag, Compose project ("" if
    none) and whether it is an image (a trial's build, left where its server died before `up`)."""

    id: str
    owner: str
    project: str
    image: bool = False


@dataclass(frozen=True)
class Stale:
    """What to remove: containers by id, and the Compose projects whose networks, volumes and
    images go with them."""

    containers: tuple[str, ...]
    projects: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.containers or self.projects)


def stale(rows: Iterable[Labelled], alive: Callable[[str], bool]) -> Stale:
    """The containers whose owner is gone (`alive(owner)` false), and the projects of those
    containers and images. A project with a container or image of a live owner is never selected,
    even if a dead owner's shares it."""
    rows = list(rows)
    live_projects = {row.project for row in rows if row.project and alive(row.owner)}
    dead = [row for row in rows if not alive(row.owner)]
    projects = sorted({row.project for row in dead if row.project and row.project not in live_projects})
    return Stale(tuple(sorted({row.id for row in dead if not row.image})), tuple(projects))


def docker_executable() -> str:
    """The docker CLI, or Unavailable with the package to install."""
    found = shutil.which("docker")
    if found is None:
        raise Unavailable("no docker CLI on PATH: apt-get install docker.io")
    return found


def docker(host: str, *args: str, timeout_s: float = _TIMEOUT_S, check: bool = True) -> str:
    """Run `docker --host HOST ARGS...`; its stdout. A failure raises RuntimeError with stderr."""
    done = subprocess.run(
        [docker_executable(), "--host", host, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if check and done.returncode != 0:
        raise RuntimeError(
            f"docker {' '.join(args[:3])} failed ({done.returncode}): {done.stderr.strip()[-500:]}"
        )
    return done.stdout


def labelled(host: str) -> list[Labelled]:
    """Every container (running or not) and every image with rl360's owner label."""
    by_label = ("--filter", f"label={OWNER_LABEL}", "--no-trunc")
    labels = f'{{{{index .Config.Labels "{OWNER_LABEL}"}}}}\t{{{{index .Config.Labels "{PROJECT_LABEL}"}}}}'
    rows = []
    for image, listing in ((False, ("ps", "--all", "--quiet")), (True, ("image", "ls", "--quiet"))):
        ids = sorted(set(docker(host, *listing, *by_label).split()))
        if not ids:
            continue
        kind = "image" if image else "container"
        out = docker(host, kind, "inspect", "--format", f"{{{{.Id}}}}\t{labels}", *ids, check=False)
        for line in out.splitlines():
            parts = line.split("\t")
            if len(parts) == 3 and parts[0]:
                rows.append(Labelled(*parts, image=image))
    return rows


def _ids(host: str, kind: str, label: str) -> list[str]:
    listing = {"network": ("network", "ls"), "volume": ("volume", "ls"), "image": ("image", "ls")}[kind]
    return docker(host, *listing, "--quiet", "--filter", f"label={label}").split()


def remove(host: str, containers: Sequence[str], projects: Sequence[str]) -> list[str]:
    """Remove `containers`, then every network, volume and image labelled with one of `projects`
    (Compose labels a trial's built image with its project too); what was removed, as `kind:id`."""
    removed: list[str] = []
    if containers:
        docker(host, "rm", "--force", "--volumes", *containers, check=False)
        removed += [f"container:{cid[:12]}" for cid in containers]
    labels = [f"{PROJECT_LABEL}={project}" for project in projects]
    for kind in ("network", "volume", "image"):
        for label in labels:
            ids = _ids(host, kind, label)
            if ids:
                verb = {
                    "network": ("network", "rm"),
                    "volume": ("volume", "rm", "--force"),
                    "image": ("rmi", "--force"),
                }
                docker(host, *verb[kind], *ids, check=False)
                removed += [f"{kind}:{i[:19]}" for i in ids]
    return removed


def remove_stale(host: str, alive: Callable[[str], bool]) -> list[str]:
    """Remove what servers that are gone left on the engine at `host` (see `stale`)."""
    selected = stale(labelled(host), alive)
    return remove(host, selected.containers, selected.projects) if selected else []


def counts(host: str) -> dict[str, int]:
    """How many containers, networks (besides the engine's own three) and volumes the engine holds."""
    containers = docker(host, "ps", "--all", "--quiet").split()
    networks = [
        n
        for n in docker(host, "network", "ls", "--format", "{{.Name}}").split()
        if n not in {"bridge", "host", "none"}
    ]
    volumes = docker(host, "volume", "ls", "--quiet").split()
    return {"containers": len(containers), "networks": len(networks), "volumes": len(volumes)}
