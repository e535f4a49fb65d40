"""Native code of the exporters: the CUPTI callback shim (``cupti_shim.c``) and its builder.

``python -m argus_exporters._native build [--out DIR]`` builds it (see ``build.py``).
"""

from argus_exporters._native.build import ShimUnavailableError, build, locate

__all__ = ["ShimUnavailableError", "build", "locate"]
