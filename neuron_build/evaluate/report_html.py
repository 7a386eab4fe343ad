"""``neuron-build report --html FILE``: one self-contained HTML page (no network needed to view it).

The charts are drawn by matplotlib (the ``report`` extra: ``pip install 'neuron-build[report]'``) as SVG and
inlined into the page, with the style sheet; the page loads nothing and runs no script. Charts, each an
``<svg>`` inside a ``<figure id=...>``:

- ``chart-compile-time``: compile time per target over its builds (seconds; failed compiles as crosses);
- ``chart-op-count``: op count per target (newest passing artifact);
- ``chart-artifact-size``: artifact size per target (MiB);
- ``chart-failures``: failed compiles by failure stage.

A chart with nothing to draw is one ``<p class="empty">`` line with the same id instead ("no failures: ...").
Tables wider than the page scroll inside it, long cells wrap, and charts shrink to the page width.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

from neuron_build.evaluate import charts
from neuron_build.evaluate.monitoring import Report
from neuron_build.status import Status

CHARTS = ("chart-compile-time", "chart-op-count", "chart-artifact-size", "chart-failures")

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; display: block; max-width: 100%; overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; overflow-wrap: break-word; }
td code { overflow-wrap: anywhere; }
figure svg { max-width: 100%; height: auto; }
p.empty { color: #666; font-style: italic; }
td:nth-child(2), td:nth-child(3) { white-space: nowrap; }
th { background: #f0f0f0; }
td.ok { color: #176317; font-weight: bold; }
td.ALERT { color: #b00020; font-weight: bold; }
td.nm { color: #666; font-style: italic; }
figure { margin: 1.5em 0; }
figcaption { font-weight: bold; margin-bottom: .5em; }
"""


def _compile_time_chart(rep: Report) -> str | None:
    """Compile time per target over its builds (x: the target's build number, whole numbers only; each
    target its own marker, nudged sideways so equal times stay visible); None when nothing compiled."""
    series = []
    for t in rep.targets:
        pts = [(i, b["compile_time_s"], b["status"]) for i, b in enumerate(t["builds"], 1)
               if b["compile_time_s"] is not None]
        if pts:
            series.append((t["target"], pts))
    if not series:
        return None
    fig, ax = charts.figure(8.0, max(3.2, 0.22 * min(len(series), 14) + 1.2))
    for k, (name, pts) in enumerate(series):
        dx = charts.dodge(k, len(series))
        mark = charts.MARKERS[k % len(charts.MARKERS)]
        line, = ax.plot([p[0] + dx for p in pts], [p[1] for p in pts], marker=mark, markersize=6, label=name,
                        alpha=0.85)
        bad = [p for p in pts if p[2] != Status.PASS]
        if bad:
            ax.scatter([p[0] + dx for p in bad], [p[1] for p in bad], marker="x", s=80, color=line.get_color())
    last = max(p[0] for _n, pts in series for p in pts)
    ax.set_xticks(range(1, last + 1))
    ax.set_xlim(0.5, last + 0.5)
    ax.set_xlabel("build of the target (1 = first in the window)")
    ax.set_ylabel("compile time (s)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
              ncol=max(1, -(-len(series) // 14)))
    return charts.svg(fig)


def bar_chart(labels: list[str], values: list[float], xlabel: str, empty: str = "") -> str | None:
    """A horizontal bar chart (SVG), None when there is no bar (the caller says so in words: an empty axes
    reads as a chart of zeros)."""
    if not labels:
        return None
    fig, ax = charts.figure(8.0, max(1.6, 0.35 * len(labels) + 0.8))
    ax.barh(labels, values, color="#4472c4")
    ax.invert_yaxis()
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:g}", va="center", fontsize="small")
    ax.set_xlabel(xlabel)
    return charts.svg(fig)


def chart_html(cid: str, title: str, svg: str | None, empty: str) -> str:
    """``<figure id=cid>`` with its caption and SVG, or, with nothing drawn, one ``<p class="empty">`` line
    with the same id saying so (``empty``)."""
    esc = html.escape
    if svg is None:
        return f'<p class="empty" id="{cid}"><b>{esc(title)}:</b> {esc(empty)}</p>'
    return f'<figure id="{cid}"><figcaption>{esc(title)}</figcaption>{svg}</figure>'


def render_html(rep: Report, sections: Sequence[str] = (), registry: dict | None = None) -> str:
    """The report as one HTML page (text): the checklist table, the per-target table and the four charts;
    with ``registry`` (:func:`neuron_build.release.registry.registry_doc`) also the registry section
    (:mod:`neuron_build.evaluate.registry`), then ``sections`` (HTML fragments, e.g.
    :func:`neuron_build.evaluate.traffic_html.traffic_section`).

    Raises:
        ImportError: matplotlib is not installed (the ``report`` extra).
    """
    esc = html.escape
    c = rep.counts()
    since = rep.since.strftime("%Y-%m-%d %H:%M UTC") if rep.since else "the beginning of the ledger"
    rows = []
    for s in rep.signals:
        cls = {"ok": "ok", "ALERT": "ALERT"}.get(s.verdict, "nm")
        fig = "&mdash;" if s.value is None else esc(f"{s.value:g}")
        lim = esc(f"{'>=' if s.kind == 'min' else '<='} {s.limit:g}")
        rows.append(f"<tr><td>{esc(s.name)}</td><td>{fig}</td><td>{lim}</td><td class=\"{cls}\">{esc(s.verdict)}</td>"
                    f"<td>{esc(s.detail)}</td><td>{esc(s.action)}</td></tr>")
    trows = []
    for t in rep.targets:
        times = [b["compile_time_s"] for b in t["builds"] if b["compile_time_s"] is not None]
        size = f"{t['artifact_bytes'] / 2**20:.2f}" if t["artifact_bytes"] is not None else "&mdash;"
        peak = f"{t['peak_rss_bytes'] / 2**20:.0f}" if t["peak_rss_bytes"] is not None else "&mdash;"
        trows.append(f"<tr><td>{esc(t['target'])}</td><td>{esc(str(t['last_status']))}</td><td>{t['compiles']}</td>"
                     f"<td>{t['failures']}</td><td>{t['cache_hits']}</td>"
                     f"<td>{esc(', '.join(f'{x:.1f}' for x in times)) or '&mdash;'}</td>"
                     f"<td>{t['op_count'] if t['op_count'] is not None else '&mdash;'}</td><td>{size}</td>"
                     f"<td>{peak}</td></tr>")
    with_ops = [t for t in rep.targets if t["op_count"] is not None]
    with_size = [t for t in rep.targets if t["artifact_bytes"] is not None]
    drawn = {
        "chart-compile-time": ("Compile time per target over builds", _compile_time_chart(rep),
                               "no compiles in the window"),
        "chart-op-count": ("Op count per target", bar_chart([t["target"] for t in with_ops],
                                                              [t["op_count"] for t in with_ops], "op count"),
                           "no passing artifacts in the window"),
        "chart-artifact-size": ("Artifact size per target", bar_chart(
            [t["target"] for t in with_size], [round(t["artifact_bytes"] / 2**20, 3) for t in with_size],
            "artifact size (MiB)"), "no passing artifacts in the window"),
        "chart-failures": ("Failed compiles by failure stage", bar_chart(
            list(rep.failures_by_stage), list(rep.failures_by_stage.values()), "failed compiles"),
            f"no failures: none of the {c['compiles']} compiles in the window failed"),
    }
    figs = "\n".join(chart_html(cid, title, svg, empty) for cid, (title, svg, empty) in drawn.items())
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>neuron-build report</title>
<style>{_CSS}</style></head>
<body>
<h1>neuron-build report</h1>
<p>Store {esc(rep.location)}; window since {esc(since)} until {esc(rep.until.strftime('%Y-%m-%d %H:%M UTC'))}:
{c['compiles']} compiles ({c['failed']} failed), {c['cached']} cache hits, {c['reused']} reuses,
{c['graph_reused']} graph reuses (source changed, graph unchanged: nothing compiled).</p>
<h2>Checklist</h2>
<table id="checklist"><tr><th>signal</th><th>figure</th><th>limit</th><th>verdict</th><th>detail</th><th>action</th></tr>
{''.join(rows)}
</table>
<h2>Targets</h2>
<table id="targets"><tr><th>target</th><th>last status</th><th>compiles</th><th>failed</th><th>cache hits</th>
<th>compile times (s)</th><th>op count</th><th>artifact (MiB)</th><th>peak memory (MiB)</th></tr>
{''.join(trows)}
</table>
<h2>Charts</h2>
{figs}
{_registry_section(registry)}
{''.join(sections)}
</body></html>
"""
    return re.sub(r"<!--.*?-->", "", page, flags=re.S)


def _registry_section(registry: dict | None) -> str:
    if registry is None:
        return ""
    from neuron_build.evaluate.registry import render_registry

    return render_registry(registry)


__all__ = ["CHARTS", "bar_chart", "chart_html", "render_html"]
