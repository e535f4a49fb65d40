"""The CUPTI callback shim (exporters/_native/cupti_shim.c) and its builder.

The callbacks are called through their C function pointers, as CUPTI calls them: a fixed pool
that refuses when empty, a completed queue, foreign and doubly completed buffers ignored, a
wait with a timeout, a stop, and a pool kept while CUPTI holds any of it.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

import pytest

from argus_exporters._native.build import (
    ShimUnavailableError,
    build,
    cache_dir,
    find_compiler,
    library_name,
    locate,
    open_library,
)
from argus_exporters.kernels.cupti import ProbeUnavailableError
from argus_exporters.kernels.plumbing import STOPPED, ShimLibrary, ShimPlumbing, select_plumbing

REQUEST = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p),
                           ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
COMPLETE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                            ctypes.c_size_t, ctypes.c_size_t)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("shim-cache")


@pytest.fixture
def plumbing(cache):
    shim = ShimPlumbing(ShimLibrary.load({"ARGUS_CACHE_DIR": str(cache), "PATH": os.defpath}))
    yield shim
    shim.stop()
    while True:  # leave the process-wide pool empty for the next test
        item = shim.get_completed(0)
        if item is None or item is STOPPED:
            break
        shim.return_buffer(item.address)


class Cupti:
    """Calls the registered callbacks the way CUPTI does (through their addresses)."""

    def __init__(self, plumbing: ShimPlumbing):
        request, complete = plumbing.callback_addresses()
        self.request_fn, self.complete_fn = REQUEST(request), COMPLETE(complete)

    def request(self) -> tuple[int, int]:
        buffer, size, max_records = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t(9)
        self.request_fn(ctypes.byref(buffer), ctypes.byref(size), ctypes.byref(max_records))
        assert max_records.value == 0
        return buffer.value or 0, size.value

    def complete(self, address: int, valid: int, context: int = 0, stream: int = 0) -> None:
        self.complete_fn(context or None, stream, address or None, 4096, valid)


def test_pool_lends_every_buffer_once_then_refuses(plumbing):
    plumbing.configure(3, 4096)
    cupti = Cupti(plumbing)
    lent = [cupti.request() for _ in range(3)]
    assert len({a for a, _ in lent}) == 3 and all(s == 4096 and a % 8 == 0 for a, s in lent)
    assert cupti.request() == (0, 0)  # CUPTI drops (and counts) records now
    stats = plumbing.stats()
    assert (stats["at_cupti"], stats["free"], stats["refused"], stats["requests"]) == (3, 0, 1, 4)
    cupti.complete(lent[0][0], 100, context=0xC0, stream=7)
    item = plumbing.get_completed(1.0)
    assert (item.address, item.valid_size, item.context, item.stream_id) == (
        lent[0][0], 100, 0xC0, 7)
    plumbing.return_buffer(item.address)
    assert cupti.request()[0] == lent[0][0]  # back in the pool
    for address, _ in (lent[1], lent[2], (lent[0][0], 0)):
        cupti.complete(address, 0)
        plumbing.return_buffer(plumbing.get_completed(1.0).address)
    assert plumbing.stats()["free"] == 3


def test_foreign_and_twice_completed_buffers_are_ignored(plumbing):
    plumbing.configure(2, 4096)
    cupti = Cupti(plumbing)
    stranger = ctypes.create_string_buffer(4096)
    cupti.complete(ctypes.addressof(stranger), 64)  # another client's buffer
    address, _ = cupti.request()
    cupti.complete(address + 8, 64)  # inside the pool, not a buffer start
    cupti.complete(address, 64)
    cupti.complete(address, 64)  # completed twice
    item = plumbing.get_completed(1.0)
    assert item.address == address
    assert plumbing.get_completed(0.01) is None
    assert plumbing.stats()["foreign"] == 3
    plumbing.return_buffer(address)
    plumbing.return_buffer(address)  # returned twice: refused, counted
    plumbing.return_buffer(ctypes.addressof(stranger))
    stats = plumbing.stats()
    assert stats["bad_returns"] == 2 and stats["free"] == 2


def test_get_completed_times_out_then_stop_drains_the_queue_first(plumbing):
    plumbing.configure(2, 4096)
    cupti = Cupti(plumbing)
    t0 = time.monotonic()
    assert plumbing.get_completed(0.05) is None
    assert time.monotonic() - t0 >= 0.04
    address, _ = cupti.request()
    cupti.complete(address, 10)
    plumbing.stop()
    assert plumbing.get_completed(5).address == address  # queued before the stop
    assert plumbing.get_completed(5) is STOPPED
    plumbing.return_buffer(address)


def test_stop_wakes_a_waiting_decode_thread(plumbing):
    plumbing.configure(2, 4096)
    got = []
    thread = threading.Thread(target=lambda: got.append(plumbing.get_completed(30)))
    thread.start()
    time.sleep(0.05)
    plumbing.stop()
    thread.join(10)
    assert got == [STOPPED]


def test_pool_is_kept_while_cupti_holds_a_buffer(plumbing):
    plumbing.configure(2, 4096)
    cupti = Cupti(plumbing)
    address, _ = cupti.request()
    assert plumbing.release() is False  # CUPTI may still write into it
    with pytest.raises(ProbeUnavailableError, match="still holds"):
        plumbing.configure(2, 4096)
    cupti.complete(address, 0)
    plumbing.return_buffer(plumbing.get_completed(1).address)
    assert plumbing.release() is True
    assert plumbing.stats()["buffers"] == 0
    assert Cupti(plumbing).request() == (0, 0)  # nothing to lend after release


def test_a_forked_child_gets_no_buffers(plumbing):
    plumbing.configure(2, 4096)
    cupti = Cupti(plumbing)
    pid = os.fork()
    if pid == 0:  # the child: callbacks refuse, waits end at once
        code = 0 if (cupti.request() == (0, 0)
                     and plumbing.get_completed(5) is STOPPED) else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    address, _ = cupti.request()
    assert address and plumbing.stats()["at_cupti"] == 1  # the parent still lends
    cupti.complete(address, 0)
    plumbing.return_buffer(plumbing.get_completed(1).address)


# ---- the builder ---------------------------------------------------------------------------------

def test_build_is_cached_by_source_and_machine(cache):
    first = build(cache, {"PATH": os.defpath})
    assert first.name == library_name() and first.parent == cache
    mtime = first.stat().st_mtime_ns
    assert build(cache, {"PATH": ""}) == first  # cached: no compiler needed any more
    assert first.stat().st_mtime_ns == mtime
    assert ShimLibrary(ctypes.CDLL(str(first))).lib.argus_shim_abi() == 1


def test_no_compiler_says_what_to_do(tmp_path):
    env = {"PATH": str(tmp_path), "ARGUS_CACHE_DIR": str(tmp_path / "c")}
    assert find_compiler(env) is None
    with pytest.raises(ShimUnavailableError) as err:
        locate(env)
    assert "no C compiler" in str(err.value) and "ARGUS_CUPTI_SHIM" in str(err.value)
    with pytest.raises(ProbeUnavailableError) as probe_err:
        select_plumbing("shim", env)
    assert "no C compiler" in probe_err.value.reason
    assert "deadlock" in probe_err.value.reason


def test_prebuilt_library_from_the_environment(cache, tmp_path):
    built = build(cache, {"PATH": os.defpath})
    assert locate({"ARGUS_CUPTI_SHIM": str(built), "PATH": ""}) == built
    with pytest.raises(ShimUnavailableError, match="is not a file"):
        locate({"ARGUS_CUPTI_SHIM": str(tmp_path / "missing.so")})


def test_a_compiler_error_is_reported(tmp_path):
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'cc: fatal error: out of disk' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(ShimUnavailableError, match="out of disk"):
        build(tmp_path / "out", {"PATH": str(tmp_path)})
    assert not list((tmp_path / "out").glob("*.so"))  # no half-written library left


def test_cache_dir_order(tmp_path):
    assert cache_dir({"ARGUS_CACHE_DIR": "/a", "XDG_CACHE_HOME": "/b"}) == type(tmp_path)("/a")
    assert cache_dir({"XDG_CACHE_HOME": "/b", "HOME": "/h"}).as_posix() == "/b/argus"
    assert cache_dir({"HOME": "/h"}).as_posix() == "/h/.cache/argus"


def test_module_command_builds(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "argus_exporters._native", "build", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    paths = done.stdout.split()
    assert [os.path.basename(p).split("-")[0] for p in paths] == ["libargus_cupti_shim",
                                                                  "libargus_events",
                                                                  "libargus_hooks"]
    assert all(os.path.isfile(p) for p in paths)


def test_the_hooks_are_built_for_this_interpreter(cache):
    """The collective hooks are a CPython extension: their library is named for the
    interpreter (another Python builds its own) and loads as a module of the ABI asked for."""
    import importlib.util
    import sys

    from argus_exporters._native.build import HOOKS_ABI, HOOKS_SOURCE

    built = build(cache, {"PATH": os.defpath}, HOOKS_SOURCE)
    assert built.name == library_name(HOOKS_SOURCE)
    assert f"-{sys.implementation.cache_tag}-" in built.name
    spec = importlib.util.spec_from_file_location("_argus_hooks", built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.abi() == HOOKS_ABI
    assert {"TimedMethod", "TimedWait", "HostRecorder"} <= set(dir(module))


@pytest.mark.parametrize("which", ["shim", "events", "hooks"])
def test_a_damaged_library_is_never_opened(tmp_path, which):
    """A library cut short (a full disk, a partial copy of a cache) would kill the process with
    SIGBUS when loaded: a cached one is built again over it before anything opens it, and
    opens; a prebuilt one is refused with the reason, and left as it is. Files that are not
    64-bit ELF are not judged."""
    from argus_exporters._native.build import (
        EVENTS_SOURCE,
        HOOKS_SOURCE,
        PREBUILT,
        SOURCE,
        intact,
    )
    from argus_exporters._native.extension import _import

    source = {"shim": SOURCE, "events": EVENTS_SOURCE, "hooks": HOOKS_SOURCE}[which]
    opener = _import if which == "hooks" else (lambda path: ctypes.CDLL(str(path)))
    env = {"PATH": os.defpath, "ARGUS_CACHE_DIR": str(tmp_path / "cache")}
    cached = locate(env, source)
    whole = cached.read_bytes()
    assert intact(cached)
    for cut in (2048, len(whole) // 2, len(whole) - 1):
        damaged = tmp_path / "damaged.so"  # a new file: the loaded one's pages stay whole
        damaged.write_bytes(whole[:cut])
        os.replace(damaged, cached)
        assert not intact(cached)
        assert open_library(source, opener, env) is not None
        assert cached.stat().st_size == len(whole)  # built again, over the damaged one
        assert intact(cached)
    for other in (b"MZ not ELF at all", b"\x7fELF\x01" + bytes(60)):  # unchecked formats
        (tmp_path / "other.so").write_bytes(other)
        assert intact(tmp_path / "other.so")
    prebuilt = tmp_path / "prebuilt.so"
    prebuilt.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(ShimUnavailableError, match="damaged"):
        open_library(source, opener, {**env, PREBUILT[source.name]: str(prebuilt)})
    assert prebuilt.stat().st_size == len(whole) // 2


def test_no_python_headers_says_what_to_do(tmp_path, monkeypatch):
    """Without Python.h the hooks cannot be built: the error names the package to install and
    the prebuilt library's variable (the plain C libraries need no headers)."""
    import sysconfig

    from argus_exporters._native.build import HOOKS_SOURCE

    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    with pytest.raises(ShimUnavailableError) as err:
        build(tmp_path / "out", {"PATH": os.defpath}, HOOKS_SOURCE)
    assert "python3-dev" in str(err.value) and "ARGUS_HOOKS_LIB" in str(err.value)
    assert build(tmp_path / "out", {"PATH": os.defpath}).is_file()  # the shim still builds


def test_an_unwritable_home_falls_back_to_a_private_temp_folder(tmp_path, monkeypatch):
    import tempfile

    home = tmp_path / "home"
    home.write_text("")  # not a folder: ~/.cache/argus cannot be made, even by root
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    path = locate({"HOME": str(home), "PATH": os.defpath})
    assert path.parent == tmp_path / "tmp" / f"argus-cache-{os.getuid()}"
    assert path.parent.stat().st_mode & 0o777 == 0o700


def test_a_shared_temp_cache_folder_is_refused(tmp_path, monkeypatch):
    import tempfile

    from argus_exporters._native.build import private_temp_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = tmp_path / f"argus-cache-{os.getuid()}"
    folder.mkdir()
    folder.chmod(0o777)  # someone else could plant a library here
    with pytest.raises(ShimUnavailableError, match="not a private folder"):
        private_temp_dir()
