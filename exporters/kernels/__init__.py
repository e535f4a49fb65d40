"""The CUPTI kernel probe: GPU kernel executions as columnar ``kernels`` records.

- ``probe``: ``KernelProbe``, its threads and its health (start here).
- ``plumbing``: the GIL-free buffer callbacks (torch's native ones, or the Argus C shim in
  ``exporters/_native``).
- ``cupti``: every CUPTI call, through ctypes on the process's libcupti.
- ``decode``: activity buffers to numpy columns (no GPU needed).
- ``process``: which processes trace; ``profilers``: other CUPTI clients.
"""

from argus_exporters.kernels.cupti import (
    BUSY_STATUSES,
    CUPTI_ACTIVITY_FLAG_FLUSH_FORCED,
    CUPTI_ERROR_MAX_LIMIT_REACHED,
    CuptiCallError,
    CuptiLibrary,
    ProbeUnavailableError,
    state_for_status,
)
from argus_exporters.kernels.decode import (
    CONCURRENT_KERNEL,
    UNKNOWN_NAME,
    KernelColumns,
    RecordIndex,
    UnknownRecordLayoutError,
    decode_kernel_buffer,
    kernel_record_dtypes,
    pick_record_dtype,
    read_c_string,
)
from argus_exporters.kernels.plumbing import ShimPlumbing, TorchPlumbing, select_plumbing
from argus_exporters.kernels.probe import PROBE, KernelProbe, KernelProbeStats
from argus_exporters.kernels.process import ParentInfo, training_process

__all__ = [
    "BUSY_STATUSES", "CONCURRENT_KERNEL", "CUPTI_ACTIVITY_FLAG_FLUSH_FORCED",
    "CUPTI_ERROR_MAX_LIMIT_REACHED", "PROBE", "UNKNOWN_NAME", "CuptiCallError", "CuptiLibrary",
    "KernelColumns", "KernelProbe", "KernelProbeStats", "ParentInfo", "ProbeUnavailableError",
    "RecordIndex", "ShimPlumbing", "TorchPlumbing", "UnknownRecordLayoutError",
    "decode_kernel_buffer", "kernel_record_dtypes", "pick_record_dtype", "read_c_string",
    "select_plumbing", "state_for_status", "training_process",
]
