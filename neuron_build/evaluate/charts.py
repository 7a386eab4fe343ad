"""matplotlib figures as inline SVG for the HTML report's sections (no pyplot: no global state, no GUI
backend), and what keeps many series readable: a marker per series (:data:`MARKERS`) and a small sideways
offset per series (:func:`dodge`), so series with equal values stay side by side instead of one dot hiding
the others. The ``report`` extra installs matplotlib."""

from __future__ import annotations

import io


def figure(width: float = 8.0, height: float = 3.2):
    """A new (figure, axes) of ``width`` x ``height`` inches at 96 dpi.

    Raises:
        ImportError: matplotlib is not installed.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=96)
    return fig, fig.add_subplot(1, 1, 1)


#: One marker per series, in turn (with the colour cycle: no two of the first 10 series look alike).
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "p", "h", "*")


def dodge(k: int, n: int, width: float = 0.5) -> float:
    """The sideways offset of series ``k`` of ``n`` at a categorical x position (1 apart): the series spread
    evenly over ``width`` around it, centred (0 for one series).

    >>> [round(dodge(k, 3), 3) for k in range(3)]
    [-0.12, 0.0, 0.12]
    """
    if n <= 1:
        return 0.0
    step = min(width / n, 0.12)
    return (k - (n - 1) / 2) * step


def svg(fig) -> str:
    """A matplotlib figure as inline SVG text (without the XML prolog and DOCTYPE; text kept as text)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


__all__ = ["MARKERS", "dodge", "figure", "svg"]
