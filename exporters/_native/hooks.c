/* The collective hooks' wrappers as a CPython extension (``_argus_hooks``): the same calls
 * as ``collectives._timed_method`` and ``_patch_process_group``'s ``timed_wait``, made without
 * a Python frame of their own.
 *
 * A collective's wrappers run on the training thread right after it returns from waiting
 * on the backend, with the caches cold: each Python frame, attribute lookup and object they
 * touch costs there several times its hot time. These types do what the Python wrappers do,
 * in the same order and with the same objects (the tracer's methods, the hooks' dictionaries
 * and caches), so either implementation records the same intervals; ``collectives.py`` uses
 * them where this module loads and its own wrappers elsewhere.
 *
 * TimedMethod(original, op, state, begin, end, remember, max_pending, newest=None): a
 *     ProcessGroup method (not a point-to-point one); binds like a function (an unbound
 *     method descriptor: ``group.allreduce(...)`` calls it with the group first). It
 *     remembers the phase name of the last group it was called on (until ``renamed()``).
 * TimedWait(original, works, mark, end, key=None, newest=None): ``Work.wait``; with ``key``
 *     (the address of a tensor's storage), ``wait_tensor`` (``_timed_wait_tensor``: its
 *     pending collectives are keyed by their result's storage).
 * TimedOperator(original, op, state, begin, end, remember, max_pending, tensor_type, key,
 *     newest=None): a functional collective operator (``_timed_operator``). It remembers the
 *     phase name of the last group label it was called with (until ``renamed()``).
 * NewestPending(): the newest collective awaiting its wait (a Work, shared by the methods and
 *     ``Work.wait``; a functional result, by the operators and ``wait_tensor``): found by
 *     identity there, without a key and a dictionary.
 * HostRecorder(lock, mark, begin, end, layout...): the tracer's ``begin_collective``
 *     and ``end_collective`` on the host clock (``recorder.begin``, ``recorder.end``): the
 *     same cells and marks in the same order. Its hot state lives here: the tracer hands it
 *     each new step (``enter``) and its ``off`` and ``sampled`` flags. Instead of taking the
 *     tracer's lock it checks that nobody holds it: it runs holding the GIL and never lets
 *     it go, so no thread can be inside the lock's Python section meanwhile. Anything off the
 *     common path (the tracer off, a step whose CPU time is sampled, its first mark, a late
 *     or full end, the lock held) is left to the tracer's own methods. It writes into the
 *     step's lists' storage directly, grown once a step to what the last step took (a step's
 *     reset empties the lists, storage and all: grown item by item, they would be
 *     reallocated several times a step).
 * The wrappers given a HostRecorder's begin and end call it directly, without a call through
 * Python.
 *
 * The recorder relies on the GIL and writes lists' storage as a GIL build lays it out: on a
 * free-threaded Python the module does not build, and the Python wrappers run there.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

#define ARGUS_HOOKS_ABI 3

#ifdef Py_GIL_DISABLED
#error "the C hooks write lists' storage directly and need a CPython with the GIL"
#endif

/* A collective's cells (tracer.py's layout): name, START, END, KIND, WAITED, KEY, ARG, PEER */
#define ROW 8
#define ROW_END 2
#define ROW_WAITED 4

static PyObject *str_muted;       /* "muted" */
static PyObject *str_compiling;   /* "compiling" */
static PyObject *str_compile_flag; /* "compile_flag" */
static PyObject *str_names;       /* "names" */
static PyObject *str_cache;       /* "_names" */
static PyObject *str_cells, *str_marks, *str_index, *str_collectives;
static PyObject *str_labelled;    /* "_labelled" */
static PyObject *str_named;       /* "named" */
static PyObject *str_group_name;  /* "group_name" */
static PyObject *no_peer;         /* NO_PEER (-1) */
static unsigned long long names_generation; /* bumped by renamed(): the wrappers' names go */

/* The object weak reference ``ref`` refers to (new reference), or NULL where it is gone. */
static PyObject *referent(PyObject *ref) {
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *held = NULL;
    if (PyWeakref_GetRef(ref, &held) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return held;
#else
    PyObject *held = PyWeakref_GetObject(ref); /* borrowed */
    if (held == NULL) {
        PyErr_Clear();
        return NULL;
    }
    return held == Py_None ? NULL : Py_NewRef(held);
#endif
}

/* ``ref`` (a weak reference) still refers to ``obj``. */
static int refers_to(PyObject *ref, PyObject *obj) {
    PyObject *held = referent(ref);
    Py_XDECREF(held);
    return held != NULL && held == obj;
}


/* ---- the host clock's recording ------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *locked;     /* tracer._lock.locked */
    PyObject *mark;       /* tracer.mark_now (time.perf_counter_ns) */
    PyObject *begin;      /* tracer.begin_collective (everything off the common path) */
    PyObject *end;        /* tracer.end_collective */
    PyObject *kind;       /* COLLECTIVE */
    PyObject *no_mark;    /* NO_MARK */
    PyObject *key;        /* the host clock's one stream key */
    PyObject *step;       /* the tracer's current step (enter) and its lists */
    PyObject *cells;
    PyObject *marks;
    long long index;      /* the current step's index */
    Py_ssize_t max_cells, end_cell, waited_cell;
    long long slot_bits, full;
    char off;             /* the tracer is off (closed, or a forked child) */
    char sampled;         /* the current step's CPU time is measured (the tracer's methods) */
    char flagged;         /* the current step knows it holds a collective */
    char direct_clock;    /* CLOCK_MONOTONIC read here is what ``mark`` returns */
} HostRecorder;

static PyTypeObject HostRecorderType;

/* A mark now (new reference): ``mark()``, read here where that is the same clock. */
static PyObject *mark_now(HostRecorder *self) {
#ifdef __linux__
    if (self->direct_clock) {
        struct timespec now;
        if (clock_gettime(CLOCK_MONOTONIC, &now) == 0) {
            return PyLong_FromLongLong((long long)now.tv_sec * 1000000000LL + now.tv_nsec);
        }
    }
#endif
    return PyObject_CallNoArgs(self->mark);
}

/* The tracer's lock is held (by any thread): 1, 0, or -1 with an exception set. */
static int lock_held(HostRecorder *self) {
    PyObject *held = PyObject_CallNoArgs(self->locked);
    if (held == NULL) {
        return -1;
    }
    int truth = PyObject_IsTrue(held);
    Py_DECREF(held);
    return truth;
}

/* Room for ``more`` items at the end of ``list`` without growing it item by item: 0, or -1
 * with an exception set. */
static int room(PyObject *list, Py_ssize_t more) {
    PyListObject *items = (PyListObject *)list;
    Py_ssize_t want = Py_SIZE(items) + more;
    if (want <= items->allocated) {
        return 0;
    }
    Py_ssize_t grown = want < 64 ? 64 : want + (want >> 1);
    PyObject **moved = PyMem_Realloc(items->ob_item, (size_t)grown * sizeof(PyObject *));
    if (moved == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    items->ob_item = moved;
    items->allocated = grown;
    return 0;
}

/* begin_collective(name, peer)'s common path: 1 with the token in *token (new reference),
 * 0 when it is left to the tracer's method, -1 with an exception set. */
static int record_begin(HostRecorder *self, PyObject *name, PyObject *peer, PyObject **token) {
    if (self->off) {
        *token = Py_NewRef(Py_None);
        return 1;
    }
    if (self->sampled || self->cells == NULL) { /* its CPU time is measured there */
        return 0;
    }
    int held = lock_held(self);
    if (held != 0) {
        return held < 0 ? -1 : 0;
    }
    PyObject *cells = self->cells, *marks = self->marks;
    Py_ssize_t base = PyList_GET_SIZE(cells);
    if (base >= self->max_cells) {
        *token = PyLong_FromLongLong((self->index << self->slot_bits) | self->full);
        return *token ? 1 : -1;
    }
    Py_ssize_t at = PyList_GET_SIZE(marks);
    if (at == 0) { /* the step's first mark opens it */
        return 0;
    }
    PyObject *now = mark_now(self);
    if (now == NULL) {
        return -1;
    }
    PyObject *start = PyLong_FromSsize_t(at);
    if (start == NULL || room(marks, 1) < 0 || room(cells, ROW) < 0) {
        Py_DECREF(now);
        Py_XDECREF(start);
        return -1;
    }
    PyList_SET_ITEM(marks, at, now);
    Py_SET_SIZE(marks, at + 1);
    PyObject **row = ((PyListObject *)cells)->ob_item + base;
    row[0] = Py_NewRef(name);
    row[1] = start;
    row[ROW_END] = Py_NewRef(self->no_mark);
    row[3] = Py_NewRef(self->kind);
    row[ROW_WAITED] = Py_NewRef(self->no_mark);
    row[5] = Py_NewRef(self->key);
    row[6] = Py_NewRef(Py_None);
    row[7] = Py_NewRef(peer);
    Py_SET_SIZE(cells, base + ROW);
    if (!self->flagged) {
        if (PyObject_SetAttr(self->step, str_collectives, Py_True) < 0) {
            return -1;
        }
        self->flagged = 1;
    }
    *token = PyLong_FromLongLong((self->index << self->slot_bits) | (long long)base);
    return *token ? 1 : -1;
}

/* end_collective(token, waited_from)'s common path: 1 when ended, 0 when left to the
 * tracer's method (None, a late or full token, the tracer off), -1 with an exception set. */
static int record_end(HostRecorder *self, PyObject *token_object, PyObject *waited_from) {
    if (!PyLong_CheckExact(token_object) || self->off || self->cells == NULL) {
        return 0;
    }
    long long token = PyLong_AsLongLong(token_object);
    if (token == -1 && PyErr_Occurred()) {
        return -1;
    }
    PyObject *cells = self->cells, *marks = self->marks;
    long long base = token & ((1LL << self->slot_bits) - 1);
    if ((token >> self->slot_bits) != self->index || base == self->full ||
        base + self->waited_cell >= PyList_GET_SIZE(cells)) {
        return 0;
    }
    int held = lock_held(self);
    if (held != 0) {
        return held < 0 ? -1 : 0;
    }
    Py_ssize_t at = PyList_GET_SIZE(marks);
    int waited = waited_from != Py_None;
    if (room(marks, 2) < 0) {
        return -1;
    }
    PyObject *now = mark_now(self);
    PyObject *end = now ? PyLong_FromSsize_t(at) : NULL;
    PyObject *waited_at = end && waited ? PyLong_FromSsize_t(at + 1) : NULL;
    if (end == NULL || (waited && waited_at == NULL)) {
        Py_XDECREF(now);
        Py_XDECREF(end);
        return -1;
    }
    PyObject **items = ((PyListObject *)cells)->ob_item + base;
    Py_SETREF(items[self->end_cell], end);
    PyList_SET_ITEM(marks, at, now);
    if (waited) {
        Py_SETREF(items[self->waited_cell], waited_at);
        PyList_SET_ITEM(marks, at + 1, Py_NewRef(waited_from));
    }
    Py_SET_SIZE(marks, at + 1 + waited);
    return 1;
}

/* recorder.begin(name, peer=NO_PEER): tracer.begin_collective(name, peer) on the host clock. */
static PyObject *recorder_begin(HostRecorder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "begin(name, peer=-1)");
        return NULL;
    }
    PyObject *token = NULL;
    int done = record_begin(self, args[0], nargs > 1 ? args[1] : no_peer, &token);
    if (done != 0) {
        return done < 0 ? NULL : token;
    }
    return PyObject_Vectorcall(self->begin, args, nargs, NULL);
}

/* recorder.end(token, waited_from=None): tracer.end_collective on the host clock. */
static PyObject *recorder_end(HostRecorder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "end(token, waited_from=None)");
        return NULL;
    }
    int done = record_end(self, args[0], nargs > 1 ? args[1] : Py_None);
    if (done != 0) {
        return done < 0 ? NULL : Py_NewRef(Py_None);
    }
    return PyObject_Vectorcall(self->end, args, nargs, NULL);
}

/* recorder.enter(step): the tracer's current step from now on (under the tracer's lock). */
static PyObject *recorder_enter(HostRecorder *self, PyObject *step) {
    PyObject *cells = PyObject_GetAttr(step, str_cells);
    PyObject *marks = cells ? PyObject_GetAttr(step, str_marks) : NULL;
    PyObject *index = marks ? PyObject_GetAttr(step, str_index) : NULL;
    PyObject *flag = index ? PyObject_GetAttr(step, str_collectives) : NULL;
    long long at = index ? PyLong_AsLongLong(index) : -1;
    int flagged = flag ? PyObject_IsTrue(flag) : -1;
    Py_XDECREF(index);
    Py_XDECREF(flag);
    if (flagged < 0 || (at == -1 && PyErr_Occurred())) {
        Py_XDECREF(cells);
        Py_XDECREF(marks);
        return NULL;
    }
    if (!PyList_CheckExact(cells) || !PyList_CheckExact(marks)) {
        Py_DECREF(cells);
        Py_DECREF(marks);
        PyErr_SetString(PyExc_TypeError, "a step's cells and marks are lists");
        return NULL;
    }
    /* the room the last step took, taken now, once */
    if ((self->cells != NULL && room(cells, PyList_GET_SIZE(self->cells)) < 0) ||
        (self->marks != NULL && room(marks, PyList_GET_SIZE(self->marks)) < 0)) {
        Py_DECREF(cells);
        Py_DECREF(marks);
        return NULL;
    }
    Py_XSETREF(self->step, Py_NewRef(step));
    Py_XSETREF(self->cells, cells);
    Py_XSETREF(self->marks, marks);
    self->index = at;
    self->flagged = (char)flagged;
    Py_RETURN_NONE;
}

static PyMethodDef recorder_methods[] = {
    {"begin", (PyCFunction)(void (*)(void))recorder_begin, METH_FASTCALL,
     "tracer.begin_collective(name, peer=-1) on the host clock."},
    {"end", (PyCFunction)(void (*)(void))recorder_end, METH_FASTCALL,
     "tracer.end_collective(token, waited_from=None) on the host clock."},
    {"enter", (PyCFunction)recorder_enter, METH_O,
     "The tracer's current step from now on (called under the tracer's lock)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef recorder_members[] = {
    {"off", T_BOOL, offsetof(HostRecorder, off), 0, "The tracer is off: nothing recorded."},
    {"sampled", T_BOOL, offsetof(HostRecorder, sampled), 0,
     "The current step's CPU time is measured: the tracer's methods record it."},
    {NULL, 0, 0, 0, NULL},
};

static int recorder_traverse(HostRecorder *self, visitproc visit, void *arg) {
    Py_VISIT(self->locked);
    Py_VISIT(self->mark);
    Py_VISIT(self->begin);
    Py_VISIT(self->end);
    Py_VISIT(self->kind);
    Py_VISIT(self->no_mark);
    Py_VISIT(self->key);
    Py_VISIT(self->step);
    Py_VISIT(self->cells);
    Py_VISIT(self->marks);
    return 0;
}

static int recorder_clear(HostRecorder *self) {
    Py_CLEAR(self->locked);
    Py_CLEAR(self->mark);
    Py_CLEAR(self->begin);
    Py_CLEAR(self->end);
    Py_CLEAR(self->kind);
    Py_CLEAR(self->no_mark);
    Py_CLEAR(self->key);
    Py_CLEAR(self->step);
    Py_CLEAR(self->cells);
    Py_CLEAR(self->marks);
    return 0;
}

static void recorder_dealloc(HostRecorder *self) {
    PyObject_GC_UnTrack(self);
    recorder_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Whether CLOCK_MONOTONIC read here gives what ``mark`` returns: read between two of its
 * marks. 1, 0, or -1 with an exception set. */
static int same_clock(PyObject *mark) {
#ifdef __linux__
    PyObject *before = PyObject_CallNoArgs(mark);
    struct timespec now;
    int read = clock_gettime(CLOCK_MONOTONIC, &now);
    PyObject *after = before ? PyObject_CallNoArgs(mark) : NULL;
    if (after == NULL) {
        Py_XDECREF(before);
        return -1;
    }
    long long here = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
    long long low = PyLong_AsLongLong(before), high = PyLong_AsLongLong(after);
    Py_DECREF(before);
    Py_DECREF(after);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return read == 0 && low <= here && here <= high;
#else
    (void)mark;
    return 0;
#endif
}

static PyObject *recorder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"lock", "mark", "begin", "end", "kind", "no_mark",
                               "key", "max_cells", "stride", "end_cell", "waited_cell",
                               "slot_bits", "full", NULL};
    PyObject *lock, *mark, *begin, *end, *kind, *no_mark, *key;
    Py_ssize_t max_cells, stride, end_cell, waited_cell;
    long long slot_bits, full;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOnnnnLL", keywords, &lock, &mark,
                                     &begin, &end, &kind, &no_mark, &key, &max_cells, &stride,
                                     &end_cell, &waited_cell, &slot_bits, &full)) {
        return NULL;
    }
    if (slot_bits < 1 || slot_bits > 40 || stride != ROW || end_cell != ROW_END ||
        waited_cell != ROW_WAITED) {
        PyErr_SetString(PyExc_ValueError,
                        "HostRecorder: the cells' layout is not the one hooks.c writes");
        return NULL;
    }
    PyObject *locked = PyObject_GetAttrString(lock, "locked");
    if (locked == NULL) {
        return NULL;
    }
    int direct = same_clock(mark);
    HostRecorder *self = direct < 0 ? NULL : (HostRecorder *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(locked);
        return NULL;
    }
    self->locked = locked;
    self->mark = Py_NewRef(mark);
    self->begin = Py_NewRef(begin);
    self->end = Py_NewRef(end);
    self->kind = Py_NewRef(kind);
    self->no_mark = Py_NewRef(no_mark);
    self->key = Py_NewRef(key);
    self->max_cells = max_cells;
    self->end_cell = end_cell;
    self->waited_cell = waited_cell;
    self->slot_bits = slot_bits;
    self->full = full;
    self->sampled = 1; /* until the tracer says otherwise: everything through its methods */
    self->direct_clock = (char)direct;
    return (PyObject *)self;
}

static PyTypeObject HostRecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_argus_hooks.HostRecorder",
    .tp_doc = "The tracer's begin_collective and end_collective on the host clock.",
    .tp_basicsize = sizeof(HostRecorder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = recorder_new,
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_traverse = (traverseproc)recorder_traverse,
    .tp_clear = (inquiry)recorder_clear,
    .tp_methods = recorder_methods,
    .tp_members = recorder_members,
};

/* The HostRecorder whose bound ``function`` ``method`` is (borrowed), or NULL. */
static HostRecorder *owner_of(PyObject *method, PyCFunction function) {
    if (!PyCFunction_Check(method) || PyCFunction_GET_FUNCTION(method) != function) {
        return NULL;
    }
    PyObject *owner = PyCFunction_GET_SELF(method);
    return owner != NULL && Py_TYPE(owner) == &HostRecorderType ? (HostRecorder *)owner : NULL;
}

#define BEGIN_FUNCTION ((PyCFunction)(void (*)(void))recorder_begin)
#define END_FUNCTION ((PyCFunction)(void (*)(void))recorder_end)

/* begin(name): through the recorder where there is one (new reference, NULL on error). */
static PyObject *call_begin(HostRecorder *recorder, PyObject *begin, PyObject *name) {
    if (recorder != NULL) {
        PyObject *token = NULL;
        int done = record_begin(recorder, name, no_peer, &token);
        if (done != 0) {
            return done < 0 ? NULL : token;
        }
    }
    return PyObject_CallOneArg(begin, name);
}

/* end(token, waited_from): 0, or -1 with an exception set. */
static int call_end(HostRecorder *recorder, PyObject *end, PyObject *token,
                    PyObject *waited_from) {
    if (recorder != NULL) {
        int done = record_end(recorder, token, waited_from);
        if (done != 0) {
            return done < 0 ? -1 : 0;
        }
    }
    PyObject *end_args[2] = {token, waited_from};
    PyObject *done = PyObject_Vectorcall(end, end_args, 2, NULL);
    if (done == NULL) {
        return -1;
    }
    Py_DECREF(done);
    return 0;
}


/* ---- the newest functional result awaiting its wait ------------------------------------ */

/* NewestPending(): the newest collective awaiting its wait, held apart from the dictionary
 * the others wait in: its Work (``Work.wait``) or its functional result (``wait_tensor``), a
 * strong reference, and its token. Nearly every collective is waited for before the next
 * one is issued, on the object it gave: the wait finds it by identity, without the key and
 * dictionary the others go through (a functional result waited on through a view is found
 * by its storage's address, as in the dictionary). Issuing the next collective moves the
 * one held into the dictionary, so one at most is held here; torch keeps a collective's Work
 * and result until its wait as well. */
typedef struct {
    PyObject_HEAD
    PyObject *item;  /* the Work or the result, or NULL */
    PyObject *token;
} NewestPending;

static PyTypeObject NewestPendingType;

/* Take the held collective's token (new reference) and let its item go. */
static PyObject *newest_take(NewestPending *self) {
    PyObject *token = self->token, *item = self->item;
    self->token = self->item = NULL;
    Py_XDECREF(item);
    return token;
}

static PyObject *newest_clear_method(NewestPending *self, PyObject *unused) {
    (void)unused;
    Py_XDECREF(newest_take(self));
    Py_RETURN_NONE;
}

static Py_ssize_t newest_length(NewestPending *self) {
    return self->item != NULL;
}

static int newest_traverse(NewestPending *self, visitproc visit, void *arg) {
    Py_VISIT(self->item);
    Py_VISIT(self->token);
    return 0;
}

static int newest_clear(NewestPending *self) {
    Py_CLEAR(self->item);
    Py_CLEAR(self->token);
    return 0;
}

static void newest_dealloc(NewestPending *self) {
    PyObject_GC_UnTrack(self);
    newest_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef newest_methods[] = {
    {"clear", (PyCFunction)newest_clear_method, METH_NOARGS,
     "Let the held collective go (it is not ended)."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods newest_sequence = {.sq_length = (lenfunc)newest_length};

static PyTypeObject NewestPendingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_argus_hooks.NewestPending",
    .tp_doc = "The newest collective awaiting its wait (its Work or functional result) and "
              "its token (len: 1 while one is held).",
    .tp_basicsize = sizeof(NewestPending),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)newest_dealloc,
    .tp_traverse = (traverseproc)newest_traverse,
    .tp_clear = (inquiry)newest_clear,
    .tp_methods = newest_methods,
    .tp_as_sequence = &newest_sequence,
};


/* Where a tensor's data lives (new reference): key(tensor), the same for the views DTensor
 * waits on as for the collective's result; its id where it has no storage
 * (collectives._storage). */
static PyObject *storage_of(PyObject *key, PyObject *tensor) {
    PyObject *address = PyObject_CallOneArg(key, tensor);
    if (address == NULL && PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        return PyLong_FromVoidPtr(tensor);
    }
    return address;
}

/* Where a pending collective's ``item`` is filed (new reference): key(item), its storage's
 * address, where ``key`` is given (functional results; their id where they have none),
 * else its id (Works). */
static PyObject *pending_key(PyObject *key, PyObject *item) {
    return key != Py_None ? storage_of(key, item) : PyLong_FromVoidPtr(item);
}

/* The collective ``token`` waits in ``pending`` under ``item``'s key, bounded as
 * ``remember(pending, key, token)`` bounds it. 0, or -1 with an exception set. */
static int file_pending(PyObject *pending, Py_ssize_t max_pending, PyObject *remember,
                        PyObject *key, PyObject *item, PyObject *token) {
    PyObject *where = pending_key(key, item);
    if (where == NULL) {
        return -1;
    }
    int failed;
    if (PyDict_CheckExact(pending) && PyDict_GET_SIZE(pending) < max_pending) {
        failed = PyDict_SetItem(pending, where, token);
    } else {
        PyObject *remember_args[3] = {pending, where, token};
        PyObject *done = PyObject_Vectorcall(remember, remember_args, 3, NULL);
        failed = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    Py_DECREF(where);
    return failed;
}

/* The collective ``token`` awaits the wait of ``item``: held as the newest (the one held
 * before moves to ``pending``), or straight in ``pending`` without ``newest``. 0, or -1. */
static int pend_item(NewestPending *newest, PyObject *pending, Py_ssize_t max_pending,
                     PyObject *remember, PyObject *key, PyObject *item, PyObject *token) {
    if (newest == NULL) {
        return file_pending(pending, max_pending, remember, key, item, token);
    }
    while (newest->item != NULL) { /* again if ``remember`` let a thread hold another */
        PyObject *held = Py_NewRef(newest->item);
        PyObject *its = newest_take(newest);
        int failed = file_pending(pending, max_pending, remember, key, held, its);
        Py_DECREF(held);
        Py_DECREF(its);
        if (failed < 0) {
            return -1;
        }
    }
    newest->item = Py_NewRef(item);
    newest->token = Py_NewRef(token);
    return 0;
}

/* ---- the wrappers ---------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original;   /* the unwrapped method: original(group, *args, **kwargs) */
    PyObject *op;         /* the operation's key in the group's names */
    PyObject *state;      /* the Collectives the hooks report through */
    PyObject *attrs;      /* state.__dict__ (muted, compiling, _names read there) */
    PyObject *begin;      /* tracer.begin_collective */
    PyObject *end;        /* tracer.end_collective */
    PyObject *remember;   /* state.remember */
    PyObject *works;      /* state.works: id(work) -> token */
    NewestPending *newest; /* the newest Work, held apart from ``works``; or NULL */
    HostRecorder *recorder; /* the recorder whose begin and end these are, or NULL */
    PyObject *seen;       /* a weak reference to the last group named here, */
    PyObject *seen_name;  /* its phase name, */
    unsigned long long seen_generation; /* and names_generation then */
    Py_ssize_t max_pending;
} TimedMethod;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original; /* the unwrapped Work.wait */
    PyObject *works;    /* state.works */
    PyObject *mark;     /* tracer.mark_now */
    PyObject *end;      /* tracer.end_collective */
    HostRecorder *recorder; /* the recorder whose end this is, or NULL */
    PyObject *key;      /* works are keyed by key(result): its storage's address
                           (wait_tensor); None: by the id of the Work */
    NewestPending *newest; /* the newest Work or result, held apart from ``works``; or NULL */
} TimedWait;

/* state.<name> (new reference), ``attrs`` its __dict__: read there, else as an attribute. */
static PyObject *state_attr(PyObject *state, PyObject *attrs, PyObject *name) {
    PyObject *value = PyDict_GetItemWithError(attrs, name); /* borrowed */
    if (value != NULL) {
        return Py_NewRef(value);
    }
    return PyErr_Occurred() ? NULL : PyObject_GetAttr(state, name);
}

/* state.muted or state.compiling(): 1, 0, or -1 with an exception set. */
static int skipped(PyObject *state, PyObject *attrs) {
    PyObject *muted = PyDict_GetItemWithError(attrs, str_muted); /* borrowed */
    if (muted == NULL && PyErr_Occurred()) {
        return -1;
    }
    int truth = muted == NULL ? 0 : PyObject_IsTrue(muted);
    if (truth != 0) {
        return truth;
    }
    PyObject *flag = PyDict_GetItemWithError(attrs, str_compile_flag); /* borrowed */
    if (flag != NULL && PyTuple_CheckExact(flag) && PyTuple_GET_SIZE(flag) == 2 &&
        PyDict_CheckExact(PyTuple_GET_ITEM(flag, 0))) { /* where the check reads its flag */
        PyObject *value = PyDict_GetItemWithError(PyTuple_GET_ITEM(flag, 0),
                                                  PyTuple_GET_ITEM(flag, 1));
        if (value == Py_True || value == Py_False) {
            return value == Py_True;
        }
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    PyObject *check = state_attr(state, attrs, str_compiling);
    if (check == NULL) {
        return -1;
    }
    PyObject *now = PyObject_CallNoArgs(check);
    Py_DECREF(check);
    if (now == NULL) {
        return -1;
    }
    truth = PyObject_IsTrue(now);
    Py_DECREF(now);
    return truth;
}

/* The names of ``group``'s operations (new reference): the hooks' cache read here, as the
 * Python wrapper reads it, else state.names(group). */
static PyObject *group_names(TimedMethod *self, PyObject *group) {
    PyObject *cache = state_attr(self->state, self->attrs, str_cache);
    if (cache == NULL) {
        return NULL;
    }
    PyObject *names = NULL;
    if (PyDict_Check(cache)) {
        PyObject *key = PyLong_FromVoidPtr(group);
        if (key == NULL) {
            Py_DECREF(cache);
            return NULL;
        }
        PyObject *entry = PyDict_GetItemWithError(cache, key); /* borrowed */
        Py_DECREF(key);
        if (entry == NULL && PyErr_Occurred()) {
            Py_DECREF(cache);
            return NULL;
        }
        if (entry != NULL && PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 2) {
            Py_INCREF(entry); /* the call below may run code that replaces it */
            PyObject *held = PyObject_CallNoArgs(PyTuple_GET_ITEM(entry, 0));
            if (held == NULL) {
                Py_DECREF(entry);
                Py_DECREF(cache);
                return NULL;
            }
            if (held == group) {
                names = Py_NewRef(PyTuple_GET_ITEM(entry, 1));
            }
            Py_DECREF(held);
            Py_DECREF(entry);
        }
    }
    Py_DECREF(cache);
    if (names == NULL) {
        names = PyObject_CallMethodOneArg(self->state, str_names, group);
    }
    return names;
}

/* The phase name of ``op`` on ``group`` (new reference): the last group's, while no group
 * was renamed since, else looked up and remembered. */
static PyObject *phase_name(TimedMethod *self, PyObject *group) {
    if (self->seen != NULL && self->seen_generation == names_generation &&
        refers_to(self->seen, group)) {
        return Py_NewRef(self->seen_name);
    }
    unsigned long long generation = names_generation;
    PyObject *names = group_names(self, group);
    if (names == NULL) {
        return NULL;
    }
    PyObject *name = PyObject_GetItem(names, self->op);
    Py_DECREF(names);
    if (name == NULL || generation != names_generation) { /* renamed meanwhile */
        return name;
    }
    PyObject *seen = PyWeakref_NewRef(group, NULL);
    if (seen == NULL) { /* a group without weak references: looked up each time */
        PyErr_Clear();
        return name;
    }
    Py_XSETREF(self->seen, seen);
    Py_XSETREF(self->seen_name, Py_NewRef(name));
    self->seen_generation = generation;
    return name;
}

static PyObject *timed_method_call(TimedMethod *self, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1) {
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    int skip = skipped(self->state, self->attrs);
    if (skip < 0) {
        return NULL;
    }
    if (skip) {
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    PyObject *name = phase_name(self, args[0]);
    if (name == NULL) {
        return NULL;
    }
    PyObject *token = call_begin(self->recorder, self->begin, name);
    Py_DECREF(name);
    if (token == NULL) {
        return NULL;
    }
    if (token == Py_None && self->newest != NULL && self->newest->item != NULL) {
        Py_DECREF(newest_take(self->newest)); /* the tracer is off: its end would be lost */
    }
    PyObject *work = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    if (work == NULL || token == Py_None) {
        Py_DECREF(token);
        return work;
    }
    int failed;
    if (work == Py_None) {
        failed = call_end(self->recorder, self->end, token, Py_None);
    } else {
        failed = pend_item(self->newest, self->works, self->max_pending, self->remember,
                           Py_None, work, token);
    }
    Py_DECREF(token);
    if (failed) {
        Py_DECREF(work);
        return NULL;
    }
    return work;
}

/* The token of the collective waited for on ``item`` (new reference), taken from the newest
 * one held or the dictionary; NULL, with an exception set or none (not one of ours). */
static PyObject *waited_token(TimedWait *self, PyObject *item) {
    NewestPending *newest = self->newest;
    int held = newest != NULL && newest->item != NULL;
    if (held && newest->item == item) { /* the common case: the object it gave */
        return newest_take(newest);
    }
    PyObject *key = pending_key(self->key, item);
    if (key == NULL) {
        return NULL;
    }
    PyObject *token = NULL;
    if (held && self->key != Py_None) { /* a view of the newest result? */
        PyObject *its = storage_of(self->key, newest->item);
        int same = its == NULL ? -1 : PyObject_RichCompareBool(its, key, Py_EQ);
        Py_XDECREF(its);
        if (same < 0) {
            Py_DECREF(key);
            return NULL;
        }
        if (same) {
            token = newest_take(newest);
        }
    }
    if (token == NULL && PyDict_GET_SIZE(self->works) > 0) {
        token = Py_XNewRef(PyDict_GetItemWithError(self->works, key)); /* borrowed */
        if (token != NULL && PyDict_DelItem(self->works, key) < 0) {
            Py_CLEAR(token);
        }
    }
    Py_DECREF(key);
    return token;
}

static PyObject *timed_wait_call(TimedWait *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1 || !PyDict_CheckExact(self->works) ||
        (PyDict_GET_SIZE(self->works) == 0 &&
         (self->newest == NULL || self->newest->item == NULL))) {
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    PyObject *token = waited_token(self, args[0]);
    if (token == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    /* now, on the current stream */
    PyObject *waited_from = self->recorder ? mark_now(self->recorder)
                                           : PyObject_CallNoArgs(self->mark);
    if (waited_from == NULL) {
        Py_DECREF(token);
        return NULL;
    }
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    int failed = result == NULL || call_end(self->recorder, self->end, token, waited_from) < 0;
    Py_DECREF(token);
    Py_DECREF(waited_from);
    if (failed) {
        Py_XDECREF(result);
        return NULL;
    }
    return result;
}

/* Both types bind like functions: group.allreduce is a bound method of the wrapper. */
static PyObject *bind(PyObject *self, PyObject *obj, PyObject *type) {
    (void)type;
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyObject *always_true(PyObject *self, void *closure) {
    (void)self;
    (void)closure;
    Py_RETURN_TRUE;
}

/* The fields both hook types begin with. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original;
} Hook;
_Static_assert(offsetof(TimedMethod, original) == offsetof(Hook, original), "Hook's prefix");
_Static_assert(offsetof(TimedWait, original) == offsetof(Hook, original), "Hook's prefix");

/* The wrapped method's name, as functools.wraps would give it. */
static PyObject *hook_name(PyObject *self, void *closure) {
    (void)closure;
    return PyObject_GetAttrString(((Hook *)self)->original, "__name__");
}

/* argus_timed(<name>), as the Python wrappers are called. */
static PyObject *hook_qualname(PyObject *self, void *closure) {
    PyObject *name = hook_name(self, closure);
    if (name == NULL) {
        PyErr_Clear();
        return PyUnicode_FromString("argus_timed");
    }
    PyObject *qualname = PyUnicode_FromFormat("argus_timed(%S)", name);
    Py_DECREF(name);
    return qualname;
}

static PyGetSetDef hooks_getset[] = {
    {"_argus", always_true, NULL, "A hook of Argus (never wrapped twice).", NULL},
    {"__name__", hook_name, NULL, "The wrapped method's name.", NULL},
    {"__qualname__", hook_qualname, NULL, "argus_timed(<the wrapped method's name>).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef method_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(TimedMethod, original), READONLY, NULL},
    {"op", T_OBJECT, offsetof(TimedMethod, op), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyMemberDef wait_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(TimedWait, original), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static int method_traverse(TimedMethod *self, visitproc visit, void *arg) {
    Py_VISIT(self->original);
    Py_VISIT(self->op);
    Py_VISIT(self->state);
    Py_VISIT(self->attrs);
    Py_VISIT(self->begin);
    Py_VISIT(self->end);
    Py_VISIT(self->remember);
    Py_VISIT(self->works);
    Py_VISIT(self->newest);
    Py_VISIT(self->recorder);
    Py_VISIT(self->seen);
    Py_VISIT(self->seen_name);
    return 0;
}

static int method_clear(TimedMethod *self) {
    Py_CLEAR(self->original);
    Py_CLEAR(self->op);
    Py_CLEAR(self->state);
    Py_CLEAR(self->attrs);
    Py_CLEAR(self->begin);
    Py_CLEAR(self->end);
    Py_CLEAR(self->remember);
    Py_CLEAR(self->works);
    Py_CLEAR(self->newest);
    Py_CLEAR(self->recorder);
    Py_CLEAR(self->seen);
    Py_CLEAR(self->seen_name);
    return 0;
}

static void method_dealloc(TimedMethod *self) {
    PyObject_GC_UnTrack(self);
    method_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* state.__dict__ (new reference), or NULL with an exception set. */
static PyObject *attributes_of(PyObject *state) {
    PyObject *attrs = PyObject_GetAttrString(state, "__dict__");
    if (attrs != NULL && !PyDict_Check(attrs)) {
        Py_CLEAR(attrs);
        PyErr_SetString(PyExc_TypeError, "the hooks' state has no __dict__");
    }
    return attrs;
}

/* The recorder whose begin and end these are (borrowed), or NULL. */
static HostRecorder *recorder_of(PyObject *begin, PyObject *end) {
    HostRecorder *recorder = owner_of(begin, BEGIN_FUNCTION);
    return recorder == owner_of(end, END_FUNCTION) ? recorder : NULL;
}

static PyObject *method_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"original", "op", "state", "begin", "end", "remember",
                               "max_pending", "newest", NULL};
    PyObject *original, *op, *state, *begin, *end, *remember, *newest = Py_None;
    Py_ssize_t max_pending;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OUOOOOn|O", keywords, &original, &op,
                                     &state, &begin, &end, &remember, &max_pending, &newest)) {
        return NULL;
    }
    if (newest != Py_None && !PyObject_TypeCheck(newest, &NewestPendingType)) {
        PyErr_SetString(PyExc_TypeError, "newest is a NewestPending");
        return NULL;
    }
    PyObject *works = PyObject_GetAttrString(state, "works");
    PyObject *attrs = works ? attributes_of(state) : NULL;
    TimedMethod *self = attrs ? (TimedMethod *)type->tp_alloc(type, 0) : NULL;
    if (self == NULL) {
        Py_XDECREF(works);
        Py_XDECREF(attrs);
        return NULL;
    }
    self->vectorcall = (vectorcallfunc)timed_method_call;
    self->original = Py_NewRef(original);
    self->op = Py_NewRef(op);
    self->state = Py_NewRef(state);
    self->attrs = attrs;
    self->begin = Py_NewRef(begin);
    self->end = Py_NewRef(end);
    self->remember = Py_NewRef(remember);
    self->works = works;
    self->newest = newest == Py_None ? NULL : (NewestPending *)Py_NewRef(newest);
    self->recorder = (HostRecorder *)Py_XNewRef((PyObject *)recorder_of(begin, end));
    self->max_pending = max_pending;
    return (PyObject *)self;
}

static int wait_traverse(TimedWait *self, visitproc visit, void *arg) {
    Py_VISIT(self->original);
    Py_VISIT(self->works);
    Py_VISIT(self->mark);
    Py_VISIT(self->end);
    Py_VISIT(self->recorder);
    Py_VISIT(self->key);
    Py_VISIT(self->newest);
    return 0;
}

static int wait_clear(TimedWait *self) {
    Py_CLEAR(self->original);
    Py_CLEAR(self->works);
    Py_CLEAR(self->mark);
    Py_CLEAR(self->end);
    Py_CLEAR(self->recorder);
    Py_CLEAR(self->key);
    Py_CLEAR(self->newest);
    return 0;
}

static void wait_dealloc(TimedWait *self) {
    PyObject_GC_UnTrack(self);
    wait_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *wait_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"original", "works", "mark", "end", "key", "newest", NULL};
    PyObject *original, *works, *mark, *end, *key = Py_None, *newest = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!OO|OO", keywords, &original,
                                     &PyDict_Type, &works, &mark, &end, &key, &newest)) {
        return NULL;
    }
    if (newest != Py_None && !PyObject_TypeCheck(newest, &NewestPendingType)) {
        PyErr_SetString(PyExc_TypeError, "newest is a NewestPending");
        return NULL;
    }
    TimedWait *self = (TimedWait *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = (vectorcallfunc)timed_wait_call;
    self->original = Py_NewRef(original);
    self->works = Py_NewRef(works);
    self->mark = Py_NewRef(mark);
    self->end = Py_NewRef(end);
    self->key = Py_NewRef(key);
    self->newest = newest == Py_None ? NULL : (NewestPending *)Py_NewRef(newest);
    /* the recorder's clock stands for ``mark`` only where ``mark`` is the recorder's */
    HostRecorder *recorder = owner_of(end, END_FUNCTION);
    if (recorder != NULL && recorder->mark != mark) {
        recorder = NULL;
    }
    self->recorder = (HostRecorder *)Py_XNewRef((PyObject *)recorder);
    return (PyObject *)self;
}

/* ---- the functional collective operators ---------------------------------------------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original;   /* the functional operator's callable */
    PyObject *op;         /* the operation's key in the group's names */
    PyObject *state;      /* the Collectives */
    PyObject *attrs;      /* state.__dict__ */
    PyObject *begin, *end, *remember;
    PyObject *tensors;    /* state.tensors: result's storage -> token */
    PyObject *tensor_type; /* torch.Tensor */
    PyObject *key;        /* the address of a tensor's storage */
    NewestPending *newest; /* the newest result, held apart from ``tensors``; or NULL */
    HostRecorder *recorder; /* the recorder whose begin and end these are, or NULL */
    PyObject *seen_label; /* the last group label named here, */
    PyObject *seen;       /* a weak reference to its group, */
    PyObject *seen_name;  /* its phase name, */
    unsigned long long seen_generation; /* and names_generation then */
    Py_ssize_t max_pending;
} TimedOperator;
_Static_assert(offsetof(TimedOperator, original) == offsetof(Hook, original), "Hook's prefix");

/* The group label a functional operator is called with: its ``group_name`` keyword, else its
 * last positional argument, else None (borrowed). */
static PyObject *group_label(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (kwnames != NULL) {
        Py_ssize_t count = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < count; i++) {
            if (PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, i), str_group_name) == 0) {
                return args[nargs + i];
            }
        }
    }
    return nargs > 0 ? args[nargs - 1] : Py_None;
}

/* The phase name of the operator's ``op`` on the group ``label`` names (new reference): the
 * last label's while its group lives and none was renamed since; else the hooks' cache read
 * here, as the Python wrapper reads it, else state.named(label)[op]. */
static PyObject *labelled_name(TimedOperator *self, PyObject *label) {
    if (self->seen_label != NULL && self->seen_generation == names_generation) {
        /* funcol passes group.group_name: an equal string, not the same one, each call */
        int same = self->seen_label == label ? 1
                   : PyObject_RichCompareBool(self->seen_label, label, Py_EQ);
        if (same < 0) {
            return NULL;
        }
        PyObject *group = same ? referent(self->seen) : NULL; /* still alive */
        Py_XDECREF(group);
        if (group != NULL) {
            return Py_NewRef(self->seen_name);
        }
    }
    unsigned long long generation = names_generation;
    PyObject *cache = state_attr(self->state, self->attrs, str_labelled);
    if (cache == NULL) {
        return NULL;
    }
    PyObject *names = NULL, *seen = NULL;
    if (PyDict_Check(cache)) {
        PyObject *entry = PyDict_GetItemWithError(cache, label); /* borrowed */
        if (entry == NULL && PyErr_Occurred()) {
            Py_DECREF(cache);
            return NULL;
        }
        if (entry != NULL && PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 2) {
            Py_INCREF(entry);
            PyObject *held = PyObject_CallNoArgs(PyTuple_GET_ITEM(entry, 0));
            if (held == NULL) {
                Py_DECREF(entry);
                Py_DECREF(cache);
                return NULL;
            }
            if (held != Py_None) {
                names = Py_NewRef(PyTuple_GET_ITEM(entry, 1));
                if (PyWeakref_CheckRefExact(PyTuple_GET_ITEM(entry, 0))) {
                    seen = Py_NewRef(PyTuple_GET_ITEM(entry, 0));
                }
            }
            Py_DECREF(held);
            Py_DECREF(entry);
        }
    }
    Py_DECREF(cache);
    if (names == NULL) {
        names = PyObject_CallMethodOneArg(self->state, str_named, label);
        if (names == NULL) {
            return NULL;
        }
    }
    PyObject *name = PyObject_GetItem(names, self->op);
    Py_DECREF(names);
    if (name != NULL && seen != NULL && generation == names_generation) {
        Py_XSETREF(self->seen_label, Py_NewRef(label));
        Py_XSETREF(self->seen, Py_NewRef(seen));
        Py_XSETREF(self->seen_name, Py_NewRef(name));
        self->seen_generation = generation;
    }
    Py_XDECREF(seen);
    return name;
}

/* After the operator returned ``result`` for the collective ``token``: pending until the
 * wait_tensor of its (last) result, or ended now when it gave no tensor. 0, or -1. */
static int operator_issued(TimedOperator *self, PyObject *token, PyObject *result) {
    PyObject *last = result;
    if (PyList_CheckExact(result) && PyList_GET_SIZE(result) > 0) {
        last = PyList_GET_ITEM(result, PyList_GET_SIZE(result) - 1);
    }
    Py_INCREF(last);
    int tensor = PyObject_IsInstance(last, self->tensor_type);
    int failed = tensor < 0;
    if (tensor == 0) {
        failed = call_end(self->recorder, self->end, token, Py_None);
    } else if (tensor > 0) {
        failed = pend_item(self->newest, self->tensors, self->max_pending, self->remember,
                           self->key, last, token);
    }
    Py_DECREF(last);
    return failed ? -1 : 0;
}

static PyObject *timed_operator_call(TimedOperator *self, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames) {
    int skip = skipped(self->state, self->attrs);
    if (skip < 0) {
        return NULL;
    }
    if (skip) {
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    PyObject *label = group_label(args, PyVectorcall_NARGS(nargsf), kwnames);
    PyObject *name = labelled_name(self, label);
    if (name == NULL) {
        return NULL;
    }
    PyObject *token = call_begin(self->recorder, self->begin, name);
    Py_DECREF(name);
    if (token == NULL) {
        return NULL;
    }
    if (token == Py_None && self->newest != NULL && self->newest->item != NULL) {
        Py_DECREF(newest_take(self->newest)); /* the tracer is off: its end would be lost */
    }
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    if (result != NULL && token != Py_None && operator_issued(self, token, result) < 0) {
        Py_CLEAR(result);
    }
    Py_DECREF(token);
    return result;
}

static PyMemberDef operator_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(TimedOperator, original), READONLY, NULL},
    {"op", T_OBJECT, offsetof(TimedOperator, op), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static int operator_traverse(TimedOperator *self, visitproc visit, void *arg) {
    Py_VISIT(self->original);
    Py_VISIT(self->op);
    Py_VISIT(self->state);
    Py_VISIT(self->attrs);
    Py_VISIT(self->begin);
    Py_VISIT(self->end);
    Py_VISIT(self->remember);
    Py_VISIT(self->tensors);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->key);
    Py_VISIT(self->newest);
    Py_VISIT(self->recorder);
    Py_VISIT(self->seen_label);
    Py_VISIT(self->seen);
    Py_VISIT(self->seen_name);
    return 0;
}

static int operator_clear(TimedOperator *self) {
    Py_CLEAR(self->original);
    Py_CLEAR(self->op);
    Py_CLEAR(self->state);
    Py_CLEAR(self->attrs);
    Py_CLEAR(self->begin);
    Py_CLEAR(self->end);
    Py_CLEAR(self->remember);
    Py_CLEAR(self->tensors);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->key);
    Py_CLEAR(self->newest);
    Py_CLEAR(self->recorder);
    Py_CLEAR(self->seen_label);
    Py_CLEAR(self->seen);
    Py_CLEAR(self->seen_name);
    return 0;
}

static void operator_dealloc(TimedOperator *self) {
    PyObject_GC_UnTrack(self);
    operator_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *operator_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"original", "op", "state", "begin", "end", "remember",
                               "max_pending", "tensor_type", "key", "newest", NULL};
    PyObject *original, *op, *state, *begin, *end, *remember, *tensor_type, *key;
    PyObject *newest = Py_None;
    Py_ssize_t max_pending;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OUOOOOnOO|O", keywords, &original, &op,
                                     &state, &begin, &end, &remember, &max_pending,
                                     &tensor_type, &key, &newest)) {
        return NULL;
    }
    if (newest != Py_None && !PyObject_TypeCheck(newest, &NewestPendingType)) {
        PyErr_SetString(PyExc_TypeError, "newest is a NewestPending");
        return NULL;
    }
    PyObject *tensors = PyObject_GetAttrString(state, "tensors");
    PyObject *attrs = tensors ? attributes_of(state) : NULL;
    TimedOperator *self = attrs ? (TimedOperator *)type->tp_alloc(type, 0) : NULL;
    if (self == NULL) {
        Py_XDECREF(tensors);
        Py_XDECREF(attrs);
        return NULL;
    }
    self->vectorcall = (vectorcallfunc)timed_operator_call;
    self->original = Py_NewRef(original);
    self->op = Py_NewRef(op);
    self->state = Py_NewRef(state);
    self->attrs = attrs;
    self->begin = Py_NewRef(begin);
    self->end = Py_NewRef(end);
    self->remember = Py_NewRef(remember);
    self->tensors = tensors;
    self->tensor_type = Py_NewRef(tensor_type);
    self->key = Py_NewRef(key);
    self->newest = newest == Py_None ? NULL : (NewestPending *)Py_NewRef(newest);
    self->recorder = (HostRecorder *)Py_XNewRef((PyObject *)recorder_of(begin, end));
    self->max_pending = max_pending;
    return (PyObject *)self;
}

#define HOOK_FLAGS (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | \
                    Py_TPFLAGS_METHOD_DESCRIPTOR)

static PyTypeObject TimedMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_argus_hooks.TimedMethod",
    .tp_doc = "A ProcessGroup collective timed for the tracer (collectives._timed_method).",
    .tp_basicsize = sizeof(TimedMethod),
    .tp_flags = HOOK_FLAGS,
    .tp_new = method_new,
    .tp_dealloc = (destructor)method_dealloc,
    .tp_traverse = (traverseproc)method_traverse,
    .tp_clear = (inquiry)method_clear,
    .tp_vectorcall_offset = offsetof(TimedMethod, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = bind,
    .tp_getset = hooks_getset,
    .tp_members = method_members,
};

static PyTypeObject TimedWaitType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_argus_hooks.TimedWait",
    .tp_doc = "Work.wait ending the collective it waits for (collectives.timed_wait).",
    .tp_basicsize = sizeof(TimedWait),
    .tp_flags = HOOK_FLAGS,
    .tp_new = wait_new,
    .tp_dealloc = (destructor)wait_dealloc,
    .tp_traverse = (traverseproc)wait_traverse,
    .tp_clear = (inquiry)wait_clear,
    .tp_vectorcall_offset = offsetof(TimedWait, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = bind,
    .tp_getset = hooks_getset,
    .tp_members = wait_members,
};

static PyTypeObject TimedOperatorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_argus_hooks.TimedOperator",
    .tp_doc = "A functional collective operator timed for the tracer "
              "(collectives._timed_operator).",
    .tp_basicsize = sizeof(TimedOperator),
    .tp_flags = HOOK_FLAGS,
    .tp_new = operator_new,
    .tp_dealloc = (destructor)operator_dealloc,
    .tp_traverse = (traverseproc)operator_traverse,
    .tp_clear = (inquiry)operator_clear,
    .tp_vectorcall_offset = offsetof(TimedOperator, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = bind,
    .tp_getset = hooks_getset,
    .tp_members = operator_members,
};


/* ---- the module ------------------------------------------------------------------------ */

static PyObject *abi(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    return PyLong_FromLong(ARGUS_HOOKS_ABI);
}

static PyObject *renamed(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    names_generation++;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"abi", abi, METH_NOARGS, "The interface version the Python side checks."},
    {"renamed", renamed, METH_NOARGS,
     "Groups were renamed: the wrappers look their groups' names up again."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef hooks_module = {
    PyModuleDef_HEAD_INIT, "_argus_hooks",
    "The collective hooks' wrappers without a Python frame (exporters/_native/hooks.c).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__argus_hooks(void) {
    str_muted = PyUnicode_InternFromString("muted");
    str_compiling = PyUnicode_InternFromString("compiling");
    str_compile_flag = PyUnicode_InternFromString("compile_flag");
    str_names = PyUnicode_InternFromString("names");
    str_cache = PyUnicode_InternFromString("_names");
    str_cells = PyUnicode_InternFromString("cells");
    str_marks = PyUnicode_InternFromString("marks");
    str_index = PyUnicode_InternFromString("index");
    str_collectives = PyUnicode_InternFromString("collectives");
    str_labelled = PyUnicode_InternFromString("_labelled");
    str_named = PyUnicode_InternFromString("named");
    str_group_name = PyUnicode_InternFromString("group_name");
    no_peer = PyLong_FromLong(-1);
    if (!str_muted || !str_compiling || !str_compile_flag || !str_names || !str_cache || !str_cells ||
        !str_marks || !str_index || !str_collectives || !str_labelled || !str_named ||
        !str_group_name || !no_peer ||
        PyType_Ready(&TimedMethodType) < 0 || PyType_Ready(&TimedWaitType) < 0 ||
        PyType_Ready(&TimedOperatorType) < 0 || PyType_Ready(&HostRecorderType) < 0 ||
        PyType_Ready(&NewestPendingType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&hooks_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "TimedMethod", (PyObject *)&TimedMethodType) < 0 ||
        PyModule_AddObjectRef(module, "TimedWait", (PyObject *)&TimedWaitType) < 0 ||
        PyModule_AddObjectRef(module, "TimedOperator", (PyObject *)&TimedOperatorType) < 0 ||
        PyModule_AddObjectRef(module, "HostRecorder", (PyObject *)&HostRecorderType) < 0 ||
        PyModule_AddObjectRef(module, "NewestPending", (PyObject *)&NewestPendingType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
