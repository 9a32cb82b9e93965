"""``python -m swin``: the ``swin`` command, for environments where the console script is not on PATH."""

import sys

from .tools.cli import main

sys.exit(main())
