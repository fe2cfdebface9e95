"""Task catalog: names stay inside the tasks root; limits, reservations and image groups are read."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rl360_ext.harbor.admission import Reservation
from rl360_ext.harbor.catalog import (
    TaskCatalog,
    TaskInvalid,
    TaskNotFound,
    TaskPathRejected,
)
from rl360_ext.local.fixtures import tasks_root as example_tasks_root

DEFAULT = Reservation(cpus=2, memory_mb=4096)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "tasks"
    shutil.copytree(example_tasks_root() / "fix-mean", root / "fix-mean")
    return root


def test_example_tasks_are_valid_harbor_tasks() -> None:
    catalog = TaskCatalog(example_tasks_root(), DEFAULT)
    names = sorted(p.name for p in example_tasks_root().iterdir() if (p / "task.toml").exists())
    assert {"fix-mean", "fizzbuzz", "slow-sum"} <= set(names)
    assert len([n for n in names if n.startswith("fault-")]) >= 5
    for name in names:
        info = catalog.load(name)
        assert info.reservation.cpus > 0 and info.verifier_s > 0


def test_a_task_reads_its_limits(root: Path) -> None:
    info = TaskCatalog(root, DEFAULT).load("fix-mean")
    assert info.reservation == Reservation(cpus=1.0, memory_mb=512)
    assert (info.environment_setup_s, info.verifier_s, info.agent_s) == (60.0, 30.0, 120.0)
    assert info.image_group == "rl360-python-3"


@pytest.mark.parametrize("name", ["../fix-mean", "/etc", "fix-mean/../../x", "", "a\\b"])
def test_names_outside_the_root_are_rejected(root: Path, name: str) -> None:
    with pytest.raises(TaskPathRejected):
        TaskCatalog(root, DEFAULT).resolve(name)


def test_a_symlink_out_of_the_root_is_rejected(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    shutil.copytree(root / "fix-mean", outside)
    (root / "sneaky").symlink_to(outside)
    with pytest.raises(TaskPathRejected, match="outside"):
        TaskCatalog(root, DEFAULT).load("sneaky")


def test_unknown_and_invalid_tasks(root: Path) -> None:
    catalog = TaskCatalog(root, DEFAULT)
    with pytest.raises(TaskNotFound):
        catalog.load("nope")
    (root / "fix-mean" / "tests" / "test.sh").unlink()
    with pytest.raises(TaskInvalid, match="fix-mean"):
        catalog.load("fix-mean")


def test_defaults_and_image_group_fallbacks(root: Path) -> None:
    toml = root / "fix-mean" / "task.toml"
    text = toml.read_text().replace('image_group = "rl360-python-3"\n', "")
    toml.write_text(text.replace("cpus = 1\nmemory_mb = 512\n", ""))
    info = TaskCatalog(root, DEFAULT).load("fix-mean")
    assert info.reservation == DEFAULT
    assert info.image_group.startswith("env-")  # a hash of environment/
    toml.write_text(
        toml.read_text().replace("[environment]\n", '[environment]\ndocker_image = "python:3.12"\n')
    )
    assert TaskCatalog(root, DEFAULT).load("fix-mean").image_group == "python:3.12"


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("environment/app", "host-dir"),
        ("environment/setup.sh", "host-file"),
        ("solution/solve.sh", "host-file"),
        ("tests/deep/x", "host-dir"),
    ],
)
def test_a_link_that_leaves_the_task_is_refused_naming_it(
    root: Path, tmp_path: Path, link: str, target: str
) -> None:
    (tmp_path / "host-dir").mkdir()
    (tmp_path / "host-file").write_text("echo host secret\n")
    catalog = TaskCatalog(root, DEFAULT)
    catalog.load("fix-mean")  # cached first: the check still runs on every load
    path = root / "fix-mean" / link
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink() if path.is_file() else shutil.rmtree(path)
    path.symlink_to(tmp_path / target)
    with pytest.raises(TaskInvalid, match=f"{link} is a link that leaves the task directory"):
        catalog.load("fix-mean")


def test_links_inside_the_task_are_allowed_and_special_files_refused(root: Path) -> None:
    task = root / "fix-mean"
    (task / "environment" / "alias.py").symlink_to(task / "environment" / "app" / "stats.py")
    TaskCatalog(root, DEFAULT).load("fix-mean")
    os.mkfifo(task / "tests" / "pipe")
    with pytest.raises(TaskInvalid, match="tests/pipe is not a regular file"):
        TaskCatalog(root, DEFAULT).load("fix-mean")


@pytest.mark.parametrize("name", ["fix\0mean", "fix-mean\n", "x" * 256, "a\x7f"])
def test_control_characters_and_long_names_are_rejected(root: Path, name: str) -> None:
    with pytest.raises(TaskPathRejected):
        TaskCatalog(root, DEFAULT).load(name)
