/*
 * A stand-in for libcupti, for CPU tests of the kernel probe (no GPU, no CUDA).
 *
 * It implements the CUPTI calls the probe makes, with CUPTI's threading: a worker pthread
 * (CUPTI's own thread) takes "CUPTI's lock" and, holding it, requests buffers and completes
 * full ones through the registered callbacks; a training thread that launches work
 * (standin_launch, called through ctypes.PyDLL so it keeps the GIL) takes the same lock, as a
 * CUDA launch does. Registered callbacks that need the GIL therefore deadlock here exactly as
 * they would against real CUPTI.
 *
 * Records: CONCURRENT_KERNEL records in the layout the test configures (cupti-python's dtype
 * offsets), interleaved "foreign" records of another kind (another CUPTI user in the process),
 * timestamps on CLOCK_REALTIME like CUPTI 13. Kernels queue on one device timeline: a kernel
 * starts when the previous one ends or now, whichever is later, so a host that launches faster
 * than the device runs leaves kernels in flight. Buffers are handed back only when all their
 * kernels have ended (full buffers, flush flag 0), or at once with the in-flight kernels marked
 * incomplete (end = 0) by a forced flush. A refused buffer request drops the record and counts
 * it for cuptiActivityGetNumDroppedRecords.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SUCCESS 0
#define ERROR_INVALID_PARAMETER 1
#define ERROR_MAX_LIMIT_REACHED 12
#define ERROR_INVALID_KIND 21
#define KIND_KERNEL 10
#define KINDS 128
#define MAX_HELD 256
#define NAMES 4

typedef void (*request_fn)(uint8_t **buffer, size_t *size, size_t *max_records);
typedef void (*complete_fn)(void *context, uint32_t stream, uint8_t *buffer, size_t size,
                            size_t valid);

typedef struct { uint8_t *buffer; size_t size, used; } held_t;

static pthread_mutex_t cupti_lock = PTHREAD_MUTEX_INITIALIZER;  /* "CUPTI's internal lock" */
static pthread_mutex_t cmd_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cmd_cond = PTHREAD_COND_INITIALIZER;
static pthread_t worker;
static int worker_running;

static request_fn on_request;
static complete_fn on_complete;
static int register_status, enable_status, flush_status;
static int kernel_enabled;
static size_t kernel_size = 216, off_kind = 0, off_start = 16, off_end = 24, off_stream = 48,
              off_name = 104;
static size_t kind_size[KINDS];
static uint32_t foreign_kind = 5;  /* RUNTIME */
static held_t current;
static held_t held[MAX_HELD];
static size_t nheld;
static uint64_t device_cursor;
static int64_t timestamp_offset_ns;
static uint64_t dropped;
static char names[NAMES][64] = {"standin_gemm_kernel", "standin_relu_kernel",
                                "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "standin_softmax"};

/* counters (standin_stats order) */
static uint64_t st_requests, st_refused, st_completed, st_kernels, st_foreign, st_incomplete,
                st_launches, st_dropped_total;

static struct {
    uint32_t kernels, foreign;
    uint64_t dur_ns;
    int pending, holding, done, quit;
} job;

static uint64_t realtime_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

static uint32_t kind_at(const uint8_t *record) { return *(const uint32_t *)record; }

static size_t size_of_kind(uint32_t kind) {
    if (kind == KIND_KERNEL) return kernel_size;
    return kind < KINDS ? kind_size[kind] : 0;
}

/* Kernel records of a buffer still running at `now` (marked incomplete when `mark`). */
static size_t in_flight(held_t *h, uint64_t now, int mark) {
    size_t count = 0;
    for (size_t at = 0; at < h->used;) {
        uint8_t *record = h->buffer + at;
        size_t size = size_of_kind(kind_at(record));
        if (size == 0) break;
        if (kind_at(record) == KIND_KERNEL) {
            uint64_t *end = (uint64_t *)(record + off_end);
            if (*end > now) {
                count++;
                if (mark) *end = 0;
            }
        }
        at += size;
    }
    return count;
}

static void complete(held_t *h) {
    st_completed++;
    on_complete(NULL, 0, h->buffer, h->size, h->used);
}

/* Hand back held buffers whose kernels have all ended (every one when forced). */
static void deliver_held(int forced) {
    uint64_t now = realtime_ns();
    size_t kept = 0;
    for (size_t i = 0; i < nheld; i++) {
        if (forced) st_incomplete += in_flight(&held[i], now, 1);
        if (forced || in_flight(&held[i], now, 0) == 0) complete(&held[i]);
        else held[kept++] = held[i];
    }
    nheld = kept;
}

/* Room for `size` bytes in the current buffer; 0 when CUPTI got no buffer (record dropped). */
static int room_for(size_t size) {
    if (current.buffer != NULL && current.used + size <= current.size) return 1;
    if (current.buffer != NULL) {  /* full: complete now, or hold until its kernels end */
        if (nheld < MAX_HELD) held[nheld++] = current;
        else complete(&current);
        current.buffer = NULL;
    }
    deliver_held(0);
    uint8_t *buffer = NULL;
    size_t bytes = 0, max_records = 0;
    st_requests++;
    on_request(&buffer, &bytes, &max_records);
    if (buffer == NULL || bytes < size) {
        st_refused++;
        if (buffer != NULL) {  /* too small: give it straight back */
            held_t tiny = {buffer, bytes, 0};
            complete(&tiny);
        }
        return 0;
    }
    current.buffer = buffer;
    current.size = bytes;
    current.used = 0;
    return 1;
}

static void write_record(uint32_t kind, uint64_t duration_ns, uint32_t index) {
    if (on_request == NULL) return;  /* nobody registered: CUPTI records nothing */
    size_t size = size_of_kind(kind);
    if (!room_for(size)) {
        dropped++;
        st_dropped_total++;
        return;
    }
    uint8_t *record = current.buffer + current.used;
    memset(record, 0, size);
    *(uint32_t *)(record + off_kind) = kind;
    if (kind == KIND_KERNEL) {
        uint64_t now = realtime_ns();
        uint64_t start = device_cursor > now ? device_cursor : now;
        *(uint64_t *)(record + off_start) = start;
        *(uint64_t *)(record + off_end) = start + duration_ns;
        *(uint32_t *)(record + off_stream) = index % NAMES == 2 ? 13 : 7;
        *(const char **)(record + off_name) = names[index % NAMES];
        device_cursor = start + duration_ns;
        st_kernels++;
    } else {
        st_foreign++;
    }
    current.used += size;
}

static void *worker_main(void *unused) {
    (void)unused;
    for (;;) {
        pthread_mutex_lock(&cmd_lock);
        while (!job.pending && !job.quit) pthread_cond_wait(&cmd_cond, &cmd_lock);
        if (job.quit) { pthread_mutex_unlock(&cmd_lock); return NULL; }
        job.pending = 0;
        uint32_t kernels = job.kernels, foreign = job.foreign;
        uint64_t duration = job.dur_ns;
        pthread_mutex_unlock(&cmd_lock);

        pthread_mutex_lock(&cupti_lock);  /* CUPTI's thread holds its lock ... */
        pthread_mutex_lock(&cmd_lock);
        job.holding = 1;                  /* ... while the launching thread wants it */
        pthread_cond_broadcast(&cmd_cond);
        pthread_mutex_unlock(&cmd_lock);
        usleep(200);
        uint32_t written_foreign = 0;
        for (uint32_t i = 0; i < kernels || written_foreign < foreign; i++) {
            if (i < kernels && kernel_enabled) write_record(KIND_KERNEL, duration, i);
            if (written_foreign < foreign) { write_record(foreign_kind, 0, i); written_foreign++; }
        }
        deliver_held(0);
        pthread_mutex_unlock(&cupti_lock);

        pthread_mutex_lock(&cmd_lock);
        job.done = 1;
        pthread_cond_broadcast(&cmd_cond);
        pthread_mutex_unlock(&cmd_lock);
    }
}

/* ---- the CUPTI API the probe uses ---- */

int cuptiActivityRegisterCallbacks(request_fn request, complete_fn completed) {
    if (register_status) return register_status;
    pthread_mutex_lock(&cupti_lock);
    on_request = request;
    on_complete = completed;
    pthread_mutex_unlock(&cupti_lock);
    return SUCCESS;
}

int cuptiActivityEnable(int kind) {
    if (enable_status) return enable_status;
    pthread_mutex_lock(&cupti_lock);
    if (kind == KIND_KERNEL) kernel_enabled = 1;
    pthread_mutex_unlock(&cupti_lock);
    return SUCCESS;
}

int cuptiActivityDisable(int kind) {
    pthread_mutex_lock(&cupti_lock);
    if (kind == KIND_KERNEL) kernel_enabled = 0;
    pthread_mutex_unlock(&cupti_lock);
    return SUCCESS;
}

int cuptiActivityFlushAll(uint32_t flag) {
    if (flush_status) return flush_status;
    pthread_mutex_lock(&cupti_lock);
    if (on_complete != NULL) {
        int forced = flag & 1;
        deliver_held(forced);
        if (current.buffer != NULL) {
            uint64_t now = realtime_ns();
            if (forced) st_incomplete += in_flight(&current, now, 1);
            if (forced || (current.used > 0 && in_flight(&current, now, 0) == 0)) {
                complete(&current);
                current.buffer = NULL;
            }
        }
    }
    pthread_mutex_unlock(&cupti_lock);
    return SUCCESS;
}

int cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, uint8_t **record) {
    if (buffer == NULL || record == NULL) return ERROR_INVALID_PARAMETER;
    uint8_t *next = buffer;
    if (*record != NULL) next = *record + size_of_kind(kind_at(*record));
    if (next >= buffer + valid) return ERROR_MAX_LIMIT_REACHED;
    if (size_of_kind(kind_at(next)) == 0) return ERROR_INVALID_KIND;
    *record = next;
    return SUCCESS;
}

int cuptiActivityGetNumDroppedRecords(void *context, uint32_t stream, size_t *count) {
    (void)context; (void)stream;
    pthread_mutex_lock(&cupti_lock);
    *count = dropped;
    dropped = 0;
    pthread_mutex_unlock(&cupti_lock);
    return SUCCESS;
}

int cuptiGetTimestamp(uint64_t *timestamp) {
    *timestamp = (uint64_t)((int64_t)realtime_ns() - timestamp_offset_ns);
    return SUCCESS;
}

int cuptiGetVersion(uint32_t *version) {
    *version = 130001;
    return SUCCESS;
}

/* ---- test controls ---- */

/* Kernel record layout (cupti-python's dtype) and the other kind's size. */
void standin_configure(uint64_t size, uint64_t kind_off, uint64_t start_off, uint64_t end_off,
                       uint64_t stream_off, uint64_t name_off, uint32_t other_kind,
                       uint64_t other_size) {
    pthread_mutex_lock(&cupti_lock);
    kernel_size = size; off_kind = kind_off; off_start = start_off; off_end = end_off;
    off_stream = stream_off; off_name = name_off;
    foreign_kind = other_kind;
    if (other_kind < KINDS) kind_size[other_kind] = other_size;
    pthread_mutex_unlock(&cupti_lock);
}

void standin_set_status(int registering, int enabling, int flushing) {
    register_status = registering;
    enable_status = enabling;
    flush_status = flushing;
}

/* cuptiGetTimestamp runs `offset_ns` behind CLOCK_REALTIME (a replaced timestamp source). */
void standin_set_timestamp_offset(int64_t offset_ns) { timestamp_offset_ns = offset_ns; }

/* Rewrite kernel name `index` in place: the same pointer now names another kernel. */
void standin_rename(uint32_t index, const char *text) {
    pthread_mutex_lock(&cupti_lock);
    strncpy(names[index % NAMES], text, sizeof names[0] - 1);
    pthread_mutex_unlock(&cupti_lock);
}

const char *standin_name(uint32_t index) { return names[index % NAMES]; }

/* The training thread launches work: CUPTI's thread (holding CUPTI's lock) records it while
 * this thread waits for that lock, as a CUDA launch does. Returns when the records are written. */
int standin_launch(uint32_t kernels, uint32_t foreign, uint64_t duration_ns) {
    pthread_mutex_lock(&cmd_lock);
    if (!worker_running) {
        job.quit = 0;
        pthread_create(&worker, NULL, worker_main, NULL);
        worker_running = 1;
    }
    job.kernels = kernels;
    job.foreign = foreign;
    job.dur_ns = duration_ns;
    job.holding = job.done = 0;
    job.pending = 1;
    pthread_cond_broadcast(&cmd_cond);
    while (!job.holding) pthread_cond_wait(&cmd_cond, &cmd_lock);
    pthread_mutex_unlock(&cmd_lock);

    pthread_mutex_lock(&cupti_lock);  /* the launch path enters CUPTI */
    st_launches++;
    pthread_mutex_unlock(&cupti_lock);

    pthread_mutex_lock(&cmd_lock);
    while (!job.done) pthread_cond_wait(&cmd_cond, &cmd_lock);
    pthread_mutex_unlock(&cmd_lock);
    return 0;
}

/* Counters: requests, refused, completed, kernels, foreign, incomplete, launches, dropped,
 * buffers held by the stand-in now. Returns how many were written. */
int standin_stats(uint64_t *out) {
    pthread_mutex_lock(&cupti_lock);
    out[0] = st_requests; out[1] = st_refused; out[2] = st_completed; out[3] = st_kernels;
    out[4] = st_foreign; out[5] = st_incomplete; out[6] = st_launches; out[7] = st_dropped_total;
    out[8] = nheld + (current.buffer != NULL);
    pthread_mutex_unlock(&cupti_lock);
    return 9;
}

/* Forget everything but the layout (buffers it holds are abandoned: flush first). */
void standin_reset(void) {
    pthread_mutex_lock(&cupti_lock);
    on_request = NULL; on_complete = NULL;
    register_status = enable_status = flush_status = 0;
    kernel_enabled = 0;
    current.buffer = NULL; nheld = 0;
    device_cursor = 0; timestamp_offset_ns = 0; dropped = 0;
    st_requests = st_refused = st_completed = st_kernels = st_foreign = st_incomplete = 0;
    st_launches = st_dropped_total = 0;
    strcpy(names[0], "standin_gemm_kernel");
    strcpy(names[1], "standin_relu_kernel");
    strcpy(names[2], "ncclDevKernel_AllReduce_Sum_f32_RING_LL");
    strcpy(names[3], "standin_softmax");
    pthread_mutex_unlock(&cupti_lock);
}
