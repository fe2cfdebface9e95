"""Task catalog: names stay inside the tasks root; limits, reservations and image groups are read."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from harbor.models.task.task import Task
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.harbor.admission import Reservation
from rl360_ext.harbor.catalog import (
    SnapshotTask,
    TaskCatalog,
    TaskInvalid,
    TaskNotFound,
    TaskPathRejected,
)
from rl360_ext.harbor.snapshot import SnapshotLimits, SnapshotStore
from rl360_ext.local.fixtures import tasks_root as example_tasks_root

DEFAULT = Reservation(cpus=2, memory_mb=4096)


@pytest.fixture
def store(tmp_path: Path) -> SnapshotStore:
    return SnapshotStore(tmp_path / "trials")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "tasks"
    shutil.copytree(example_tasks_root() / "fix-mean", root / "fix-mean")
    return root


def test_example_tasks_are_valid_harbor_tasks(store: SnapshotStore) -> None:
    catalog = TaskCatalog(example_tasks_root(), DEFAULT, store)
    names = sorted(p.name for p in example_tasks_root().iterdir() if (p / "task.toml").exists())
    assert {"fix-mean", "fizzbuzz", "slow-sum"} <= set(names)
    assert len([n for n in names if n.startswith("fault-")]) >= 5
    for name in names:
        info = catalog.load(name)
        assert info.reservation.cpus > 0 and info.verifier_s > 0


def test_a_task_reads_its_limits(root: Path, store: SnapshotStore) -> None:
    info = TaskCatalog(root, DEFAULT, store).load("fix-mean")
    assert info.reservation == Reservation(cpus=1.0, memory_mb=512)
    assert (info.environment_setup_s, info.verifier_s, info.agent_s) == (60.0, 30.0, 120.0)
    assert info.image_group == "rl360-python-3"


@pytest.mark.parametrize("name", ["../fix-mean", "/etc", "fix-mean/../../x", "", "a\\b"])
def test_names_outside_the_root_are_rejected(root: Path, name: str) -> None:
    with pytest.raises(TaskPathRejected):
        TaskCatalog.resolve(name)


def test_a_symlink_out_of_the_root_is_rejected(root: Path, tmp_path: Path, store: SnapshotStore) -> None:
    outside = tmp_path / "outside"
    shutil.copytree(root / "fix-mean", outside)
    (root / "sneaky").symlink_to(outside)
    with pytest.raises(TaskPathRejected, match="never followed through links"):
        TaskCatalog(root, DEFAULT, store).load("sneaky")


def test_unknown_and_invalid_tasks(root: Path, store: SnapshotStore) -> None:
    catalog = TaskCatalog(root, DEFAULT, store)
    with pytest.raises(TaskNotFound):
        catalog.load("nope")
    (root / "fix-mean" / "tests" / "test.sh").unlink()
    with pytest.raises(TaskInvalid, match="fix-mean"):
        catalog.load("fix-mean")


def test_defaults_and_image_group_fallbacks(root: Path, store: SnapshotStore) -> None:
    toml = root / "fix-mean" / "task.toml"
    text = toml.read_text().replace('image_group = "rl360-python-3"\n', "")
    toml.write_text(text.replace("cpus = 1\nmemory_mb = 512\n", ""))
    info = TaskCatalog(root, DEFAULT, store).load("fix-mean")
    assert info.reservation == DEFAULT
    assert info.image_group.startswith("env-")  # a hash of environment/
    toml.write_text(
        toml.read_text().replace("[environment]\n", '[environment]\ndocker_image = "python:3.12"\n')
    )
    assert TaskCatalog(root, DEFAULT, store).load("fix-mean").image_group == "python:3.12"


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
    root: Path, tmp_path: Path, link: str, target: str, store: SnapshotStore
) -> None:
    (tmp_path / "host-dir").mkdir()
    (tmp_path / "host-file").write_text("echo host secret\n")
    catalog = TaskCatalog(root, DEFAULT, store)
    catalog.load("fix-mean")  # loaded first: the check still runs on every load
    path = root / "fix-mean" / link
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink() if path.is_file() else shutil.rmtree(path)
    path.symlink_to(tmp_path / target)
    with pytest.raises(TaskInvalid, match=f"{link} is a link that leaves the task directory"):
        catalog.load("fix-mean")


def test_links_inside_the_task_are_allowed_and_special_files_refused(
    root: Path, store: SnapshotStore
) -> None:
    task = root / "fix-mean"
    (task / "environment" / "alias.py").symlink_to(task / "environment" / "app" / "stats.py")
    TaskCatalog(root, DEFAULT, store).load("fix-mean")
    os.mkfifo(task / "tests" / "pipe")
    with pytest.raises(TaskInvalid, match="tests/pipe is not a regular file"):
        TaskCatalog(root, DEFAULT, store).load("fix-mean")


@pytest.mark.parametrize("name", ["fix\0mean", "fix-mean\n", "x" * 256, "a\x7f"])
def test_control_characters_and_long_names_are_rejected(root: Path, name: str, store: SnapshotStore) -> None:
    with pytest.raises(TaskPathRejected):
        TaskCatalog(root, DEFAULT, store).load(name)


ENV_TABLES = {
    "environment.env": "[environment.env]\nKEY = '{value}'\n",
    "verifier.env": "[verifier.env]\nKEY = '{value}'\n",
    "solution.env": "[solution.env]\nKEY = '{value}'\n",
    "environment.mcp_servers.0.headers": (
        "[[environment.mcp_servers]]\nname = 'm'\nurl = 'http://127.0.0.1:9/x'\n"
        "[environment.mcp_servers.headers]\nKEY = '{value}'\n"
    ),
    "steps.0.verifier.env": "[[steps]]\nname = 's1'\n[steps.verifier.env]\nKEY = '{value}'\n",
}


def _with_table(root: Path, table: str, value: str) -> None:
    toml = root / "fix-mean" / "task.toml"
    text = toml.read_text()
    # [environment] sub-tables go after the [environment] keys; the others at the end
    toml.write_text(text + "\n" + ENV_TABLES[table].format(value=value))


@pytest.mark.parametrize("table", sorted(ENV_TABLES))
@pytest.mark.parametrize("value", ["${CANARY}", "${CANARY:-x}", "Bearer ${CANARY}", "${UNSET_CANARY_7f3}"])
def test_a_template_in_any_env_table_is_refused_naming_the_key_whether_set_or_not(
    root: Path, store: SnapshotStore, monkeypatch: pytest.MonkeyPatch, table: str, value: str
) -> None:
    monkeypatch.setenv("CANARY", "host-secret-canary")
    if table.startswith("steps"):
        (root / "fix-mean" / "steps" / "s1" / "tests").mkdir(parents=True)
        (root / "fix-mean" / "steps" / "s1" / "tests" / "test.sh").write_text("true\n")
        (root / "fix-mean" / "steps" / "s1" / "instruction.md").write_text("x\n")
    _with_table(root, table, value)
    with pytest.raises(TaskInvalid) as refused:
        TaskCatalog(root, DEFAULT, store).load("fix-mean")
    message = str(refused.value)
    assert f"{table}.KEY uses a ${{...}} template" in message and "fix-mean" in message
    assert "host-secret-canary" not in message and "CANARY" not in message.replace(value, "")
    monkeypatch.delenv("CANARY")
    with pytest.raises(TaskInvalid) as unset:
        TaskCatalog(root, DEFAULT, store).load("fix-mean")
    assert str(unset.value) == message  # nothing to probe: the same answer either way


def test_allow_listed_names_load_and_every_name_in_a_value_must_be_allowed(
    root: Path, store: SnapshotStore
) -> None:
    _with_table(root, "verifier.env", "${OK_NAME}")
    TaskCatalog(root, DEFAULT, store, allowed_env=("OK_NAME",)).load("fix-mean")
    _with_table(root, "solution.env", "${OK_NAME:-${SECRET}}")
    with pytest.raises(TaskInvalid, match=r"solution.env.KEY"):
        TaskCatalog(root, DEFAULT, store, allowed_env=("OK_NAME",)).load("fix-mean")


@pytest.mark.parametrize(
    ("links", "bad"),
    [
        ({"tests/a": "b", "tests/b": "a"}, "tests/a is a link loop"),
        ({"tests/self": "self"}, "tests/self is a link loop"),
        ({"environment/app/up": ".."}, "environment/app/up is a link loop"),
        ({"environment/app/here": "."}, "environment/app/here is a link loop"),
        ({"tests/sub": "../tests"}, "tests/sub is a link loop"),
    ],
)
def test_link_loops_are_refused_at_load(
    root: Path, store: SnapshotStore, links: dict[str, str], bad: str
) -> None:
    for link, target in links.items():
        (root / "fix-mean" / link).symlink_to(target)
    with pytest.raises(TaskInvalid, match=bad):
        TaskCatalog(root, DEFAULT, store).load("fix-mean")


def test_a_link_in_a_middle_segment_of_the_name_is_refused(
    root: Path, store: SnapshotStore, tmp_path: Path
) -> None:
    (root / "group").mkdir()
    shutil.copytree(root / "fix-mean", tmp_path / "elsewhere" / "fix-mean")
    (root / "alias").symlink_to(tmp_path / "elsewhere")
    shutil.copytree(root / "fix-mean", root / "group" / "fix-mean")
    catalog = TaskCatalog(root, DEFAULT, store)
    assert catalog.load("group/fix-mean").name == "group/fix-mean"
    with pytest.raises(TaskPathRejected, match="link"):
        catalog.load("alias/fix-mean")


def test_each_load_is_its_own_snapshot_that_later_changes_do_not_reach(
    root: Path, store: SnapshotStore
) -> None:
    catalog = TaskCatalog(root, DEFAULT, store)
    first = catalog.load("fix-mean")
    assert first.path != root / "fix-mean" and first.path.name == "fix-mean"
    assert first.path.is_relative_to(store.root)
    before = (first.path / "tests" / "test.sh").read_text()
    (root / "fix-mean" / "tests" / "test.sh").write_text("echo changed\n")
    assert (first.path / "tests" / "test.sh").read_text() == before
    second = catalog.load("fix-mean")
    assert (second.path / "tests" / "test.sh").read_text() == "echo changed\n"
    catalog.release(first)
    assert not first.path.exists() and second.path.exists()


def test_a_snapshot_store_removes_what_a_dead_server_left(tmp_path: Path) -> None:
    dead = tmp_path / ".rl360-task-snapshots-999999999-deadbeef"
    (dead / "x").mkdir(parents=True)
    (dead / "owner").write_text(f"{socket.gethostname()} 999999999.12345")
    elsewhere = tmp_path / ".rl360-task-snapshots-999999999-cafef00d"
    elsewhere.mkdir()
    (elsewhere / "owner").write_text("another-host 999999999.12345")
    live = SnapshotStore(tmp_path)
    assert live.removed_at_start == 1 and not dead.exists() and elsewhere.exists()
    assert SnapshotStore(tmp_path).removed_at_start == 0 and live.root.exists()


def test_a_task_dir_swapped_for_a_link_to_the_host_during_loads_never_yields_a_host_byte(
    root: Path, store: SnapshotStore, tmp_path: Path
) -> None:
    """A thread swaps the task (and, in turn, its tests dir and one file) for links to a host
    canary while the catalog loads it; every load is a full snapshot of the real task or a 4xx."""
    canary = "HOST-CANARY-5e1f"
    host = tmp_path / "host"
    shutil.copytree(root / "fix-mean", host / "fix-mean")
    for path in (host / "fix-mean").rglob("*"):
        if path.is_file():
            path.write_text(canary)
    real = root / "fix-mean"
    swaps = [  # (what is swapped, where the real one waits meanwhile, the host link put in its place)
        (real, root / "fix-mean.real", host / "fix-mean"),
        (real / "tests", real / "tests.real", host / "fix-mean" / "tests"),
        (
            real / "tests" / "test.sh",
            real / "tests" / "test.sh.real",
            host / "fix-mean" / "tests" / "test.sh",
        ),
        (real / "task.toml", real / "task.toml.real", host / "fix-mean" / "task.toml"),
    ]
    stop = threading.Event()

    def swapper() -> None:
        while not stop.is_set():
            for link, keep, target in swaps:
                with contextlib.suppress(OSError):
                    os.rename(link, keep)
                    os.symlink(target, link)
                    os.unlink(link)
                    os.rename(keep, link)
            stop.wait(0.001)  # a moment with the real tree in place, so loads also land between swaps

    catalog = TaskCatalog(root, DEFAULT, store)
    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    outcomes: dict[str, int] = {}
    try:
        # at least 150 loads (or 5 s), then on (at most 30 s) until both sides of the race were hit
        started, loads = time.monotonic(), 0
        while time.monotonic() - started < 30:
            both = outcomes.get("loaded", 0) > 0 and len(outcomes) > 1
            if both and (loads >= 150 or time.monotonic() - started > 5):
                break
            loads += 1
            for name in ("fix-mean",):
                try:
                    info = catalog.load(name)
                except (TaskInvalid, TaskNotFound, TaskPathRejected) as exc:
                    outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
                    continue
                files = [p for p in info.path.rglob("*") if p.is_file() and not p.is_symlink()]
                assert all(canary not in p.read_text() for p in files), name
                assert not [p for p in info.path.rglob("*") if p.is_symlink()]
                outcomes["loaded"] = outcomes.get("loaded", 0) + 1
                catalog.release(info)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert outcomes.get("loaded", 0) > 0 and len(outcomes) > 1, outcomes  # both sides of the race were hit


def test_an_unchanged_tree_is_not_parsed_again_and_a_changed_one_is(
    root: Path, store: SnapshotStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rl360_ext.harbor.catalog as catalog_module

    parsed: list[Path] = []
    real_task = catalog_module.SnapshotTask

    def counting(path: Path) -> object:
        parsed.append(path)
        return real_task(path)

    monkeypatch.setattr(catalog_module, "SnapshotTask", counting)
    catalog = TaskCatalog(root, DEFAULT, store)
    first = catalog.load("fix-mean")
    catalog.release(first)
    second = catalog.load("fix-mean")
    assert len(parsed) == 1 and first.path != second.path and second.image_group == first.image_group
    toml = root / "fix-mean" / "task.toml"
    toml.write_text(toml.read_text() + "\n[verifier.env]\nX = '${SECRET}'\n")
    with pytest.raises(TaskInvalid, match=r"verifier\.env\.X"):
        catalog.load("fix-mean")  # a changed tree is checked again, never served from before


@pytest.mark.parametrize(
    ("limits", "why"),
    [
        (SnapshotLimits(max_entries=3), "more than 3 files and directories"),
        (SnapshotLimits(max_bytes=100), "larger than 100 bytes"),
        (SnapshotLimits(max_depth=1), "nested deeper than 1 directories"),
    ],
)
def test_a_snapshot_is_capped(root: Path, tmp_path: Path, limits: SnapshotLimits, why: str) -> None:
    catalog = TaskCatalog(root, DEFAULT, SnapshotStore(tmp_path / "capped", limits))
    with pytest.raises(TaskInvalid, match=why):
        catalog.load("fix-mean")
    assert list((tmp_path / "capped").glob("*/*")) == [next((tmp_path / "capped").glob("*/owner"))]


@settings(max_examples=40, deadline=None)
@given(
    value=st.lists(
        st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="'"), max_size=3)
        | st.sampled_from(["${", "}", "$", ":-", "{"]),
        max_size=6,
    ).map("".join),
    table=st.sampled_from(sorted(ENV_TABLES)),
)
def test_any_env_value_is_refused_exactly_when_it_holds_a_template(
    tmp_path_factory: pytest.TempPathFactory, value: str, table: str
) -> None:
    root = tmp_path_factory.mktemp("tasks")
    shutil.copytree(example_tasks_root() / "fix-mean", root / "fix-mean")
    if table.startswith("steps"):
        (root / "fix-mean" / "steps" / "s1" / "tests").mkdir(parents=True)
        (root / "fix-mean" / "steps" / "s1" / "tests" / "test.sh").write_text("true\n")
        (root / "fix-mean" / "steps" / "s1" / "instruction.md").write_text("x\n")
    _with_table(root, table, value)
    catalog = TaskCatalog(root, DEFAULT, SnapshotStore(root.parent / "trials"))
    if "${" in value:
        with pytest.raises(TaskInvalid, match=re.escape(f"{table}.KEY uses a ${{...}} template")):
            catalog.load("fix-mean")
    else:
        with contextlib.suppress(TaskInvalid):  # Harbor may refuse a header value for reasons of its own
            catalog.load("fix-mean")


def test_loads_of_one_tree_share_a_snapshot_and_its_parsed_task_until_the_last_release(
    root: Path, store: SnapshotStore
) -> None:
    catalog = TaskCatalog(root, DEFAULT, store)
    group = [catalog.load("fix-mean") for _ in range(4)]
    path = group[0].path
    assert {info.path for info in group} == {path}
    assert catalog.harbor_task(path) is catalog.harbor_task(group[3].path)
    assert catalog.harbor_task(path).name == "fix-mean"
    with pytest.warns(DeprecationWarning):  # Harbor's own checksum, computed once per snapshot
        assert catalog.harbor_task(path).checksum == Task(path).checksum
    assert "checksum" in vars(catalog.harbor_task(path))
    (root / "fix-mean" / "instruction.md").write_text("changed while the group runs\n")
    changed = catalog.load("fix-mean")  # another tree: its own snapshot, never the group's
    assert changed.path != path and "changed" in catalog.harbor_task(changed.path).instruction
    assert "changed" not in (path / "instruction.md").read_text()
    for info in group[:3]:
        catalog.release(info)
        assert path.is_dir()
    catalog.release(group[3])
    assert not path.parent.exists()
    catalog.release(changed)
    assert not changed.path.parent.exists()
    assert [entry for entry in store.root.iterdir() if entry.is_dir()] == []


def test_a_task_name_gets_its_own_snapshot_even_for_a_tree_another_name_has(
    root: Path, store: SnapshotStore
) -> None:
    shutil.copytree(root / "fix-mean", root / "twin")
    catalog = TaskCatalog(root, DEFAULT, store)
    one, twin = catalog.load("fix-mean"), catalog.load("twin")
    assert one.path != twin.path and twin.path.name == "twin"  # Harbor names a task by its folder
    catalog.release(one)
    catalog.release(twin)


def test_concurrent_loads_of_a_new_tree_keep_one_copy(root: Path, store: SnapshotStore) -> None:
    catalog = TaskCatalog(root, DEFAULT, store)
    with ThreadPoolExecutor(8) as pool:
        infos = list(pool.map(lambda _: catalog.load("fix-mean"), range(16)))
    assert len({info.path for info in infos}) == 1
    assert len([entry for entry in store.root.iterdir() if entry.is_dir()]) == 1
    for info in infos:
        catalog.release(info)
    assert [entry for entry in store.root.iterdir() if entry.is_dir()] == []


async def test_a_trial_is_created_around_the_catalogs_parsed_task(
    root: Path, store: SnapshotStore, tmp_path: Path
) -> None:
    from harbor.models.trial.config import EnvironmentConfig, TaskConfig, TrialConfig

    from rl360_ext.harbor.envs.bwrap import IMPORT_PATH
    from rl360_ext.harbor.runner import catalog_trial

    catalog = TaskCatalog(root, DEFAULT, store)
    info = catalog.load("fix-mean")
    trial_class = catalog_trial(catalog)
    config = TrialConfig(
        task=TaskConfig(path=info.path),
        trials_dir=tmp_path / "trials",
        environment=EnvironmentConfig(
            import_path=IMPORT_PATH, kwargs={"sandbox_root": str(tmp_path / "sandboxes")}
        ),
    )
    trial = await trial_class.create(config)
    assert trial.task is catalog.harbor_task(info.path) and type(trial) is not trial_class
    extra = config.model_copy(update={"extra_instructions": ["also this"]})
    own, _ = await trial_class._load_task(extra)  # Harbor parses a task with extras itself
    assert own is not catalog.harbor_task(info.path) and own.instruction.endswith("also this")
    catalog.release(info)


_IGNORE_LINES = st.lists(
    st.sampled_from(["*.log", "data/", "!keep.log", "/fixtures", "deep/**", "a.txt"]), max_size=4
)


@settings(max_examples=40, deadline=None)
@given(tests_ignore=_IGNORE_LINES, solution_ignore=_IGNORE_LINES)
def test_a_snapshot_s_file_selection_is_harbor_s_computed_once(
    tmp_path_factory: pytest.TempPathFactory, tests_ignore: list[str], solution_ignore: list[str]
) -> None:
    task_dir = tmp_path_factory.mktemp("task") / "t"
    shutil.copytree(example_tasks_root() / "fizzbuzz", task_dir)
    for name in ("tests", "solution"):
        for relative in ("data/a.txt", "deep/x/y.txt", "fixtures/f.txt", "keep.log", "run.log"):
            (task_dir / name / relative).parent.mkdir(parents=True, exist_ok=True)
            (task_dir / name / relative).write_text(relative)
    (task_dir / "tests" / ".harborignore").write_text("\n".join(tests_ignore))
    (task_dir / "solution" / ".harborignore").write_text("\n".join(solution_ignore))
    harbor, ours = Task(task_dir), SnapshotTask(task_dir)
    for name in ("tests", "solution"):
        expected = harbor.file_filter.select(task_dir / name)
        selected = ours.file_filter.select(task_dir / name)
        assert selected == expected
        assert ours.file_filter.select(task_dir / name) is selected  # once per snapshot
        for path in sorted((task_dir / name).rglob("*")):
            assert ours.file_filter.is_excluded(path) == harbor.file_filter.is_excluded(path)
