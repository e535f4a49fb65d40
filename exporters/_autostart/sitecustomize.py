"""Put on PYTHONPATH by ``argus run``: activates Argus, then runs any other sitecustomize."""

import importlib.util
import os
import sys

try:
    from argus_exporters.auto import install

    install()
except Exception as exc:  # never stop the interpreter from starting
    print(f"argus: auto-instrumentation disabled: {exc}", file=sys.stderr)

_here = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:
    _candidate = os.path.join(_entry or ".", "sitecustomize.py")
    if os.path.abspath(_entry or ".") != _here and os.path.isfile(_candidate):
        _spec = importlib.util.spec_from_file_location("_argus_chained_sitecustomize", _candidate)
        if _spec and _spec.loader:
            _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
        break
