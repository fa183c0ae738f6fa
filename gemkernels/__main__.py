"""``python -m gemkernels`` is the ``gem`` command."""

import sys

from .cli import main

sys.exit(main())
