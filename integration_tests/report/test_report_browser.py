"""The step report in a real browser: headless Debian Chromium loads the file:// page offline.

Checks that the page renders with no console message, script error or blocked load (its content
security policy forbids every fetch, so any external resource would show up here), that every
chart section laid out drawn marks of non-zero size or a visible no-data note, and leaves a
full-page screenshot in test-output/report/ for people to look at.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from rl360_ext.diagnostics.report import main
from tests.diagnostics.report_fixtures import CHARTS, write_run

from .browser import Browser, chromium_path

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(chromium_path() is None, reason="needs Debian's chromium"),
    pytest.mark.timeout(60),
]

OUTPUT = Path(__file__).resolve().parents[2] / "test-output" / "report"
# Per chart section: drawn marks with a non-zero box, visible no-data notes, and the page's size.
LAYOUT = """JSON.stringify({
  charts: Object.fromEntries([...document.querySelectorAll('section.chart')].map(s => [s.id, {
    marks: [...s.querySelectorAll('.mark')].filter(m => {
      const r = m.getBoundingClientRect(); return r.width > 0 && r.height > 0; }).length,
    notes: [...s.querySelectorAll('.no-data, .empty-ok')]
      .filter(n => n.getBoundingClientRect().height > 0).length,
    svgWidth: Math.max(0, ...[...s.querySelectorAll('svg')].map(v => v.getBoundingClientRect().width)),
  }])),
  width: document.documentElement.scrollWidth,
  height: document.documentElement.scrollHeight,
  summaryRows: document.querySelectorAll('#summary tr').length,
})"""


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def render_in_browser(page: Path, profile: Path, screenshot: Path) -> tuple[dict, list[str], bytes]:
    with Browser(profile) as browser:
        browser.open(page.as_uri(), width=1400, height=3000)
        layout = json.loads(browser.evaluate(LAYOUT))
        png = browser.screenshot(screenshot)
        return layout, browser.problems(), png


def test_demo_like_run_renders_every_chart_with_marks(tmp_path: Path) -> None:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    write_run(tmp_path / "metrics.jsonl", steps=5, groups=8, group_size=4)
    page = OUTPUT / "report.html"
    main(tmp_path, page)

    layout, problems, png = render_in_browser(page, tmp_path / "profile", OUTPUT / "report.png")

    assert problems == []
    assert set(layout["charts"]) == set(CHARTS)
    for chart_id in CHARTS:
        chart = layout["charts"][chart_id]
        assert chart["marks"] > 0 and chart["notes"] == 0, (chart_id, chart)
        assert chart["svgWidth"] > 300, (chart_id, chart)
    assert layout["summaryRows"] == 9
    assert layout["width"] <= 1400, "the page must not scroll sideways at 1400 px"
    width, height = png_size(png)
    assert width == 1400 and height == layout["height"]


def test_real_miles_run_without_attempt_lines_or_pushes_says_what_is_missing(tmp_path: Path) -> None:
    """A Miles run that used only the metrics hook, with attempt lines turned off: notes, no empty axes."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    write_run(tmp_path / "metrics.jsonl", steps=3, attempt_lines=False, pushes=False, routing=False)
    page = OUTPUT / "report-miles-steps-only.html"
    main(tmp_path / "metrics.jsonl", page)

    layout, problems, _ = render_in_browser(
        page, tmp_path / "profile", OUTPUT / "report-miles-steps-only.png"
    )

    assert problems == []
    charts = layout["charts"]
    for drawn in ("chart-outcomes", "chart-rewards", "chart-infra"):
        assert charts[drawn]["marks"] > 0, (drawn, charts[drawn])
    for missing in ("chart-phases", "chart-cache", "chart-routing", "chart-pushes", "chart-push-calls"):
        assert charts[missing]["marks"] == 0 and charts[missing]["notes"] == 1, (missing, charts[missing])
        assert charts[missing]["svgWidth"] == 0, "no empty axes where there is no data"


def test_the_problem_check_sees_a_blocked_load(tmp_path: Path) -> None:
    """The no-problems assertions above can fail: an external image in the page is blocked and logged."""
    write_run(tmp_path / "metrics.jsonl", steps=1, groups=2)
    page = tmp_path / "report.html"
    main(tmp_path, page)
    html = page.read_text(encoding="utf-8")
    page.write_text(html.replace("<h1>", '<img src="https://example.invalid/x.png"><h1>'), encoding="utf-8")

    _, problems, _ = render_in_browser(page, tmp_path / "profile", tmp_path / "shot.png")

    assert any("Content Security Policy" in p and "example.invalid" in p for p in problems), problems
