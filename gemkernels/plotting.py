"""matplotlib for the reports (replay, analysis, online replay, benchmark): imported only to draw."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend; ImportError naming the extras that bring it."""
    try:
        import matplotlib
    except ImportError as err:
        raise ImportError("the plots need matplotlib: pip install 'gemkernels[replay]' (or '[bench]')") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
