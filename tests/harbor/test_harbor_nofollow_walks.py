"""The host's walks of a sandbox tree (removal, the owner and mode reset, copies out) are iterative
and capped: any tree a sandbox leaves is walked or refused with SandboxTreeError, never
RecursionError, and never through a link."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl360_ext.harbor.envs import nofollow

DEEP = 3000  # deeper than Python's recursion limit

# A tree: a dict of name -> bytes (a file), None (a link to the canary) or another tree.
names = st.text(alphabet="abcdef", min_size=1, max_size=3)
trees = st.recursive(
    st.dictionaries(names, st.one_of(st.binary(max_size=16), st.none()), max_size=4),
    lambda children: st.dictionaries(names, children, max_size=4),
    max_leaves=30,
)


def _build(root: Path, tree: dict[str, Any], canary: Path) -> None:
    root.mkdir(exist_ok=True)
    for name, node in tree.items():
        if isinstance(node, dict):
            _build(root / name, node, canary)
        elif node is None:
            (root / name).symlink_to(canary)
        else:
            (root / name).write_bytes(node)


def _chain(root: Path, depth: int, mode: int = 0o755) -> None:
    """`depth` nested directories `d` under `root`, each of mode `mode`, a file at the bottom
    (built through descriptors: the path would be too long for the kernel)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    for _ in range(depth):
        parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = parent
        os.chmod("d", mode, dir_fd=fd)
    os.close(fd)


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[Path]:
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret.txt").write_text("host secret")
    yield host
    assert (host / "secret.txt").read_text() == "host secret" and os.listdir(host) == ["secret.txt"]
    assert stat.S_IMODE(os.stat(host).st_mode) == 0o755 or os.stat(host).st_uid == 0


def _entries(root: Path) -> list[tuple[str, str]]:
    found = []
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
            found.append((str(path.relative_to(root)), kind))
    return sorted(found)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=trees)
def test_a_walk_visits_every_entry_once_and_follows_no_link(
    tmp_path_factory: pytest.TempPathFactory, tree: dict[str, Any]
) -> None:
    base = tmp_path_factory.mktemp("walk")
    canary = base / "canary"
    canary.mkdir()
    _build(base / "tree", tree, canary)
    seen: list[str] = []
    opened: list[str] = []
    left: list[str] = []
    with nofollow.opened_dir(base / "tree") as fd:
        count = nofollow.walk(
            fd,
            on_file=lambda parent, name, info: seen.append(name),
            on_dir=lambda child: opened.append(str(os.fstat(child).st_ino)),
            on_leave=lambda parent, name: left.append(name),
        )
    entries = _entries(base / "tree")
    assert count == len(entries)
    assert sorted(seen) == sorted(Path(p).name for p, kind in entries if kind != "dir")
    assert len(opened) == len(left) == sum(kind == "dir" for _, kind in entries)
    assert os.listdir(canary) == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=trees)
def test_removal_and_reset_cover_any_tree_and_leave_link_targets_alone(
    tmp_path_factory: pytest.TempPathFactory, tree: dict[str, Any]
) -> None:
    base = tmp_path_factory.mktemp("tree")
    canary = base / "canary"
    canary.mkdir()
    (canary / "kept").write_text("kept")
    os.chmod(canary, 0o700)
    _build(base / "tree", tree, canary)
    for path in sorted((base / "tree").rglob("*"), key=lambda p: -len(p.parts)):
        if not path.is_symlink():
            os.chmod(path, 0)
    with nofollow.opened_dir(base / "tree") as fd:
        nofollow.reset_tree(fd, (os.getuid(), os.getgid()))
    for path in (base / "tree").rglob("*"):
        if not path.is_symlink():
            bits = 0o700 if path.is_dir() else 0o600
            assert stat.S_IMODE(os.lstat(path).st_mode) & bits == bits, path
    assert stat.S_IMODE(os.stat(canary).st_mode) == 0o700  # a link's target is never touched
    with nofollow.opened_dir(base) as fd:
        nofollow.remove_entry(fd, "tree")
    assert not (base / "tree").exists() and (canary / "kept").read_text() == "kept"


def test_a_chain_deeper_than_the_recursion_limit_is_reset_copied_and_removed(tmp_path: Path) -> None:
    root = tmp_path / "deep"
    root.mkdir()
    _chain(root, DEEP, mode=0)
    with nofollow.opened_dir(root) as fd:
        assert nofollow.reset_tree(fd, (os.getuid(), os.getgid())) == DEEP + 1
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(DEEP):  # every level is u+rwx again, all the way down
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        assert stat.S_IMODE(os.fstat(child).st_mode) & 0o700 == 0o700
        os.close(fd)
        fd = child
    os.close(fd)
    budget = nofollow.CopyBudget()
    with nofollow.opened_dir(root) as fd:
        nofollow.copy_tree_out(fd, tmp_path / "out", budget)
    assert budget.skipped == [f"{'/'.join(['d'] * (budget.max_depth + 1))}/ (deeper than {budget.max_depth})"]
    with nofollow.opened_dir(tmp_path) as fd:
        nofollow.remove_entry(fd, "deep")
    assert not root.exists()


def test_a_walk_past_its_caps_is_refused_with_a_sandbox_tree_error(tmp_path: Path) -> None:
    root = tmp_path / "wide"
    root.mkdir()
    _chain(root, 50)
    for index in range(20):
        (root / f"f{index}").write_text("x")
    with nofollow.opened_dir(root) as fd:
        assert nofollow.walk(fd) == 71
        with pytest.raises(nofollow.SandboxTreeError, match="more entries"):
            nofollow.walk(fd, max_entries=70)
        with pytest.raises(nofollow.SandboxTreeError, match="more entries"):
            nofollow.walk(fd, max_entries=10)  # the first listing alone is over
        with pytest.raises(nofollow.SandboxTreeError, match="deeper"):
            nofollow.walk(fd, max_depth=49)
        assert nofollow.walk(fd, max_depth=50) == 71
    with nofollow.opened_dir(tmp_path) as fd:
        with pytest.raises(nofollow.SandboxTreeError):
            nofollow.remove_entry(fd, "wide", max_entries=30)
        nofollow.remove_entry(fd, "wide")


def test_a_walk_opens_two_descriptors_whatever_the_depth(tmp_path: Path) -> None:
    root = tmp_path / "deep"
    root.mkdir()
    _chain(root, 500)
    most = 0

    def count(_: int) -> None:
        nonlocal most
        most = max(most, len(os.listdir("/proc/self/fd")))

    before = len(os.listdir("/proc/self/fd"))
    with nofollow.opened_dir(root) as fd:
        nofollow.walk(fd, on_dir=count)
    assert most - before <= 3  # the root's, the walk's own and listdir's
    with nofollow.opened_dir(tmp_path) as fd:
        nofollow.remove_entry(fd, "deep")  # pytest's own cleanup is recursive
