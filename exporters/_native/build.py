"""Build and find the exporters' native helpers: plain C shared libraries.

Three sources, each built on its own: the CUPTI callback shim (``cupti_shim.c``, for the
kernel probe on torch without native CUPTI callbacks), the bulk event reader (``events.c``, for
the phase probe's resolver: a batch of CUDA event reads with the GIL released once), both plain
C libraries loaded with ctypes, and the collective hooks' wrappers (``hooks.c``), a CPython
extension module built against this interpreter's headers (``python3-dev``).

Standard library only, so it also runs as a script from a plain checkout (the GPU scripts)::

    python exporters/_native/build.py [--out DIR]      # prints the path of the built library

Where the library comes from, first match wins:

1. ``ARGUS_CUPTI_SHIM=/path/libargus_cupti_shim.so`` (``ARGUS_EVENTS_LIB`` for the event
   reader, ``ARGUS_HOOKS_LIB`` for the hooks): a prebuilt library (e.g. built into a
   training image with this script, for images without a compiler).
2. The cache (``ARGUS_CACHE_DIR``, else ``$XDG_CACHE_HOME/argus``, else ``~/.cache/argus``;
   where that cannot be written, a private ``argus-cache-<uid>`` in the temp folder): a
   library built earlier from this exact source on this machine type.
3. A build with ``$CC``, ``cc`` or ``gcc`` into the cache (atomic rename, so ranks starting
   together on one host never see a half-written file).

A library shorter than its ELF headers say (truncated: loading it would kill the process with
SIGBUS) is never opened: a cached one is built again over it, a prebuilt one is refused with
that reason. A cached library that still does not open (``open_library``) is built once more
over it, so one bad file costs one build, not the native path for good.

No compiler and nothing prebuilt: ``ShimUnavailableError`` says so and how to fix it (the
event reader and the hooks are optional: without them the resolver reads events one ctypes
call at a time and the hooks' wrappers are Python functions).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

SOURCE = Path(__file__).resolve().parent / "cupti_shim.c"
EVENTS_SOURCE = SOURCE.with_name("events.c")
HOOKS_SOURCE = SOURCE.with_name("hooks.c")
ABI = 1  # argus_shim_abi() of a library this Python code can drive
EVENTS_ABI = 1  # argus_events_abi() of an event reader this Python code can drive
HOOKS_ABI = 3  # _argus_hooks.abi() of hooks this Python code can drive
ABIS = {SOURCE.name: ABI, EVENTS_SOURCE.name: EVENTS_ABI, HOOKS_SOURCE.name: HOOKS_ABI}
PREBUILT = {SOURCE.name: "ARGUS_CUPTI_SHIM", EVENTS_SOURCE.name: "ARGUS_EVENTS_LIB",
            HOOKS_SOURCE.name: "ARGUS_HOOKS_LIB"}
WHAT = {SOURCE.name: "the CUPTI callback shim", EVENTS_SOURCE.name: "the bulk event reader",
        HOOKS_SOURCE.name: "the collective hooks"}
CFLAGS = ("-O2", "-shared", "-fPIC", "-pthread")
BUILD_TIMEOUT_S = 120


class ShimUnavailableError(RuntimeError):
    """The shim cannot be found or built here; the message says why and what to do."""


def library_name(source: Path = SOURCE) -> str:
    """File name of the library built from ``source``: its name, ABI, source hash and machine
    type (and for an extension module, the interpreter it was built for)."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    interpreter = f"-{sys.implementation.cache_tag}" if source.name in EXTENSIONS else ""
    abi = ABIS.get(source.name, 0)  # 0: a library of its own (a bench's stand-in)
    return (f"libargus_{source.stem}-{abi}-{digest}{interpreter}-"
            f"{platform.machine() or 'unknown'}.so")


EXTENSIONS = {HOOKS_SOURCE.name}  # sources that are CPython extension modules


def compile_flags(source: Path) -> list[str]:
    """The compiler's flags for ``source``: an extension module also needs this interpreter's
    headers (ShimUnavailableError where they are not installed)."""
    if source.name not in EXTENSIONS:
        return list(CFLAGS)
    include = sysconfig.get_paths().get("include", "")
    if not include or not os.path.isfile(os.path.join(include, "Python.h")):
        raise ShimUnavailableError(f"no Python.h in {include!r} to build {WHAT[source.name]} "
                                   "(install python3-dev, or prebuild it and set "
                                   f"{PREBUILT[source.name]})")
    return [*CFLAGS, f"-I{include}"]


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
          source: Path = SOURCE, rebuild: bool = False) -> Path:
    """Compile ``source`` into ``out_dir`` (kept if already there, unless ``rebuild``: then
    replaced, atomically); raises ShimUnavailableError."""
    env = os.environ if env is None else env
    target = Path(out_dir) / library_name(source)
    if target.is_file() and not rebuild and intact(target):
        return target
    what = WHAT.get(source.name, source.name)
    compiler = find_compiler(env)
    if compiler is None:
        hint = (", or use a torch with native CUPTI callbacks (>= 2.13)"
                if source.name == SOURCE.name else "")
        raise ShimUnavailableError(
            "no C compiler (cc or gcc; CC=" + repr(env.get("CC", "")) + f") to build {what}; "
            "prebuild it (python -m argus_exporters._native build) and set "
            f"{PREBUILT.get(source.name, 'its variable')}{hint}")
    flags = compile_flags(source)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(prefix=".shim-", suffix=".so", dir=target.parent)
        os.close(fd)
    except OSError as exc:
        raise ShimUnavailableError(f"cannot write {what} to {target.parent}: {exc}; "
                                   "set ARGUS_CACHE_DIR to a writable folder") from None
    command = [compiler, *flags, "-o", partial, str(source)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                              check=False)
        if done.returncode != 0:
            raise ShimUnavailableError(f"building {what} failed ({' '.join(command)}): "
                                       f"{done.stderr.strip()[-500:]}")
        os.replace(partial, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ShimUnavailableError(f"building {what} failed: {exc}") from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def intact(path: Path) -> bool:
    """Whether the shared library at ``path`` holds everything its ELF headers point at (its
    program and section headers and each loaded segment): dlopen maps a truncated one and the
    process dies of SIGBUS touching what is missing. A file that is not 64-bit ELF is not
    checked (True)."""
    try:
        with open(path, "rb") as file:
            header = file.read(64)
            size = os.fstat(file.fileno()).st_size
            if header[:4] != b"\x7fELF" or (len(header) > 4 and header[4] != 2):
                return True  # another format, or 32-bit ELF: not checked
            if len(header) < 64:
                return False
            order = "<" if header[5] == 1 else ">"
            phoff, shoff = struct.unpack_from(order + "QQ", header, 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", header, 54)
            if phoff + phnum * phentsize > size or shoff + shnum * shentsize > size:
                return False
            file.seek(phoff)
            table = file.read(phnum * phentsize)
    except OSError:
        return False
    for at in range(0, len(table) - phentsize + 1, phentsize):
        offset, = struct.unpack_from(order + "Q", table, at + 8)
        filesz, = struct.unpack_from(order + "Q", table, at + 32)
        if offset + filesz > size:
            return False
    return phentsize >= 56


def _prebuilt(env: Mapping[str, str], source: Path) -> str | None:
    """The prebuilt library's path its variable names, if set."""
    variable = PREBUILT.get(source.name, "")
    return (env.get(variable) or None) if variable else None


def locate(env: Mapping[str, str] | None = None, source: Path = SOURCE,
           rebuild: bool = False) -> Path:
    """The library of ``source`` to load: its prebuilt variable (``ARGUS_CUPTI_SHIM``,
    ``ARGUS_EVENTS_LIB``, ``ARGUS_HOOKS_LIB``), else cached, else built now (with
    ``rebuild``, built now over the cached one)."""
    env = os.environ if env is None else env
    prebuilt = _prebuilt(env, source)
    if prebuilt:
        if not os.path.isfile(prebuilt):
            raise ShimUnavailableError(f"{PREBUILT[source.name]}={prebuilt!r} is not a file")
        if not intact(Path(prebuilt)):
            raise ShimUnavailableError(f"{PREBUILT[source.name]}={prebuilt!r} is damaged "
                                       "(shorter than its ELF headers say): build it again")
        return Path(prebuilt)
    if not source.is_file():
        raise ShimUnavailableError(f"the source {source} is missing from this install")
    preferred = cache_dir(env)
    try:
        return build(preferred, env, source, rebuild)
    except ShimUnavailableError as exc:
        if env.get("ARGUS_CACHE_DIR") or not str(exc).startswith("cannot write"):
            raise
    return build(private_temp_dir(), env, source, rebuild)  # e.g. a read-only home


Opened = TypeVar("Opened")


def open_library(source: Path, opener: Callable[[Path], Opened],
                 env: Mapping[str, str] | None = None) -> Opened:
    """``opener(path)`` of ``source``'s library (``locate``: ``ctypes.CDLL``, an extension
    module's import). A cached library that does not open (OSError, ImportError: truncated,
    damaged) is built once more over it and opened again; a prebuilt one's error is the
    caller's. Raises ShimUnavailableError where it cannot be built, else the opener's error."""
    env = os.environ if env is None else env
    path = locate(env, source)
    try:
        return opener(path)
    except (OSError, ImportError):
        if _prebuilt(env, source):
            raise
    return opener(locate(env, source, rebuild=True))


def main(argv: list[str] | None = None) -> int:
    """Build the native helpers (or find them in the cache) and print their paths."""
    parser = argparse.ArgumentParser(description="Build the Argus exporters' native helpers "
                                                 "(the CUPTI callback shim, the event reader, "
                                                 "the collective hooks).")
    parser.add_argument("command", nargs="?", default="build", choices=["build"])
    parser.add_argument("--out", type=Path, help="folder for the libraries (default: the cache)")
    parser.add_argument("--only", choices=["shim", "events", "hooks"],
                        help="build one of them (default: all)")
    args = parser.parse_args(argv)
    sources = {"shim": [SOURCE], "events": [EVENTS_SOURCE], "hooks": [HOOKS_SOURCE],
               None: [SOURCE, EVENTS_SOURCE, HOOKS_SOURCE]}
    for source in sources[args.only]:
        try:
            path = (build(args.out, os.environ, source) if args.out
                    else locate(os.environ, source))
        except ShimUnavailableError as exc:
            print(f"argus: {exc}", file=sys.stderr)
            return 1
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
