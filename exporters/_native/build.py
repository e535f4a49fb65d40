"""Build and find the CUPTI callback shim (``cupti_shim.c``): a plain C shared library.

Standard library only, so it also runs as a script from a plain checkout (the GPU scripts)::

    python exporters/_native/build.py [--out DIR]      # prints the path of the built library

Where the library comes from, first match wins:

1. ``ARGUS_CUPTI_SHIM=/path/libargus_cupti_shim.so``: a prebuilt library (e.g. built into a
   training image with this script, for images without a compiler).
2. The cache (``ARGUS_CACHE_DIR``, else ``$XDG_CACHE_HOME/argus``, else ``~/.cache/argus``;
   where that cannot be written, a private ``argus-cache-<uid>`` in the temp folder): a
   library built earlier from this exact source on this machine type.
3. A build with ``$CC``, ``cc`` or ``gcc`` into the cache (atomic rename, so ranks starting
   together on one host never see a half-written file).

No compiler and nothing prebuilt: ``ShimUnavailableError`` says so and how to fix it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "cupti_shim.c"
ABI = 1  # argus_shim_abi() of a library this Python code can drive
CFLAGS = ("-O2", "-shared", "-fPIC", "-pthread")
BUILD_TIMEOUT_S = 120


class ShimUnavailableError(RuntimeError):
    """The shim cannot be found or built here; the message says why and what to do."""


def library_name(source: Path = SOURCE) -> str:
    """File name of the library built from ``source``: ABI, source hash and machine type."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    return f"libargus_cupti_shim-{ABI}-{digest}-{platform.machine() or 'unknown'}.so"


def cache_dir(env: Mapping[str, str]) -> Path:
    """Where built libraries are kept (see the module docstring)."""
    if env.get("ARGUS_CACHE_DIR"):
        return Path(env["ARGUS_CACHE_DIR"])
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "argus"
    home = env.get("HOME")
    if home:
        return Path(home) / ".cache" / "argus"
    return private_temp_dir()


def private_temp_dir() -> Path:
    """``argus-cache-<uid>`` in the temp folder, made 0700 and checked to be this user's own
    (a library loaded from a folder others can write to would run their code)."""
    folder = Path(tempfile.gettempdir()) / f"argus-cache-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
    except OSError as exc:
        raise ShimUnavailableError(f"cannot make {folder}: {exc}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise ShimUnavailableError(f"{folder} is not a private folder of this user; "
                                   "set ARGUS_CACHE_DIR")
    return folder


def find_compiler(env: Mapping[str, str]) -> str | None:
    """``$CC`` if set (and found), else ``cc``, else ``gcc``, on ``$PATH``."""
    path = env.get("PATH", os.defpath)
    candidates = [env["CC"]] if env.get("CC") else ["cc", "gcc"]
    for name in candidates:
        found = shutil.which(name, path=path)
        if found:
            return found
    return None


def build(out_dir: Path, env: Mapping[str, str] | None = None,
          source: Path = SOURCE) -> Path:
    """Compile ``source`` into ``out_dir`` (kept if already there); raises ShimUnavailableError."""
    env = os.environ if env is None else env
    target = Path(out_dir) / library_name(source)
    if target.is_file():
        return target
    compiler = find_compiler(env)
    if compiler is None:
        raise ShimUnavailableError(
            "no C compiler (cc or gcc; CC=" + repr(env.get("CC", "")) + ") to build the CUPTI "
            "callback shim; prebuild it (python -m argus_exporters._native build) and set "
            "ARGUS_CUPTI_SHIM, or use a torch with native CUPTI callbacks (>= 2.13)")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(prefix=".shim-", suffix=".so", dir=target.parent)
        os.close(fd)
    except OSError as exc:
        raise ShimUnavailableError(f"cannot write the CUPTI shim to {target.parent}: {exc}; "
                                   "set ARGUS_CACHE_DIR to a writable folder") from None
    command = [compiler, *CFLAGS, "-o", partial, str(source)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                              check=False)
        if done.returncode != 0:
            raise ShimUnavailableError(f"building the CUPTI shim failed ({' '.join(command)}): "
                                       f"{done.stderr.strip()[-500:]}")
        os.replace(partial, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ShimUnavailableError(f"building the CUPTI shim failed: {exc}") from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def locate(env: Mapping[str, str] | None = None) -> Path:
    """The shim library to load: ``ARGUS_CUPTI_SHIM``, else cached, else built now."""
    env = os.environ if env is None else env
    prebuilt = env.get("ARGUS_CUPTI_SHIM")
    if prebuilt:
        if not os.path.isfile(prebuilt):
            raise ShimUnavailableError(f"ARGUS_CUPTI_SHIM={prebuilt!r} is not a file")
        return Path(prebuilt)
    if not SOURCE.is_file():
        raise ShimUnavailableError(f"the shim source {SOURCE} is missing from this install")
    preferred = cache_dir(env)
    try:
        return build(preferred, env)
    except ShimUnavailableError as exc:
        if env.get("ARGUS_CACHE_DIR") or not str(exc).startswith("cannot write"):
            raise
    return build(private_temp_dir(), env)  # e.g. a read-only home in a container


def main(argv: list[str] | None = None) -> int:
    """Build the shim (or find it in the cache) and print its path."""
    parser = argparse.ArgumentParser(description="Build the Argus CUPTI callback shim.")
    parser.add_argument("command", nargs="?", default="build", choices=["build"])
    parser.add_argument("--out", type=Path, help="folder for the library (default: the cache)")
    args = parser.parse_args(argv)
    try:
        path = build(args.out, os.environ) if args.out else locate(os.environ)
    except ShimUnavailableError as exc:
        print(f"argus: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
