"""The server-rendered SVG charts (gateway/reports/svg.py): well-formed, script-free, every
label escaped (team names and model ids come from callers and operators), deterministic."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime

import pytest

from gateway.reports import DailyUsage, UsageReport, bar_chart, line_chart, usage_charts
from gateway.reports.svg import short_number

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = [
    "<script>alert(1)</script>",
    '"><svg onload="alert(2)">',
    "' onmouseover='alert(3)",
    "&amp; &lt;b&gt; ]]> <!--",
    "javascript:alert(4)",
    "\x00\x07ctrl\x1b[31m",
]


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # our own output: well-formed XML or this raises
    assert root.tag == f"{SVG}svg"
    return root


def assert_inert(root: ET.Element) -> None:
    """No script, no event handler, no link, no inline style: nothing a browser would run."""
    for element in root.iter():
        assert element.tag.removeprefix(SVG) not in {
            "script",
            "foreignObject",
            "a",
            "use",
            "image",
            "style",
            "iframe",
        }
        for name, value in element.attrib.items():
            local = name.rsplit("}", 1)[-1].lower()
            assert not local.startswith("on"), name
            assert local not in {"style", "href"}, name
            assert "javascript:" not in value.lower()


def texts(root: ET.Element) -> list[str]:
    return ["".join(e.itertext()) for e in root.iter() if e.tag in (f"{SVG}text", f"{SVG}title")]


def test_bar_chart_is_well_formed_with_one_bar_per_label() -> None:
    root = parse(bar_chart("Requests", ["d1", "d2", "d3"], [10, 0, 5]))
    assert_inert(root)
    bars = root.findall(f"{SVG}rect")
    assert len(bars) == 3
    heights = [float(b.attrib["height"]) for b in bars]
    assert heights[1] == 0 and heights[0] == pytest.approx(2 * heights[2])
    assert [t.text for t in root.findall(f"{SVG}rect/{SVG}title")] == ["d1: 10", "d2: 0", "d3: 5"]
    assert root.find(f"{SVG}title") is not None  # the accessible name, first


@pytest.mark.parametrize("label", HOSTILE)
def test_hostile_labels_stay_text(label: str) -> None:
    shown_as = label.translate({c: None for c in range(0x20)})  # XML cannot hold controls
    for svg in (
        bar_chart(label, [label, "x"], [1, 2]),
        line_chart(label, ["a", label], {label: [1, 2], "ok": [2, 1]}),
    ):
        assert "<script" not in svg and "<svg onload" not in svg
        root = parse(svg)
        assert_inert(root)
        assert sum(shown_as in t for t in texts(root)) >= 3, texts(root)


def test_escaping_is_of_the_five_xml_specials() -> None:
    svg = bar_chart("t", ["<&>\"'"], [1])
    assert "&lt;&amp;&gt;&quot;&#x27;" in svg
    assert "<&>" not in svg


def test_the_same_data_gives_the_same_bytes() -> None:
    days = [f"2026-11-{d:02d}" for d in range(1, 31)]
    series = {"b": list(range(30)), "a": [3 * i for i in range(30)]}
    assert line_chart("t", days, series) == line_chart("t", days, dict(series))
    assert bar_chart("t", days, list(range(30))) == bar_chart("t", days, list(range(30)))


def test_line_chart_draws_each_series_with_a_legend_in_the_order_given() -> None:
    days = ["d1", "d2", "d3"]
    root = parse(line_chart("Tokens", days, {"team-b": [1, 2, 3], "team-a": [0, 0, 900]}))
    assert_inert(root)
    lines = root.findall(f"{SVG}polyline")
    assert [line.find(f"{SVG}title").text for line in lines] == ["team-b", "team-a"]  # type: ignore[union-attr]
    assert all(len(line.attrib["points"].split()) == 3 for line in lines)
    assert lines[0].attrib["stroke"] != lines[1].attrib["stroke"]
    assert len(root.findall(f"{SVG}circle")) == 6
    legend = [e.text for e in root.findall(f"{SVG}text")]
    assert "team-b" in legend and "team-a" in legend


def test_many_days_show_at_most_ten_axis_labels_but_every_point() -> None:
    days = [f"day{i}" for i in range(95)]
    root = parse(bar_chart("t", days, [1] * 95))
    shown = [e.text for e in root.findall(f"{SVG}text") if (e.text or "").startswith("day")]
    assert 1 < len(shown) <= 10 and shown[0] == "day0"
    assert len(root.findall(f"{SVG}rect")) == 95


def test_long_labels_are_cut() -> None:
    root = parse(line_chart("t", ["d"], {"x" * 500: [1]}))
    assert all(len(t) < 120 for t in texts(root))


def test_empty_and_mismatched_data() -> None:
    assert_inert(parse(bar_chart("empty", [], [])))
    assert_inert(parse(line_chart("empty", [], {})))
    with pytest.raises(ValueError):
        bar_chart("t", ["a"], [1, 2])
    with pytest.raises(ValueError):
        line_chart("t", ["a"], {"s": [1, 2]})


def test_axis_numbers_are_short() -> None:
    assert [short_number(v) for v in (0, 950, 1200, 648_054_920, 2e9)] == [
        "0",
        "950",
        "1.2k",
        "648.1M",
        "2G",
    ]


def test_usage_charts_cover_every_day_of_the_period_and_escape_team_names() -> None:
    def row(day: str, team: str | None, tokens: int) -> DailyUsage:
        return DailyUsage(
            day=day,
            team=team,
            model="m",
            requests=1,
            prompt_tokens=tokens,
            completion_tokens=0,
            policy_denied=0,
            rate_limited=0,
            auth_failures=0,
        )

    report = UsageReport(
        start=datetime(2026, 11, 1, 12, tzinfo=UTC),
        end=datetime(2026, 11, 4, tzinfo=UTC),
        team=None,
        model=None,
        rows=[row("2026-11-01", "<script>x</script>", 5), row("2026-11-03", None, 7)]
        + [row("2026-11-02", f"t{i}", i + 1) for i in range(8)],
    )
    requests, tokens = usage_charts(report)
    bars = parse(requests)
    assert [t.text for t in bars.findall(f"{SVG}rect/{SVG}title")] == [
        "2026-11-01: 1",
        "2026-11-02: 8",
        "2026-11-03: 1",
    ]
    lines = parse(tokens)
    assert_inert(lines)
    names = [p.find(f"{SVG}title").text for p in lines.findall(f"{SVG}polyline")]  # type: ignore[union-attr]
    assert len(names) == 7 and names[-1] == "(other)"  # six biggest teams, then the rest
    assert names[0] == "t7" and "<script>x</script>" not in tokens
