"""matplotlib for the reports (replay, analysis, online replay, benchmark): imported only to draw."""

from __future__ import annotations

from typing import Any


def pyplot(extra: str = "replay") -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend; ImportError naming the extra that brings it."""
    try:
        import matplotlib
    except ImportError as err:
        raise ImportError(f"the plots need matplotlib: pip install 'gemkernels[{extra}]'") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
