"""The traffic section of ``neuron-build report --html FILE --traffic FILE...``: per model, the padding each
bucket cost on the recorded serving traffic, and the buckets that would cost least for as many NEFFs.

Per model (``<section id="traffic-MODEL">``): a table ``#traffic-MODEL-buckets`` (bucket, sizes, calls, real
and padded positions, padding ratio, from the runtime's per-bucket counts), a bar chart
``figure#chart-padding-MODEL`` of the padding ratio per bucket, and a table ``#traffic-MODEL-suggestion``
with the current buckets and the suggestion for the same number of buckets over every bucket dim
(:func:`neuron_build.project.bucket_search.suggestion`; padding ratios over the stored request shapes).
A table ``#traffic-MODEL-padding`` gives the padding as served (the bucket table summed), then the current
buckets' padding over all dims and over each dim alone, each with the ``buckets suggest`` command that
prints the same figure: one definition of padding (padded / real positions), the CLI's.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from neuron_build.project.config import Project
    from neuron_build.traffic import ModelTraffic


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", name)


def _pct(r: float | None) -> str:
    return "&mdash;" if r is None else f"{100 * r:.2f} %"


def _buckets(b: Mapping[str, list[int]]) -> str:
    return html.escape(" ".join(f"{d}={list(v)}" for d, v in b.items()))


def traffic_section(project: Project | None, traffic: Mapping[str, ModelTraffic]) -> str:
    """The HTML of the traffic section (``<h2>Traffic</h2>`` and one ``<section>`` per model in ``traffic``).

    Args:
        project: the project, for the models' current buckets (None: only the per-bucket padding).
        traffic: model -> summed traffic (:func:`neuron_build.traffic.load_traffic`).

    Raises:
        ImportError: matplotlib is not installed (the ``report`` extra).
    """
    from neuron_build.evaluate.report_html import bar_chart, chart_html
    from neuron_build.project.bucket_search import suggestion

    esc = html.escape
    parts = ["<h2 id=\"traffic\">Traffic</h2>"]
    for model, mt in traffic.items():
        sid = _slug(model)
        rows = mt.bucket_rows()
        trs = "".join(
            f"<tr><td>{esc(r['bucket'])}</td><td>{_buckets({d: [n] for d, n in r['sizes'].items()})}</td>"
            f"<td>{r['calls']}</td><td>{r['elements']}</td><td>{r['padded']}</td><td>{_pct(r['padding_ratio'])}</td></tr>"
            for r in rows)
        chart = chart_html(f"chart-padding-{sid}", f"Padding per bucket ({model})",
                           bar_chart([r["bucket"] for r in rows], [round(100 * r["padding_ratio"], 2) for r in rows],
                                      "padding (% of real positions)"), "no bucket ran")
        files = ", ".join(mt.files)
        out = [f"<section id=\"traffic-{sid}\"><h3>{esc(model)}</h3>",
               f"<p>{mt.calls} requests ({mt.unserved} no bucket could serve, {mt.overflow_calls} beyond the shape "
               f"cap) from {esc(files)}; releases {esc(', '.join(mt.releases)) or '&mdash;'}.</p>",
               f"<table id=\"traffic-{sid}-buckets\"><tr><th>bucket</th><th>sizes</th><th>calls</th>"
               f"<th>real positions</th><th>padded positions</th><th>padding</th></tr>{trs}</table>",
               chart]
        spec = project.config.models.get(model) if project is not None else None
        if spec is None or not spec.buckets:
            out.append("<p>Not a model of this project with bucket dims: no suggestion.</p>")
        else:
            dims = list(spec.buckets)
            shapes_ok = all(all(d in dict(k) for d in dims) for k, _b in mt.shapes)
            budget = math.prod(len(v) for v in spec.buckets.values())
            if not shapes_ok or not mt.shapes:
                out.append(f"<p>The traffic lacks one of the bucket dims {esc(', '.join(dims))} or holds no "
                           f"request: no suggestion.</p>")
            else:
                out.append(_padding_by_dims(model, sid, spec, mt, dims, rows))
                doc = suggestion(spec, mt, dims, budget)
                cur, sug = doc["current"], doc["suggested"]
                out.append(
                    f"<table id=\"traffic-{sid}-suggestion\"><tr><th></th><th>buckets</th><th>NEFFs</th>"
                    f"<th>padding</th><th>unserved</th></tr>"
                    f"<tr><td>current</td><td>{_buckets(cur['buckets'])}</td><td>{cur['neffs']}</td>"
                    f"<td>{_pct(cur['padding_ratio'])}</td><td>{cur['unserved']}</td></tr>"
                    f"<tr><td>suggested</td><td>{_buckets(sug['buckets'])}</td><td>{sug['neffs']}</td>"
                    f"<td>{_pct(sug['padding_ratio'])}</td><td>{sug['unserved']}</td></tr></table>"
                    f"<p>Suggestion for at most {budget} buckets ({esc(doc['method'])}); "
                    f"<code>neuron-build buckets suggest {esc(model)} --traffic ... --max-buckets K</code> "
                    f"shows every K and writes them with <code>--write</code>.</p>")
        out.append("</section>")
        parts.append("\n".join(out))
    return "\n".join(parts)


def _padding_by_dims(model: str, sid: str, spec, mt, dims: list[str], served: list[dict]) -> str:
    """The table ``#traffic-MODEL-padding``: the padding as served (the runtime's per-bucket counts of
    ``served`` summed: padded / real positions of the bucket-dim grid), then the current buckets' padding
    over all bucket dims and over each dim alone, each the figure ``buckets suggest MODEL [--dim D]`` prints
    as "current" (the same function, :func:`~neuron_build.project.bucket_search.suggestion`; one dim alone
    sums the others out, so its figure differs from the grid's)."""
    from neuron_build.project.bucket_search import suggestion

    esc = html.escape
    real, padded = sum(r["elements"] for r in served), sum(r["padded"] for r in served)
    rows = [f"<tr><td>as served ({esc(' x '.join(mt.dims or dims))}; the buckets above, summed)</td>"
            f"<td>{_pct(padded / real if real else None)}</td><td>{mt.unserved}</td><td>&mdash;</td></tr>"]
    for ds in ([dims] if len(dims) > 1 else []) + [[d] for d in dims]:
        cur = suggestion(spec, mt, ds, 1)["current"]
        cmd = f"neuron-build buckets suggest {model}" + "".join(f" --dim {d}" for d in ds if len(ds) < len(dims))
        rows.append(f"<tr><td>{esc(' x '.join(ds))}</td><td>{_pct(cur['padding_ratio'])}</td>"
                    f"<td>{cur['unserved']}</td><td><code>{esc(cmd)}</code></td></tr>")
    return (f"<table id=\"traffic-{sid}-padding\"><tr><th>over dims</th><th>padding of the current buckets</th>"
            f"<th>unserved</th><th>the same figure in the CLI (current)</th></tr>{''.join(rows)}</table>")


__all__ = ["traffic_section"]
