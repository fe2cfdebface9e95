"""Host-side file access under sandbox-writable directories never follows what the sandbox planted."""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl360_ext.harbor.envs import nofollow


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret.txt").write_text("host secret")
    return host


def sandbox(tmp_path: Path) -> Path:
    root = tmp_path / "sandbox"
    root.mkdir()
    return root


def test_a_planted_link_is_replaced_not_written_through(tmp_path: Path, canary: Path) -> None:
    root = sandbox(tmp_path)
    (root / "exit-code.txt").symlink_to(canary / "secret.txt")
    (root / "sub").symlink_to(canary)
    with nofollow.opened_dir(root) as fd:
        nofollow.write_bytes(fd, "exit-code.txt", b"3")
    with nofollow.opened_dir(root, PurePosixPath("sub/deeper"), create=True) as fd:
        nofollow.write_bytes(fd, "x", b"y")
    assert (canary / "secret.txt").read_text() == "host secret" and sorted(os.listdir(canary)) == [
        "secret.txt"
    ]
    assert (root / "exit-code.txt").read_text() == "3" and not (root / "exit-code.txt").is_symlink()
    assert (root / "sub" / "deeper" / "x").read_text() == "y" and not (root / "sub").is_symlink()


def test_reads_refuse_links_special_files_and_oversized_files(tmp_path: Path, canary: Path) -> None:
    root = sandbox(tmp_path)
    (root / "reward.json").symlink_to(canary / "secret.txt")
    os.mkfifo(root / "fifo")
    (root / "big").write_bytes(b"1" * 101)
    (root / "ok").write_bytes(b"1" * 100)
    with pytest.raises(nofollow.UnsafePath):
        nofollow.read_regular(root / "reward.json", 1000)
    with pytest.raises(nofollow.UnsafePath):
        nofollow.read_regular(root / "fifo", 1000)  # would block forever if opened for reading
    with pytest.raises(nofollow.TooLarge):
        nofollow.read_regular(root / "big", 100)
    assert nofollow.read_regular(root / "ok", 100) == b"1" * 100
    with nofollow.opened_dir(root) as fd, pytest.raises(nofollow.UnsafePath):
        nofollow.copy_file_out(fd, "reward.json", tmp_path / "out.json", 1000)
    with pytest.raises(nofollow.UnsafePath):
        nofollow.open_dir(root, PurePosixPath("reward.json"))


def test_a_copy_in_skips_links_in_the_source(tmp_path: Path, canary: Path) -> None:
    source = tmp_path / "task-app"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "a.py").write_text("a")
    (source / "leak").symlink_to(canary / "secret.txt")
    (source / "leakdir").symlink_to(canary)
    root = sandbox(tmp_path)
    with nofollow.opened_dir(root) as fd:
        nofollow.copy_tree_in(source, fd, owner=(os.getuid(), os.getgid()))
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == ["pkg", "pkg/a.py"]


names = st.sampled_from(["a", "b", "c", "reward.txt", "d.json"])
kinds = st.sampled_from(["file", "dir", "link-file", "link-dir", "fifo", "big"])
trees = st.lists(st.tuples(st.lists(names, min_size=1, max_size=3), kinds), max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=trees)
def test_a_copy_out_holds_exactly_the_regular_files_under_the_caps(
    tmp_path_factory: pytest.TempPathFactory, tree: list[tuple[list[str], str]]
) -> None:
    base = tmp_path_factory.mktemp("copy")
    host = base / "host"
    host.mkdir()
    (host / "secret").write_text("host secret")
    root, expected = base / "sandbox", {}
    root.mkdir()
    for parts, kind in tree:
        path = root.joinpath(*parts)
        parents = [p for p in path.parents if root in p.parents]
        if (
            path.is_symlink()
            or path.exists()
            or any(p.is_symlink() or (p.exists() and not p.is_dir()) for p in parents)
        ):
            continue  # taken, or under something that is not a directory
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "file":
            path.write_text("/".join(parts))
            expected["/".join(parts)] = "/".join(parts)
        elif kind == "big":
            path.write_bytes(b"x" * 2000)
        elif kind == "dir":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to(host / "secret" if kind == "link-file" else host)
    expected = {k: v for k, v in expected.items() if (root / k).is_file() and not (root / k).is_symlink()}
    out = base / "out"
    budget = nofollow.CopyBudget(max_file_bytes=1000)
    with nofollow.opened_dir(root) as fd:
        nofollow.copy_tree_out(fd, out, budget)
    copied = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}
    assert copied == expected
    assert not any(p.is_symlink() for p in out.rglob("*"))
    assert sorted(os.listdir(host)) == ["secret"] and (host / "secret").read_text() == "host secret"
    shutil.rmtree(base)


def test_a_copy_out_stops_at_its_file_and_byte_budget(tmp_path: Path) -> None:
    root = sandbox(tmp_path)
    for number in range(10):
        (root / f"f{number}").write_bytes(b"x" * 100)
    budget = nofollow.CopyBudget(max_file_bytes=1000, max_total_bytes=450, max_inodes=8)
    with nofollow.opened_dir(root) as fd:
        nofollow.copy_tree_out(fd, tmp_path / "out", budget)
    assert len(os.listdir(tmp_path / "out")) == 4 and budget.copied_bytes == 400
    assert "more than the 8 entries left" in budget.skipped[0]  # 2 names not even listed
    assert len(budget.skipped) == 1 + 4  # and 4 over the byte budget


def test_a_copy_out_counts_directories_as_inodes(tmp_path: Path) -> None:
    root = sandbox(tmp_path)
    for number in range(30):
        (root / f"d{number:02}" / "sub").mkdir(parents=True)
    budget = nofollow.CopyBudget(max_inodes=10)
    with nofollow.opened_dir(root) as fd:
        nofollow.copy_tree_out(fd, tmp_path / "out", budget)
    created = list((tmp_path / "out").rglob("*"))
    assert len(created) == budget.copied_inodes == 10  # empty directories count like files
    assert budget.skipped


def test_a_copy_out_stops_at_its_time_budget(tmp_path: Path) -> None:
    root = sandbox(tmp_path)
    for number in range(5):
        (root / f"f{number}").write_text("x")
    budget = nofollow.CopyBudget(max_seconds=0.0)
    with nofollow.opened_dir(root) as fd:
        nofollow.copy_tree_out(fd, tmp_path / "out", budget)
    assert os.listdir(tmp_path / "out") == [] and "time budget" in budget.skipped[0]


def test_a_copy_out_spends_its_time_budget_mid_tree_and_names_what_it_left(tmp_path: Path) -> None:
    root = sandbox(tmp_path)
    for number in range(20):
        (root / f"f{number:02}").write_text("x")
    ticks = iter(range(1_000))
    budget = nofollow.CopyBudget(max_seconds=7.5, clock=lambda: float(next(ticks)))
    with nofollow.opened_dir(root) as fd:
        nofollow.copy_tree_out(fd, tmp_path / "out", budget)
    copied = os.listdir(tmp_path / "out")
    assert 0 < len(copied) < 20 and len(copied) == budget.copied_inodes
    assert budget.skipped[-1] == "./ (the copy's 7.5s time budget is spent)"  # the rest, as one
    assert all("7.5s time budget is spent" in reason for reason in budget.skipped)
