"""``python -m argus_core.cli``: the same as the ``argus`` console script."""

import sys

from argus_core.cli import main

sys.exit(main())
