/* A CUDA runtime for bench/exporter_cpu.py's stand-in torch (and the tests of the bulk event
 * reader): an event is an index into a table of host timestamps (ns) that the stand-in's
 * Event.record writes. Both functions count their calls in argus_standin_reads and return at
 * once (the driver's time, which a real call spends with the GIL released, is not what the
 * benchmark measures). A test can make events from argus_standin_pending_from on not ready
 * yet (0: all ready) and every elapsed time fail with argus_standin_error (0: none). */
#define CUDA_ERROR_NOT_READY 600

static const long long *stamps;
long argus_standin_reads;
long argus_standin_pending_from;
int argus_standin_error;

void argus_standin_bind(const long long *table) { stamps = table; }

int cudaEventQuery(void *event) {
    argus_standin_reads++;
    if (argus_standin_pending_from > 0 && (long)event >= argus_standin_pending_from) {
        return CUDA_ERROR_NOT_READY;
    }
    return 0;
}

int cudaEventElapsedTime(float *ms, void *start, void *end) {
    argus_standin_reads++;
    if (argus_standin_error != 0) {
        return argus_standin_error;
    }
    *ms = (float)((double)(stamps[(long)end] - stamps[(long)start]) * 1e-6);
    return 0;
}
