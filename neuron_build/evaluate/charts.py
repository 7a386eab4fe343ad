"""matplotlib figures as inline SVG for the HTML report's sections (no pyplot: no global state, no GUI
backend). The ``report`` extra installs matplotlib."""

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


def svg(fig) -> str:
    """A matplotlib figure as inline SVG text (without the XML prolog and DOCTYPE; text kept as text)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


__all__ = ["figure", "svg"]
