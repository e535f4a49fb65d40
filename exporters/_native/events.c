/* Bulk reads of CUDA events for the phase probe's resolver thread.
 *
 * The resolver calls these once per poll through ctypes, which releases the GIL for the whole
 * call: every cudaEventQuery / cudaEventElapsedTime of a batch of steps runs without it, and
 * the resolver takes the GIL back once instead of once per event. The runtime's own functions
 * are passed in as pointers (the libcudart torch loaded), so this library links nothing.
 */
#include <stddef.h>

#define ARGUS_EVENTS_ABI 1
#define CUDA_ERROR_NOT_READY 600

typedef int (*argus_query_fn)(void *event);
typedef int (*argus_elapsed_fn)(float *ms, void *start, void *end);

/* The interface version the Python side checks before calling anything else. */
int argus_events_abi(void) { return ARGUS_EVENTS_ABI; }

/* How many of events[0..n) have completed, counted up to the first that has not. Any code
 * other than "not ready" counts as complete: the elapsed time then reports the error. */
long argus_events_ready(argus_query_fn query, void *const *events, long n) {
    for (long i = 0; i < n; i++) {
        if (query(events[i]) == CUDA_ERROR_NOT_READY) {
            return i;
        }
    }
    return n;
}

/* out[i] = milliseconds from starts[i] to ends[i]. Returns n, or the index of the first pair
 * CUDA refused, with its error code in *code (0 when all succeeded). */
long argus_events_elapsed(argus_elapsed_fn elapsed, void *const *starts, void *const *ends,
                          long n, float *out, int *code) {
    for (long i = 0; i < n; i++) {
        int status = elapsed(&out[i], starts[i], ends[i]);
        if (status != 0) {
            *code = status;
            return i;
        }
    }
    *code = 0;
    return n;
}
