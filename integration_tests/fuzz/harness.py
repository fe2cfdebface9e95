"""A bounded schemathesis run against one live server, counting answers by status class.

Owns reading a server's /openapi.json, generating cases for every operation in it (positive and
negative data, `max_examples` each, within a time budget), sending them, and tallying the replies:
cases, 2xx, 4xx, 5xx, transport errors, and the first few 5xx for the failure message. Whatever
operations the schema lists are fuzzed, so a route that gains a request model is picked up the
next run with no change here; `body_schemas` says which operations document a body. Besides
schemathesis' positive and negative cases (whose strings never hold a lone surrogate: its alphabet
excludes them), a third pass takes positive cases and puts a string from hypothesis' full text
strategy (`ANY_TEXT`: every code point, lone surrogates and NUL included) into one string of the
body (a value or a key) or, without surrogates (a URL cannot carry them), of the path or query:
`text_examples` each, counted in `text_cases`. A `reset` callback undoes what a case changed that
would block the next ones (a pause, injected faults). It starts no server (the fixtures in
`conftest.py` do).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

REQUEST_TIMEOUT_S = 30.0
ANY_TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), min_size=1, max_size=12)


@dataclass
class FuzzReport:
    """What one server answered."""

    server: str
    operations: list[str] = field(default_factory=list)
    body_schemas: list[str] = field(default_factory=list)
    bodyless: list[str] = field(default_factory=list)
    cases: int = 0
    text_cases: int = 0
    ok: int = 0
    client_errors: int = 0
    server_errors: int = 0
    transport_errors: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    out_of_time: bool = False

    def record(self, label: str, status: int | None, detail: str) -> None:
        self.cases += 1
        if status is None:
            self.transport_errors += 1
            self._fail(f"{label}: no response ({detail})")
            return
        self.by_status[status] = self.by_status.get(status, 0) + 1
        if status >= 500:
            self.server_errors += 1
            self._fail(f"{label} -> {status}: {detail}")
        elif status >= 400:
            self.client_errors += 1
        else:
            self.ok += 1

    def _fail(self, text: str) -> None:
        if len(self.failures) < 10:
            self.failures.append(text[:600])

    def summary(self) -> str:
        return (
            f"{self.server}: {self.cases} cases ({self.text_cases} with full-text strings) over "
            f"{len(self.operations)} operations "
            f"({len(self.body_schemas)} with a body schema), {self.ok} 2xx, {self.client_errors} 4xx, "
            f"{self.server_errors} 5xx, {self.transport_errors} no reply, {self.seconds:.0f} s"
            + (" (time budget reached)" if self.out_of_time else "")
        )


def _has_body(operation: Any) -> bool:
    return bool(operation.definition.raw.get("requestBody"))


def fuzz_server(
    name: str,
    base_url: str,
    *,
    max_examples: int = 50,
    budget_s: float = 300.0,
    reset: Callable[[str], None] | None = None,
    skip: Callable[[str], bool] | None = None,
    headers: dict[str, str] | None = None,
    text_examples: int = 20,
) -> FuzzReport:
    """Fuzz every operation of the server at `base_url`; `reset(label)` runs after each case."""
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json", wait_for_schema=30)
    report = FuzzReport(name)
    started = time.monotonic()
    session = requests.Session()

    def send(case: Any, label: str) -> None:
        try:
            response = case.call(base_url, session, headers, timeout=REQUEST_TIMEOUT_S)
        except requests.RequestException as exc:
            report.record(label, None, f"{type(exc).__name__}: {exc}")
        else:
            report.record(label, response.status_code, f"{case.as_curl_command()} -> {response.text[:300]}")
        finally:
            if reset is not None:
                reset(label)

    for result in schema.get_all_operations():
        operation = result.ok()
        label = f"{operation.method.upper()} {operation.path}"
        if skip is not None and skip(label):
            continue
        report.operations.append(label)
        if operation.method.upper() in ("POST", "PUT", "PATCH"):
            (report.body_schemas if _has_body(operation) else report.bodyless).append(label)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                strategy = operation.as_strategy(generation_mode=mode)
            except Exception as exc:  # an operation with nothing to negate has no negative cases
                if mode is GenerationMode.NEGATIVE:
                    continue
                raise AssertionError(f"{name}: cannot generate cases for {label}: {exc}") from exc

            _fuzz_operation(strategy, label, report, started, budget_s, max_examples, send)
        _fuzz_text(operation.as_strategy(generation_mode=GenerationMode.POSITIVE), label, report, started,
                   budget_s, text_examples, send)  # fmt: skip
    report.seconds = time.monotonic() - started
    return report


def _fuzz_operation(
    strategy: Any,
    label: str,
    report: FuzzReport,
    started: float,
    budget_s: float,
    max_examples: int,
    send: Callable[[Any, str], None],
) -> None:
    """`max_examples` cases of one operation (generation only: nothing to shrink, 5xx are tallied)."""

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        if time.monotonic() - started > budget_s:
            report.out_of_time = True
            return
        send(case, label)

    with contextlib.suppress(Unsatisfiable):  # negative mode of an operation with nothing to break
        run()


def _strings(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Where the strings of a JSON value are: a path of keys and indices, ending in ("key", k) for a
    dict key."""
    if isinstance(value, str):
        return [path]
    found: list[tuple[Any, ...]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            found.append((*path, ("key", key)))
            found.extend(_strings(item, (*path, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_strings(item, (*path, index)))
    return found


def _put(value: Any, path: tuple[Any, ...], text: str) -> Any:
    """`value` with the string at `path` replaced by `text` (a dict key renamed)."""
    if not path:
        return text
    head, rest = path[0], path[1:]
    if isinstance(head, tuple):  # a key
        return {(text if k == head[1] else k): v for k, v in value.items()}
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _put(value[head], rest, text)
    return copy


def _no_surrogates(text: str) -> str:
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)


def _fuzz_text(
    strategy: Any,
    label: str,
    report: FuzzReport,
    started: float,
    budget_s: float,
    examples: int,
    send: Callable[[Any, str], None],
) -> None:
    """`examples` positive cases with one string (body; else path or query) from ANY_TEXT."""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(case=strategy, text=ANY_TEXT, pick=st.integers(0, 10_000))
    def run(case: Any, text: str, pick: int) -> None:
        if time.monotonic() - started > budget_s:
            report.out_of_time = True
            return
        body = getattr(case, "body", None)
        places = _strings(body) if isinstance(body, dict | list) else []
        if places:
            case.body = _put(body, places[pick % len(places)], text)
        else:
            kinds = ("path_parameters", "query")
            params = [(kind, name) for kind in kinds for name in (getattr(case, kind) or {})]
            if not params:
                return
            kind, name = params[pick % len(params)]
            getattr(case, kind)[name] = _no_surrogates(text)
        report.text_cases += 1
        send(case, label)

    with contextlib.suppress(Unsatisfiable):
        run()
