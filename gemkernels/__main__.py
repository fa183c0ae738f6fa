"""``python -m gemkernels`` is the ``gem`` command."""

import sys

from gemkernels.cli import main

sys.exit(main())
