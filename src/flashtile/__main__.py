"""``python -m flashtile`` is the ``flashtile`` console script."""

import sys

from flashtile.cli import main

sys.exit(main())
