"""``python -m argus_exporters._native build [--out DIR]``: build the CUPTI callback shim."""

import sys

from argus_exporters._native.build import main

sys.exit(main())
