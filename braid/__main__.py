"""``python -m braid``: the same as the ``braid`` console script."""

import sys

from braid.cli import main

sys.exit(main())
