"""The error trees and the config naming as a contract, read from every module of `rl360_ext`.

Every exception class derives from `rl360_ext.errors.Rl360Error`; every class of a server's tree
carries its HTTP status; the servers' HTTP adapters name no status of their own; every config
class is named `...Config` (no `Settings`, no `Options`), once in the package, and documents each
of its fields. A stray exception
or config class added anywhere fails here, naming it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import rl360_ext
from rl360_ext.errors import Rl360Error
from rl360_ext.harbor.errors import HarborRequestError
from rl360_ext.reference.engine.errors import EngineError
from rl360_ext.session.errors import RequestError, SessionServerError
from rl360_ext.util.fielddocs import field_docs

SERVER_TREES: tuple[type[Rl360Error], ...] = (SessionServerError, HarborRequestError, EngineError)
# A `SystemExit`: `except Exception` (and so `except Rl360Error`) must not catch it.
OUTSIDE_THE_ROOT = {"rl360_ext.util.signals.Terminated"}
# The servers' HTTP adapters: each answers a tree's error with the class's status, never a literal.
ADAPTERS = (
    "rl360_ext/session/app.py",
    "rl360_ext/harbor/app.py",
    "rl360_ext/harbor/guard.py",
    "rl360_ext/reference/engine/server.py",
    "rl360_ext/reference/engine/instant.py",
)
CONFIG_NAME = re.compile(r"(Config|Settings|Options)$")
ROOT = Path(rl360_ext.__file__).resolve().parent


def _modules() -> Iterator[object]:
    for info in pkgutil.walk_packages(rl360_ext.__path__, "rl360_ext."):
        yield importlib.import_module(info.name)


def _classes() -> list[type]:
    found: dict[str, type] = {}
    for module in _modules():
        for obj in vars(module).values():
            if inspect.isclass(obj) and obj.__module__ == module.__name__:  # type: ignore[attr-defined]
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return list(found.values())


@pytest.fixture(scope="module")
def classes() -> list[type]:
    return _classes()


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_every_exception_derives_from_the_root(classes: list[type]) -> None:
    exceptions = [cls for cls in classes if issubclass(cls, BaseException)]
    assert len(exceptions) > 50  # the walk saw the package
    stray = [
        _name(cls)
        for cls in exceptions
        if not issubclass(cls, Rl360Error) and _name(cls) not in OUTSIDE_THE_ROOT
    ]
    assert stray == [], f"derive these from rl360_ext.errors.Rl360Error (or a server's tree): {stray}"
    for name in OUTSIDE_THE_ROOT:
        (cls,) = (cls for cls in exceptions if _name(cls) == name)
        assert not issubclass(cls, Exception), f"{name} is an Exception: derive it from Rl360Error"


def test_every_server_error_has_its_status(classes: list[type]) -> None:
    server_errors = [cls for cls in classes if issubclass(cls, SERVER_TREES)]
    assert {tree for tree in SERVER_TREES} <= set(server_errors)
    for cls in server_errors:
        status = cls.status  # type: ignore[attr-defined]
        assert isinstance(status, int) and 400 <= status <= 599, f"{_name(cls)}: status {status!r}"
    for tree in SERVER_TREES:  # one tree per server: the trees do not nest
        assert not any(issubclass(tree, other) for other in SERVER_TREES if other is not tree)


def test_a_clients_mistake_is_a_4xx_and_never_an_infrastructure_fault() -> None:
    assert RequestError.status == 400 and RequestError("x").kind == "invalid_request_error"
    from rl360_ext.harbor import errors as harbor
    from rl360_ext.reference.engine import errors as engine

    for cls in (harbor.FieldInvalid, harbor.TaskNotFound, harbor.BodyInvalid, engine.RequestError):
        assert 400 <= cls.status < 500, cls


@pytest.mark.parametrize("path", ADAPTERS)
def test_the_http_adapters_name_no_status_of_their_own(path: str) -> None:
    """An error status in an adapter is a tree class's `status`, never a number typed in a route."""
    literal: list[str] = []
    for node in ast.walk(ast.parse((ROOT.parent / path).read_text())):
        if isinstance(node, ast.Call):
            for value in [*node.args, *(keyword.value for keyword in node.keywords)]:
                if isinstance(value, ast.Constant) and type(value.value) is int and 400 <= value.value <= 599:
                    literal.append(f"line {value.lineno}: {value.value}")
    assert literal == [], f"{path}: raise the tree's class instead of {literal}"


def test_config_classes_are_named_config_once(classes: list[type]) -> None:
    configs = [cls for cls in classes if CONFIG_NAME.search(cls.__name__)]
    assert len(configs) > 15  # the walk saw the package
    misnamed = [_name(cls) for cls in configs if not cls.__name__.endswith("Config")]
    assert misnamed == [], f"a config class is named ...Config: {misnamed}"
    names = [cls.__name__ for cls in configs]
    twice = sorted({name for name in names if names.count(name) > 1})
    assert twice == [], f"config class names used twice: {twice}"
    for cls in configs:  # one dataclass each (Harbor's environment kwargs are its pydantic model)
        assert dataclasses.is_dataclass(cls) or hasattr(cls, "model_fields"), _name(cls)


def test_every_config_field_is_documented(classes: list[type]) -> None:
    """A field's docstring (torchtitan style, read by `field_docs`), or for Miles' flags its `help`
    metadata, or for a pydantic model its `description`: the CLI's help comes from there."""
    undocumented: list[str] = []
    for cls in classes:
        if not cls.__name__.endswith("Config"):
            continue
        if dataclasses.is_dataclass(cls):
            docs = field_docs(cls)
            names = [
                f.name for f in dataclasses.fields(cls) if f.name not in docs and "help" not in f.metadata
            ]
        else:
            own = inspect.get_annotations(cls)
            fields = cls.model_fields  # type: ignore[attr-defined]
            names = [name for name in own if not fields[name].description]
        undocumented += [f"{_name(cls)}.{name}" for name in names]
    assert undocumented == [], f"document these config fields: {undocumented}"
