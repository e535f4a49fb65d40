"""One kernel-probe run against the libcupti stand-in, in its own process (it may hang).

    python scenario.py STANDIN_SO CACHE_DIR CALLBACKS [STEPS KERNELS FOREIGN]

CALLBACKS is ``shim`` or ``torch`` (the probe's GIL-free callbacks), or ``python``: ctypes
Python callbacks registered directly, the design that deadlocks. Every launch enters the
stand-in through ctypes.PyDLL, keeping the GIL, while the stand-in's own thread calls the
callbacks holding its lock. Prints one JSON line: what was launched, emitted, dropped, and
where every buffer is.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cupti_standin import Standin


def python_callbacks(standin: Standin, steps: int, kernels: int) -> dict:
    """The old design: CUPTI calls Python (it needs the GIL) from its own thread."""
    request_fn = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p),
                                  ctypes.POINTER(ctypes.c_size_t),
                                  ctypes.POINTER(ctypes.c_size_t))
    complete_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                                   ctypes.c_size_t, ctypes.c_size_t)
    pool = [ctypes.create_string_buffer(4096) for _ in range(4)]
    free = [ctypes.addressof(b) for b in pool]

    def on_request(buffer, size, max_records):
        address = free.pop() if free else 0
        buffer[0] = address or None
        size[0] = 4096 if address else 0
        max_records[0] = 0

    def on_complete(context, stream, buffer, size, valid):
        free.append(buffer)

    callbacks = (request_fn(on_request), complete_fn(on_complete))
    standin.lib.cuptiActivityRegisterCallbacks.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    standin.lib.cuptiActivityRegisterCallbacks(ctypes.cast(callbacks[0], ctypes.c_void_p),
                                               ctypes.cast(callbacks[1], ctypes.c_void_p))
    standin.lib.cuptiActivityEnable(10)
    for _ in range(steps):
        standin.launch(kernels)
    return {"stand_in": standin.stats()}


def probe_run(standin: Standin, cache: str, callbacks: str, steps: int, kernels: int,
              foreign: int) -> dict:
    """The probe with its native callbacks, launches keeping the GIL."""
    from argus_exporters.config import Settings
    from argus_exporters.health import Health
    from argus_exporters.identity import RankIdentity
    from argus_exporters.kernels import CuptiLibrary, KernelProbe, kernel_record_dtypes

    if callbacks == "torch":
        import torch  # noqa: F401
    env = {"RANK": "0", "ARGUS_CACHE_DIR": cache, "PATH": os.environ.get("PATH", "")}
    settings = Settings(enabled=True, kernels=True, kernel_buffer_bytes=4096, kernel_buffers=8,
                        kernel_flush_s=0.005, kernel_callbacks=callbacks,
                        extra={"training_rank": True})
    health, emitted = Health(), []
    identity = RankIdentity("j", 0, 1, 0, "h", {"dp": 0, "tp": 0, "pp": 0, "ep": 0})
    probe = KernelProbe(settings, identity, emitted.append, health,
                        backend=CuptiLibrary(standin.lib, kernel_record_dtypes()), env=env)
    if not probe.start():
        return {"started": False, "state": probe.state}
    for step in range(steps):
        probe.step_begin(step)
        standin.launch(kernels, foreign if step % 3 == 0 else 0)
        probe.step_end(step)
        if step % 10 == 9:
            time.sleep(0.001)  # let the decode thread in now and then, as training does
    probe.shutdown()
    pool = probe._plumbing.stats()
    return {"started": True, "state": probe.state, "stand_in": standin.stats(), "pool": pool,
            "emitted": int(sum(len(r["start_ns"]) for r in emitted)),
            "dropped": dict(health.dropped), "buffers_decoded": probe.stats.buffers,
            "other_records": probe.stats.other_records}


def main() -> None:
    """Run one scenario and print its JSON."""
    from cupti import cupti

    path, cache, callbacks = sys.argv[1:4]
    steps, kernels, foreign = (int(v) for v in (sys.argv[4:7] or (200, 40, 5)))
    kernel_dtype = np.dtype(cupti.activity_kernel10_dtype)
    standin = Standin(Path(path), kernel_dtype, np.dtype(cupti.activity_api_dtype))
    if callbacks == "python":
        result = python_callbacks(standin, steps, kernels)
    else:
        result = probe_run(standin, cache, callbacks, steps, kernels, foreign)
    print(json.dumps(result, default=str), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
