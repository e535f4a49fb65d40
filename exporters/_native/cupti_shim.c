/*
 * Argus CUPTI callback shim: the activity-buffer callbacks in C, so that no Python code ever
 * runs inside a CUPTI callback.
 *
 * CUPTI calls the buffer-requested and buffer-completed callbacks synchronously from its own
 * threads (and from whichever thread flushes) while it holds internal locks. A callback that
 * needed the Python GIL would deadlock against a training thread that holds the GIL and enters
 * CUDA (which takes the same CUPTI locks). Here the callbacks only move pointers between a
 * fixed pool of buffers and a completed queue under one mutex that is never held while calling
 * anything else. Python (exporters/kernels/plumbing.py) loads this file as a plain shared
 * library through ctypes (no Python C-API, so one build serves every Python version), hands
 * CUPTI the addresses of the two callbacks, and drains the queue from its decode thread with
 * argus_shim_get_completed, which blocks with the GIL released (ctypes releases it).
 *
 * The pool is bounded: when every buffer is out, the request is refused (CUPTI then drops
 * records and counts them, read back with cuptiActivityGetNumDroppedRecords). Buffers that are
 * not ours are never touched. Memory CUPTI may still write to is never freed.
 *
 * Build: cc -O2 -shared -fPIC -pthread -o libargus_cupti_shim.so cupti_shim.c
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ARGUS_SHIM_ABI 1
#define KIND_SLOTS 128
#define CUPTI_SUCCESS 0
#define CUPTI_ERROR_MAX_LIMIT_REACHED 12

enum buffer_state { FREE = 0, AT_CUPTI = 1, QUEUED = 2, DECODING = 3 };

typedef struct {
    uint8_t *buffer;
    uint64_t valid_size;
    uint64_t context;
    uint32_t stream_id;
} completed_t;

/* Counters, read with argus_shim_stats (the order is the ABI). */
enum stat_index {
    STAT_BUFFERS, STAT_FREE, STAT_AT_CUPTI, STAT_QUEUED, STAT_DECODING, STAT_REQUESTS,
    STAT_REFUSED, STAT_COMPLETED, STAT_FOREIGN, STAT_BAD_RETURNS, STAT_BUFFER_BYTES, STAT_COUNT
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static uint8_t *slab;           /* nbuffers * buffer_bytes, 8-byte aligned */
static size_t nbuffers, buffer_bytes;
static uint8_t *state;          /* enum buffer_state per buffer */
static size_t *free_stack, nfree;
static completed_t *queue;      /* ring of nbuffers: a buffer is queued at most once */
static size_t qhead, qlen;
static int stopping, forked;
static uint64_t requests, refused, completed, foreign, bad_returns;

static void child_after_fork(void) {
    /* A forked child never traces: a CUPTI thread of the parent may have held the lock. */
    pthread_mutex_init(&lock, NULL);
    forked = 1;
    stopping = 1;
}

static void init_once(void) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&ready, &attr);
    pthread_condattr_destroy(&attr);
    pthread_atfork(NULL, NULL, child_after_fork);
}

/* Index of a pool buffer, or -1 for a pointer that is not the start of one. */
static long buffer_index(const uint8_t *buffer) {
    if (slab == NULL || buffer < slab || buffer >= slab + nbuffers * buffer_bytes) return -1;
    size_t offset = (size_t)(buffer - slab);
    if (offset % buffer_bytes) return -1;
    return (long)(offset / buffer_bytes);
}

int argus_shim_abi(void) { return ARGUS_SHIM_ABI; }

/* Allocate the pool (0), or -1 without memory, -2 while CUPTI still holds old buffers. */
int argus_shim_configure(uint64_t buffers, uint64_t bytes) {
    pthread_once(&once, init_once);
    if (buffers == 0 || bytes < 64 || bytes % 8) return -1;
    pthread_mutex_lock(&lock);
    if (slab != NULL) {
        if (nfree != nbuffers) { pthread_mutex_unlock(&lock); return -2; }
        free(slab); free(state); free(free_stack); free(queue);
        slab = NULL;
    }
    void *memory = NULL;
    if (posix_memalign(&memory, 64, (size_t)(buffers * bytes)) != 0) memory = NULL;
    state = calloc(buffers, 1);
    free_stack = calloc(buffers, sizeof(size_t));
    queue = calloc(buffers, sizeof(completed_t));
    if (memory == NULL || state == NULL || free_stack == NULL || queue == NULL) {
        free(memory); free(state); free(free_stack); free(queue);
        state = NULL; free_stack = NULL; queue = NULL;
        pthread_mutex_unlock(&lock);
        return -1;
    }
    memset(memory, 0, (size_t)(buffers * bytes));
    slab = memory;
    nbuffers = (size_t)buffers;
    buffer_bytes = (size_t)bytes;
    for (size_t i = 0; i < nbuffers; i++) free_stack[i] = nbuffers - 1 - i;
    nfree = nbuffers;
    qhead = qlen = 0;
    stopping = forked;
    requests = refused = completed = foreign = bad_returns = 0;
    pthread_mutex_unlock(&lock);
    return 0;
}

/* CUpti_BuffersCallbackRequestFunc: a free pool buffer, or none (CUPTI drops and counts). */
void argus_shim_buffer_requested(uint8_t **buffer, size_t *size, size_t *max_num_records) {
    pthread_mutex_lock(&lock);
    requests++;
    if (nfree == 0 || forked) {
        refused++;
        *buffer = NULL;
        *size = 0;
    } else {
        size_t index = free_stack[--nfree];
        state[index] = AT_CUPTI;
        *buffer = slab + index * buffer_bytes;
        *size = buffer_bytes;
    }
    *max_num_records = 0;
    pthread_mutex_unlock(&lock);
}

/* CUpti_BuffersCallbackCompleteFunc: queue one of our buffers for the decode thread. */
void argus_shim_buffer_completed(void *context, uint32_t stream_id, uint8_t *buffer,
                                 size_t size, size_t valid_size) {
    (void)size;
    pthread_mutex_lock(&lock);
    long index = buffer_index(buffer);
    if (index < 0 || state[index] != AT_CUPTI) {
        foreign++;  /* not ours, or not lent out: never touch it */
        pthread_mutex_unlock(&lock);
        return;
    }
    completed++;
    state[index] = QUEUED;
    completed_t *slot = &queue[(qhead + qlen) % nbuffers];
    slot->buffer = buffer;
    slot->valid_size = valid_size <= buffer_bytes ? valid_size : buffer_bytes;
    slot->context = (uint64_t)(uintptr_t)context;
    slot->stream_id = stream_id;
    qlen++;
    pthread_cond_signal(&ready);
    pthread_mutex_unlock(&lock);
}

/* Wait up to timeout_ms for a completed buffer: 1 (out-parameters set), 0 on timeout,
 * -1 once stopped and the queue is empty. Call without the GIL (ctypes releases it). */
int argus_shim_get_completed(int64_t timeout_ms, uint8_t **buffer, uint64_t *valid_size,
                             uint64_t *context, uint32_t *stream_id) {
    pthread_once(&once, init_once);
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) { deadline.tv_sec++; deadline.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&lock);
    while (qlen == 0 && !stopping) {
        if (pthread_cond_timedwait(&ready, &lock, &deadline) == ETIMEDOUT) break;
    }
    int result = 0;
    if (qlen > 0) {
        completed_t *slot = &queue[qhead];
        qhead = (qhead + 1) % nbuffers;
        qlen--;
        *buffer = slot->buffer;
        *valid_size = slot->valid_size;
        *context = slot->context;
        *stream_id = slot->stream_id;
        state[buffer_index(slot->buffer)] = DECODING;
        result = 1;
    } else if (stopping) {
        result = -1;
    }
    pthread_mutex_unlock(&lock);
    return result;
}

/* Give a decoded buffer back to the pool: 0, or -1 for a pointer that was not being decoded. */
int argus_shim_return_buffer(uint8_t *buffer) {
    pthread_mutex_lock(&lock);
    long index = buffer_index(buffer);
    int result = -1;
    if (index >= 0 && state[index] == DECODING) {
        state[index] = FREE;
        free_stack[nfree++] = (size_t)index;
        result = 0;
    } else {
        bad_returns++;
    }
    pthread_mutex_unlock(&lock);
    return result;
}

/* Wake every waiter; get_completed returns -1 once the queue is empty (until configure). */
void argus_shim_stop(void) {
    pthread_once(&once, init_once);
    pthread_mutex_lock(&lock);
    stopping = 1;
    pthread_cond_broadcast(&ready);
    pthread_mutex_unlock(&lock);
}

/* Free the pool if every buffer is home (0); else keep it (CUPTI may still write): -1. */
int argus_shim_release(void) {
    pthread_mutex_lock(&lock);
    int result = 0;
    if (slab != NULL) {
        if (nfree != nbuffers) {
            result = -1;
        } else {
            free(slab); free(state); free(free_stack); free(queue);
            slab = NULL; state = NULL; free_stack = NULL; queue = NULL;
            nbuffers = nfree = qlen = qhead = 0;
        }
    }
    pthread_mutex_unlock(&lock);
    return result;
}

/* Pool and callback counters into out[STAT_COUNT]; returns STAT_COUNT. */
int argus_shim_stats(uint64_t *out) {
    pthread_mutex_lock(&lock);
    uint64_t by_state[4] = {0, 0, 0, 0};
    for (size_t i = 0; slab != NULL && i < nbuffers; i++) by_state[state[i] & 3]++;
    out[STAT_BUFFERS] = nbuffers;
    out[STAT_FREE] = by_state[FREE];
    out[STAT_AT_CUPTI] = by_state[AT_CUPTI];
    out[STAT_QUEUED] = by_state[QUEUED];
    out[STAT_DECODING] = by_state[DECODING];
    out[STAT_REQUESTS] = requests;
    out[STAT_REFUSED] = refused;
    out[STAT_COMPLETED] = completed;
    out[STAT_FOREIGN] = foreign;
    out[STAT_BAD_RETURNS] = bad_returns;
    out[STAT_BUFFER_BYTES] = buffer_bytes;
    pthread_mutex_unlock(&lock);
    return STAT_COUNT;
}

typedef int (*next_record_fn)(uint8_t *buffer, size_t valid_size, void **record);

/* Walk a buffer with CUPTI's own cuptiActivityGetNextRecord (passed as a function pointer).
 * The records of kind `want` get their offset and size (distance to the next record, or to
 * the end of the valid bytes) written to offsets/sizes (at most `max`); every record's kind is
 * counted in kind_counts[KIND_SLOTS] (kinds past the last slot in the last one). Returns the
 * number of `want` records, -(CUPTI status) when the walk fails, or -1000 past `max`. */
int64_t argus_shim_index_records(next_record_fn next_record, uint8_t *buffer, uint64_t valid_size,
                                 uint32_t want, int64_t *offsets, int64_t *sizes, int64_t max,
                                 int64_t *kind_counts) {
    void *record = NULL;
    int64_t found = 0;
    long previous_want = -1;
    for (;;) {
        int status = next_record(buffer, (size_t)valid_size, &record);
        if (status == CUPTI_ERROR_MAX_LIMIT_REACHED) break;
        if (status != CUPTI_SUCCESS) return -(int64_t)status;
        int64_t offset = (int64_t)((uint8_t *)record - buffer);
        if (previous_want >= 0) sizes[previous_want] = offset - offsets[previous_want];
        previous_want = -1;
        uint32_t kind = *(uint32_t *)record;
        kind_counts[kind < KIND_SLOTS ? kind : KIND_SLOTS - 1]++;
        if (kind == want) {
            if (found >= max) return -1000;
            offsets[found] = offset;
            previous_want = (long)found;
            found++;
        }
    }
    if (previous_want >= 0) sizes[previous_want] = (int64_t)valid_size - offsets[previous_want];
    return found;
}
