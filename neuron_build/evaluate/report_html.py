"""``neuron-build report --html FILE``: one self-contained HTML page (no network needed to view it).

The charts are drawn by matplotlib (the ``report`` extra: ``pip install 'neuron-build[report]'``) as SVG and
inlined into the page, with the style sheet; the page loads nothing and runs no script. Charts, each an
``<svg>`` inside a ``<figure id=...>``:

- ``chart-compile-time``: compile time per target over its builds (seconds; failed compiles as crosses);
- ``chart-op-count``: op count per target (newest passing artifact);
- ``chart-artifact-size``: artifact size per target (MiB);
- ``chart-failures``: failed compiles by failure stage.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Sequence

from neuron_build.evaluate.monitoring import Report

CHARTS = ("chart-compile-time", "chart-op-count", "chart-artifact-size", "chart-failures")

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
td:nth-child(2), td:nth-child(3) { white-space: nowrap; }
th { background: #f0f0f0; }
td.ok { color: #176317; font-weight: bold; }
td.ALERT { color: #b00020; font-weight: bold; }
td.nm { color: #666; font-style: italic; }
figure { margin: 1.5em 0; }
figcaption { font-weight: bold; margin-bottom: .5em; }
"""


def _svg(fig) -> str:
    """A matplotlib figure as inline SVG text (without the XML prolog and DOCTYPE)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text (searchable, small)
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _figure(width: float = 8.0, height: float = 3.2):
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    fig = Figure(figsize=(width, height), dpi=96)
    return fig, fig.add_subplot(1, 1, 1)


def _compile_time_chart(rep: Report) -> str:
    fig, ax = _figure()
    drawn = False
    for t in rep.targets:
        pts = [(i, b["compile_time_s"], b["status"]) for i, b in enumerate(t["builds"], 1)
               if b["compile_time_s"] is not None]
        if not pts:
            continue
        drawn = True
        line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=t["target"])
        bad = [p for p in pts if p[2] != "PASS"]
        if bad:
            ax.scatter([p[0] for p in bad], [p[1] for p in bad], marker="x", s=80, color=line.get_color())
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("build of the target (1 = first in the window)")
    ax.set_ylabel("compile time (s)")
    if drawn:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.text(0.5, 0.5, "no compiles in the window", ha="center", va="center", transform=ax.transAxes)
    return _svg(fig)


def _bar_chart(labels: list[str], values: list[float], xlabel: str, empty: str) -> str:
    fig, ax = _figure(8.0, max(1.6, 0.35 * len(labels) + 0.8))
    if labels:
        ax.barh(labels, values, color="#4472c4")
        ax.invert_yaxis()
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:g}", va="center", fontsize="small")
    else:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(xlabel)
    return _svg(fig)


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
    charts = {
        "chart-compile-time": ("Compile time per target over builds", _compile_time_chart(rep)),
        "chart-op-count": ("Op count per target", _bar_chart([t["target"] for t in with_ops],
                                                              [t["op_count"] for t in with_ops], "op count",
                                                              "no passing artifacts in the window")),
        "chart-artifact-size": ("Artifact size per target", _bar_chart(
            [t["target"] for t in with_size], [round(t["artifact_bytes"] / 2**20, 3) for t in with_size],
            "artifact size (MiB)", "no passing artifacts in the window")),
        "chart-failures": ("Failed compiles by failure stage", _bar_chart(
            list(rep.failures_by_stage), list(rep.failures_by_stage.values()), "failed compiles",
            "no failed compiles in the window")),
    }
    figs = "\n".join(f"<figure id=\"{cid}\"><figcaption>{esc(title)}</figcaption>{svg}</figure>"
                     for cid, (title, svg) in charts.items())
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>neuron-build report</title>
<style>{_CSS}</style></head>
<body>
<h1>neuron-build report</h1>
<p>Store {esc(rep.location)}; window since {esc(since)} until {esc(rep.until.strftime('%Y-%m-%d %H:%M UTC'))}:
{c['compiles']} compiles ({c['failed']} failed), {c['cached']} cache hits, {c['reused']} reuses.</p>
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


__all__ = ["CHARTS", "render_html"]
