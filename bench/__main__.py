"""``python -m bench``: the selection throughput sweep, the same runner as ``gem bench``
(`gemkernels.benchmark`), writing to bench/out/sweep/ (gitignored) unless ``--out`` is given;
``python -m bench --help`` lists the grid, timing and output options."""

import sys
from pathlib import Path

from gemkernels.benchmark.sweep import main

sys.exit(main(default_out=Path(__file__).resolve().parent / "out" / "sweep"))
