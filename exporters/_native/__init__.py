"""Native code of the exporters: the CUPTI callback shim (``cupti_shim.c``), the bulk event
reader (``events.c``), the collective hooks (``hooks.c``, loaded by ``extension.py``) and their
builder.

``python -m argus_exporters._native build [--out DIR]`` builds them (see ``build.py``).
"""

from argus_exporters._native.build import ShimUnavailableError, build, locate

__all__ = ["ShimUnavailableError", "build", "locate"]
