"""What the GPU scripts share: imports from a plain checkout, the deadline, the JSON result.

The device machine runs the scripts from a copy of the working tree, with only the wheels
carried in ``.whl/`` (see bench/gpu_all.sh): Argus itself is not installed there, so
``argus_exporters`` is loaded from ``exporters/`` when the installed package is missing.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def ensure_argus_exporters() -> str:
    """Make ``argus_exporters`` importable; returns where it came from."""
    try:
        import argus_exporters

        return str(Path(argus_exporters.__file__).parent)
    except ImportError:  # not installed, or its __init__ needs what is not here: a bare package
        for name in [m for m in sys.modules if m.split(".")[0] == "argus_exporters"]:
            del sys.modules[name]
        package = types.ModuleType("argus_exporters")
        package.__path__ = [str(REPO / "exporters")]
        sys.modules["argus_exporters"] = package
        return f"{REPO / 'exporters'} (plain checkout)"


def stub_orjson() -> bool:
    """A stand-in ``orjson`` for scripts that never encode records; True if it was needed."""
    try:
        import orjson  # noqa: F401

        return False
    except ImportError:
        stub = types.ModuleType("orjson")
        stub.OPT_SERIALIZE_NUMPY, stub.OPT_APPEND_NEWLINE = 1 << 4, 1 << 10

        def dumps(*args: Any, **kwargs: Any) -> bytes:
            raise NotImplementedError("orjson is stubbed: carry its cp312 wheel")

        stub.dumps = dumps
        sys.modules["orjson"] = stub
        return True


def no_gpu_reason(need_cupti: bool) -> str | None:
    """Why this machine cannot run a GPU check (None when it can)."""
    try:
        import torch
    except Exception as exc:
        return f"torch is not installed ({exc})"
    if not torch.cuda.is_available():
        return (f"no GPU: torch {torch.__version__} reports torch.cuda.is_available() is False "
                f"(CUDA build: {torch.version.cuda})")
    if need_cupti:
        try:
            from cupti import cupti  # noqa: F401
        except Exception as exc:
            return f"cupti-python is not importable ({exc}); pip-install the carried wheel"
    return None


def versions() -> dict[str, str | None]:
    """Versions of what the checks depend on (None where missing)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in ("torch", "cupti-python", "nvidia-cuda-cupti", "cuda-bindings", "numpy",
                 "orjson", "py-spy", "prometheus-client"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


class Deadline:
    """Seconds left of an overall budget (monotonic clock)."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def remaining(self) -> float:
        """Seconds left (0 when spent)."""
        return max(0.0, self.end - time.monotonic())


def free_port() -> int:
    """A TCP port free on loopback now (argus_core's ``free_port`` is not importable on the
    device machine, which has only the carried wheels)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_json(result: dict, out: str | None) -> str:
    """Write ``result`` to ``out`` (if given) as one JSON line; returns the text."""
    text = json.dumps(result, default=str)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".part")
        partial.write_text(text + "\n")
        partial.replace(path)
    return text


def finish(result: dict, out: str | None, code: int) -> int:
    """Print ``result`` as the last line (one JSON object), write it to ``out``; return code."""
    print(write_json(result, out), flush=True)
    return code


def default_out(name: str) -> str | None:
    """``$OUT/<name>`` when the device tool's ``OUT`` is set, else None."""
    folder = os.environ.get("OUT")
    return str(Path(folder) / name) if folder else None
