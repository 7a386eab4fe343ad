"""The registry section of ``report --html``: per model the channels and the release each holds, the
promotion / refusal / rollback timeline, every release's buckets with gate verdicts, validation and benchmark
figures, and two charts drawn by matplotlib (inline SVG, as the rest of the page).

It draws the document :func:`neuron_build.release.registry.registry_doc` makes (the one ``report --json``
prints under ``registry``), so the page and the JSON show the same numbers. Element ids, per model ``M``
(the model name with anything but letters, digits, ``-`` and ``_`` replaced by ``_``):

- ``registry-M``: the model's ``<section>``; ``channels-M``, ``timeline-M``, ``releases-M``: its tables. Each
  bucket row of ``releases-M`` carries ``data-release`` and ``data-target``; its figure cells carry
  ``data-field`` (``op_count``, ``compile_time_s``, ``artifact_bytes``, ``p50_ms``, ``p99_ms``) and
  ``data-value`` (the JSON number, empty for none).
- ``chart-latency-M``: benchmark p50 (solid) and p99 (dashed) per release and target, in ms;
  ``chart-ops-M``: op count per release and target. A chart with nothing to draw is one ``<p class="empty">``
  line with the same id instead.

A target no longer in the matrix is marked in the tables (``class="gone"``) and in the chart legends.
Legends sit beside the axes in as many columns as needed (at most 14 entries a column), so they stay
readable with many targets; each target has its own marker and is nudged sideways at each release
(:func:`~neuron_build.evaluate.charts.dodge`), so targets with equal figures do not hide one another.
"""

from __future__ import annotations

import html
import math
import re
from typing import Any

from neuron_build.evaluate.charts import MARKERS, dodge
from neuron_build.evaluate.charts import figure as _figure
from neuron_build.evaluate.charts import svg as _svg
from neuron_build.status import Verdict

CSS = """
section.registry-model { margin: 1.5em 0 3em; }
tr.gone td, span.gone { color: #8a5a00; }
span.gone { font-size: small; font-style: italic; }
td.pass { color: #176317; } td.fail, td.refuse { color: #b00020; } td.rollback { color: #8a5a00; }
p.empty { color: #666; font-style: italic; }
"""

_ACTION = {"promote": "promoted", "refuse": "refused", "rollback": "rolled back"}
GONE = "no longer in the matrix"


def _id(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", model)


def _num(v: Any, fmt: str) -> str:
    return "&mdash;" if v is None else html.escape(fmt.format(v))


def _cell(field: str, v: Any, fmt: str) -> str:
    return f'<td data-field="{field}" data-value="{"" if v is None else html.escape(repr(v))}">{_num(v, fmt)}</td>'


def first_bench(bucket: dict[str, Any]) -> dict[str, Any]:
    """The benchmark record a bucket's chart point and table cells show: the first by name (``{}`` when
    none)."""
    bench = bucket.get("bench") or {}
    return bench[sorted(bench)[0]] if bench else {}


def _series(model: dict[str, Any], field: str) -> dict[str, list[tuple[int, float]]]:
    """Target id -> [(release index, value)] of one figure (``p50_ms``, ``p99_ms`` or ``op_count``)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for i, rel in enumerate(model["releases"]):
        for b in rel["buckets"]:
            v = first_bench(b).get(field) if field.endswith("_ms") else b.get(field)
            if v is not None:
                out.setdefault(b["target"], []).append((i, float(v)))
    return out


def _chart(model: dict[str, Any], fields: tuple[str, ...], ylabel: str) -> str | None:
    """The SVG of one per-release chart, or None when there is no point to draw."""
    series = [_series(model, f) for f in fields]
    targets = list(dict.fromkeys(t for s in series for t in s))
    if not targets:
        return None
    gone = {b["target"] for rel in model["releases"] for b in rel["buckets"] if not b["in_matrix"]}
    per_col = 14
    ncol = math.ceil(len(targets) / per_col)
    rels = model["releases"]
    fig, ax = _figure(max(5.0, 1.1 * len(rels) + 3.0) + 2.6 * ncol,
                      max(3.2, 0.22 * min(len(targets), per_col) + 1.2))
    for k, t in enumerate(targets):  # each target its own marker, nudged sideways: equal values stay visible
        dx = dodge(k, len(targets))
        pts = series[0].get(t, [])
        label = t + (f" ({GONE})" if t in gone else "")
        style = {"marker": MARKERS[k % len(MARKERS)], "markerfacecolor": "none" if t in gone else None}
        line, = ax.plot([p[0] + dx for p in pts], [p[1] for p in pts], label=label, alpha=0.85, **style)
        for s in series[1:]:
            extra = s.get(t, [])
            if extra:
                ax.plot([p[0] + dx for p in extra], [p[1] for p in extra], linestyle="--",
                        marker=MARKERS[k % len(MARKERS)], color=line.get_color(), markerfacecolor="none")
    ax.set_xticks(range(len(rels)))
    ax.set_xticklabels([f"{r['id'][:10]}\n{r['dtype']}/{r['profile']}" for r in rels], fontsize="small")
    ax.set_xlim(-0.5, len(rels) - 0.5)
    ax.set_xlabel("release (oldest first)")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="x-small" if len(targets) > per_col else "small", loc="upper left",
              bbox_to_anchor=(1.01, 1.0), ncol=ncol, frameon=False)
    return _svg(fig)


def _figure_html(cid: str, title: str, svg: str | None, empty: str) -> str:
    if svg is None:
        return f'<p class="empty" id="{cid}">{html.escape(empty)}</p>'
    return f'<figure id="{cid}"><figcaption>{html.escape(title)}</figcaption>{svg}</figure>'


def _gates_text(gates: list[dict[str, Any]]) -> str:
    """``dev promote: pass; prod refuse: fail channel_order`` for a release's promotions."""
    parts = []
    for g in gates:
        bad = [x["name"] for x in g["gates"] if x["verdict"] == Verdict.FAIL]
        waived = [x["name"] for x in g["gates"] if x["verdict"] == Verdict.WAIVED]
        word = f"{Verdict.FAIL} {', '.join(bad)}" if bad else str(Verdict.PASS)
        if waived:
            word += " (waived " + ", ".join(waived) + ")"
        parts.append(f"{g['channel']} {g['action']}: {word}")
    return "; ".join(parts)


def _model_section(m: dict[str, Any]) -> str:
    esc = html.escape
    mid = _id(m["model"])
    ch_rows = "".join(
        f"<tr><td>{esc(c['channel'])}{'' if c['declared'] else ' <span class=gone>(not declared)</span>'}</td>"
        f"<td>{esc(c['release'] or '(empty)')}</td><td>{c['version'] if c['version'] is not None else '&mdash;'}</td>"
        f"<td>{esc(_ACTION.get(c['action'], c['action'])) if c['action'] else '&mdash;'}</td><td>{esc(c['time'] or '')}</td>"
        f"<td>{esc(c['who'] or '')}</td></tr>" for c in m["channels"])
    tl_rows = []
    for e in m["timeline"]:
        note = e["reason"] or ""
        if e["refused"]:
            note = e["refused"] + (f" ({note})" if note else "")
        gates = ""
        if e["failed_gates"]:
            gates = "failed: " + ", ".join(e["failed_gates"])
        if e["waived_gates"]:
            gates += ("; " if gates else "") + "waived: " + ", ".join(e["waived_gates"])
        tl_rows.append(f"<tr><td>{esc(e['time'] or '')}</td><td>{esc(e['channel'])}</td>"
                       f"<td class=\"{esc(e['action'])}\">{esc(_ACTION.get(e['action'], e['action']))}</td>"
                       f"<td>{esc(e['from'] or '(empty)')} &rarr; {esc(e['to'] or '')}</td>"
                       f"<td>{e['version'] if e['version'] is not None else '&mdash;'}</td>"
                       f"<td>{esc(e['who'] or '')}</td><td>{esc(gates)}</td><td>{esc(note)}</td></tr>")
    rel_rows = []
    for rel in m["releases"]:
        head = (f"{esc(rel['id'])}<br>{esc(rel['dtype'])}/{esc(rel['profile'])} ({esc(rel['backend'])})"
                + (f"<br>channels: {esc(', '.join(rel['channels']))}" if rel["channels"] else "")
                + ("<br><b>rolled back</b> from " + esc(", ".join(r["channel"] for r in rel["rolled_back"]))
                   if rel["rolled_back"] else ""))
        n = max(1, len(rel["buckets"]))
        gates = esc(_gates_text(rel["gates"]) or "never promoted")
        for i, b in enumerate(rel["buckets"]):
            bench = first_bench(b)
            val = ", ".join(f"{k} {v['verdict']}" + (f" ({v['error']})" if v.get("error") else "")
                            for k, v in b["validation"].items()) or "not validated"
            verdicts = {v["verdict"] for v in b["validation"].values()}
            vcls = str(Verdict.FAIL) if Verdict.FAIL in verdicts else (str(Verdict.PASS) if verdicts == {Verdict.PASS} else "")
            lead = (f'<td rowspan="{n}">{head}</td><td rowspan="{n}">{gates}</td>' if i == 0 else "")
            target = esc(b["target"]) + ("" if b["in_matrix"] else f' <span class="gone">({GONE})</span>')
            rel_rows.append(
                f'<tr class="{"bucket" if b["in_matrix"] else "bucket gone"}" data-release="{esc(rel["id"])}" '
                f'data-target="{esc(b["target"])}">{lead}<td>{target}</td><td><code>{esc(b["key"][:12])}</code></td>'
                + _cell("op_count", b["op_count"], "{}") + _cell("compile_time_s", b["compile_time_s"], "{:.2f}")
                + _cell("artifact_bytes", b["artifact_bytes"], "{:,}")
                + f'<td class="{vcls}">{esc(val)}</td>'
                + _cell("p50_ms", bench.get("p50_ms"), "{:.4g}") + _cell("p99_ms", bench.get("p99_ms"), "{:.4g}")
                + "</tr>")
    name = esc(m["model"]) + ("" if m["in_config"] else ' <span class="gone">(not in buckets.toml)</span>')
    charts = (_figure_html(f"chart-latency-{mid}", f"{m['model']}: latency per release (p50 solid, p99 dashed; ms)",
                           _chart(m, ("p50_ms", "p99_ms"), "latency (ms)"),
                           f"no benchmark recorded for {m['model']}'s releases (run `neuron-build bench`)")
              + _figure_html(f"chart-ops-{mid}", f"{m['model']}: op count per release",
                             _chart(m, ("op_count",), "op count"),
                             f"no op count recorded for {m['model']}'s releases"))
    if not m["releases"]:
        return (f'<section class="registry-model" id="registry-{mid}"><h3>{name}</h3>'
                f'<p class="empty">no releases yet (`neuron-build release {esc(m["model"])}`)</p></section>')
    return f"""<section class="registry-model" id="registry-{mid}"><h3>{name}</h3>
<table id="channels-{mid}"><tr><th>channel</th><th>release</th><th>version</th><th>last move</th><th>time</th><th>by</th></tr>
{ch_rows}</table>
<table id="timeline-{mid}"><tr><th>time</th><th>channel</th><th>action</th><th>release</th><th>version</th><th>by</th>
<th>gates</th><th>reason</th></tr>
{''.join(tl_rows) or '<tr><td colspan="8">no promotions yet</td></tr>'}</table>
<table id="releases-{mid}"><tr><th>release</th><th>gates</th><th>target</th><th>key</th><th>op count</th>
<th>compile (s)</th><th>artifact (bytes)</th><th>validation</th><th>p50 (ms)</th><th>p99 (ms)</th></tr>
{''.join(rel_rows)}</table>
{charts}
</section>"""


def render_registry(doc: dict[str, Any] | None) -> str:
    """The ``<section id="registry">`` of the page for a registry document (None or no models: one line).

    Raises:
        ImportError: matplotlib is not installed (the ``report`` extra).
    """
    if not doc or not doc.get("models"):
        return '<section id="registry"><h2>Registry</h2><p class="empty">no models</p></section>'
    body = "\n".join(_model_section(m) for m in doc["models"])
    return f'<section id="registry"><h2>Registry</h2>\n<style>{CSS}</style>\n{body}\n</section>'


__all__ = ["CSS", "GONE", "first_bench", "render_registry"]
