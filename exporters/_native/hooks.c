/* The collective hooks' wrappers as a CPython extension (``_argus_hooks``): the same calls
 * as ``collectives._timed_method`` and ``_patch_process_group``'s ``timed_wait``, made without
 * a Python frame of their own.
 *
 * A collective's wrappers run on the training thread right after it returns from waiting
 * on the backend, with the caches cold: each Python frame, bytecode and inline cache they
 * touch costs there several times its hot time. These types do what the Python wrappers do,
 * in the same order and with the same objects (the tracer's methods, the hooks' dictionaries
 * and caches), so either implementation records the same intervals; ``collectives.py`` uses
 * them where this module loads and its own wrappers elsewhere.
 *
 * TimedMethod(original, op, state, begin, end, remember, max_pending): a ProcessGroup
 *     method (not a point-to-point one); binds like a function (an unbound method
 *     descriptor: ``group.allreduce(...)`` calls it with the group first).
 * TimedWait(original, works, mark, end): ``Work.wait``.
 * HostRecorder(tracer, layout): the tracer's ``begin_collective`` and ``end_collective`` on
 *     the host clock (``recorder.begin``, ``recorder.end``), the same cells and marks in the
 *     same order under the tracer's lock; anything off the common path (the tracer off, a
 *     step whose CPU time is sampled, its first mark, a late or full end) is left to the
 *     tracer's own methods.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define ARGUS_HOOKS_ABI 1

static PyObject *str_muted;     /* "muted" */
static PyObject *str_compiling; /* "compiling" */
static PyObject *str_names;     /* "names" */
static PyObject *str_cache;     /* "_names" */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original;   /* the unwrapped method: original(group, *args, **kwargs) */
    PyObject *op;         /* the operation's key in the group's names */
    PyObject *state;      /* the Collectives the hooks report through */
    PyObject *begin;      /* tracer.begin_collective */
    PyObject *end;        /* tracer.end_collective */
    PyObject *remember;   /* state.remember */
    PyObject *works;      /* state.works: id(work) -> token */
    Py_ssize_t max_pending;
} TimedMethod;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original; /* the unwrapped Work.wait */
    PyObject *works;    /* state.works */
    PyObject *mark;     /* tracer.mark_now */
    PyObject *end;      /* tracer.end_collective */
} TimedWait;

/* state.muted or state.compiling(): 1, 0, or -1 with an exception set. */
static int skipped(PyObject *state) {
    PyObject *muted = PyObject_GetAttr(state, str_muted);
    if (muted == NULL) {
        return -1;
    }
    int truth = PyObject_IsTrue(muted);
    Py_DECREF(muted);
    if (truth != 0) {
        return truth;
    }
    PyObject *check = PyObject_GetAttr(state, str_compiling);
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

/* The phase name of ``op`` on ``group`` (new reference): the hooks' cache read here, as the
 * Python wrapper reads it, else state.names(group)[op]. */
static PyObject *phase_name(TimedMethod *self, PyObject *group) {
    PyObject *cache = PyObject_GetAttr(self->state, str_cache);
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
        if (names == NULL) {
            return NULL;
        }
    }
    PyObject *name = PyObject_GetItem(names, self->op);
    Py_DECREF(names);
    return name;
}

static PyObject *timed_method_call(TimedMethod *self, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1) {
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    int skip = skipped(self->state);
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
    PyObject *token = PyObject_CallOneArg(self->begin, name);
    Py_DECREF(name);
    if (token == NULL) {
        return NULL;
    }
    PyObject *work = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    if (work == NULL || token == Py_None) {
        Py_DECREF(token);
        return work;
    }
    PyObject *done = NULL;
    if (work == Py_None) {
        PyObject *end_args[2] = {token, Py_None};
        done = PyObject_Vectorcall(self->end, end_args, 2, NULL);
    } else {
        PyObject *key = PyLong_FromVoidPtr(work);
        if (key != NULL) {
            if (PyDict_CheckExact(self->works) && PyDict_GET_SIZE(self->works) < self->max_pending) {
                done = PyDict_SetItem(self->works, key, token) == 0 ? Py_NewRef(Py_None) : NULL;
            } else {
                PyObject *remember_args[3] = {self->works, key, token};
                done = PyObject_Vectorcall(self->remember, remember_args, 3, NULL);
            }
            Py_DECREF(key);
        }
    }
    Py_DECREF(token);
    if (done == NULL) {
        Py_DECREF(work);
        return NULL;
    }
    Py_DECREF(done);
    return work;
}

static PyObject *timed_wait_call(TimedWait *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1 || !PyDict_CheckExact(self->works) || PyDict_GET_SIZE(self->works) == 0) {
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    PyObject *key = PyLong_FromVoidPtr(args[0]);
    if (key == NULL) {
        return NULL;
    }
    PyObject *token = PyDict_GetItemWithError(self->works, key); /* borrowed */
    if (token == NULL) {
        Py_DECREF(key);
        if (PyErr_Occurred()) {
            return NULL;
        }
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    Py_INCREF(token);
    int popped = PyDict_DelItem(self->works, key);
    Py_DECREF(key);
    if (popped < 0) {
        Py_DECREF(token);
        return NULL;
    }
    PyObject *waited_from = PyObject_CallNoArgs(self->mark); /* now, on the current stream */
    if (waited_from == NULL) {
        Py_DECREF(token);
        return NULL;
    }
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    if (result == NULL) {
        Py_DECREF(token);
        Py_DECREF(waited_from);
        return NULL;
    }
    PyObject *end_args[2] = {token, waited_from};
    PyObject *done = PyObject_Vectorcall(self->end, end_args, 2, NULL);
    Py_DECREF(token);
    Py_DECREF(waited_from);
    if (done == NULL) {
        Py_DECREF(result);
        return NULL;
    }
    Py_DECREF(done);
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
    Py_VISIT(self->begin);
    Py_VISIT(self->end);
    Py_VISIT(self->remember);
    Py_VISIT(self->works);
    return 0;
}

static int method_clear(TimedMethod *self) {
    Py_CLEAR(self->original);
    Py_CLEAR(self->op);
    Py_CLEAR(self->state);
    Py_CLEAR(self->begin);
    Py_CLEAR(self->end);
    Py_CLEAR(self->remember);
    Py_CLEAR(self->works);
    return 0;
}

static void method_dealloc(TimedMethod *self) {
    PyObject_GC_UnTrack(self);
    method_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *method_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"original", "op", "state", "begin", "end", "remember",
                               "max_pending", NULL};
    PyObject *original, *op, *state, *begin, *end, *remember;
    Py_ssize_t max_pending;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OUOOOOn", keywords, &original, &op,
                                     &state, &begin, &end, &remember, &max_pending)) {
        return NULL;
    }
    PyObject *works = PyObject_GetAttrString(state, "works");
    if (works == NULL) {
        return NULL;
    }
    TimedMethod *self = (TimedMethod *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(works);
        return NULL;
    }
    self->vectorcall = (vectorcallfunc)timed_method_call;
    self->original = Py_NewRef(original);
    self->op = Py_NewRef(op);
    self->state = Py_NewRef(state);
    self->begin = Py_NewRef(begin);
    self->end = Py_NewRef(end);
    self->remember = Py_NewRef(remember);
    self->works = works;
    self->max_pending = max_pending;
    return (PyObject *)self;
}

static int wait_traverse(TimedWait *self, visitproc visit, void *arg) {
    Py_VISIT(self->original);
    Py_VISIT(self->works);
    Py_VISIT(self->mark);
    Py_VISIT(self->end);
    return 0;
}

static int wait_clear(TimedWait *self) {
    Py_CLEAR(self->original);
    Py_CLEAR(self->works);
    Py_CLEAR(self->mark);
    Py_CLEAR(self->end);
    return 0;
}

static void wait_dealloc(TimedWait *self) {
    PyObject_GC_UnTrack(self);
    wait_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *wait_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"original", "works", "mark", "end", NULL};
    PyObject *original, *works, *mark, *end;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!OO", keywords, &original, &PyDict_Type,
                                     &works, &mark, &end)) {
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


/* ---- the host clock's recording ------------------------------------------------------ */

static PyObject *str_off, *str_sampled, *str_lock, *str_current, *str_cells, *str_marks,
    *str_index, *str_collectives, *str_acquire, *str_release, *one;

typedef struct {
    PyObject_HEAD
    PyObject *tracer;
    PyObject *mark;       /* tracer.mark_now */
    PyObject *begin;      /* tracer.begin_collective (everything off the common path) */
    PyObject *end;        /* tracer.end_collective */
    PyObject *kind;       /* COLLECTIVE */
    PyObject *no_mark;    /* NO_MARK */
    PyObject *key;        /* the host clock's one stream key */
    Py_ssize_t max_cells, stride, end_cell, waited_cell;
    long long slot_bits, full;
} HostRecorder;

/* getattr(obj, name) as a truth value: 1, 0, or -1 with an exception set. */
static int attr_true(PyObject *obj, PyObject *name) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) {
        return -1;
    }
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth;
}

/* lock.acquire() / lock.release(): 0, or -1 with an exception set. */
static int lock_call(PyObject *lock, PyObject *method) {
    PyObject *done = PyObject_CallMethodNoArgs(lock, method);
    if (done == NULL) {
        return -1;
    }
    Py_DECREF(done);
    return 0;
}

/* The step's index as a C integer: 0, or -1 with an exception set. */
static int step_index(PyObject *step, long long *index) {
    PyObject *value = PyObject_GetAttr(step, str_index);
    if (value == NULL) {
        return -1;
    }
    *index = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return (*index == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* Under the lock: begin_collective's cells for ``name`` in the current step, its token in
 * *token (NULL: left to the tracer's method). 0, or -1 with an exception set. */
static int begin_locked(HostRecorder *self, PyObject *name, PyObject *peer, PyObject **token) {
    PyObject *step = PyObject_GetAttr(self->tracer, str_current);
    if (step == NULL) {
        return -1;
    }
    int status = -1;
    PyObject *cells = PyObject_GetAttr(step, str_cells);
    PyObject *marks = cells ? PyObject_GetAttr(step, str_marks) : NULL;
    long long index;
    if (marks == NULL || !PyList_CheckExact(cells) || !PyList_CheckExact(marks) ||
        step_index(step, &index) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "a step's cells and marks are lists");
        }
        goto done;
    }
    Py_ssize_t base = PyList_GET_SIZE(cells);
    if (base >= self->max_cells) {
        *token = PyLong_FromLongLong((index << self->slot_bits) | self->full);
        status = *token ? 0 : -1;
        goto done;
    }
    if (PyList_GET_SIZE(marks) == 0) { /* the step's first mark opens it: the method's */
        *token = NULL;
        status = 0;
        goto done;
    }
    PyObject *start = PyLong_FromSsize_t(PyList_GET_SIZE(marks));
    PyObject *now = start ? PyObject_CallNoArgs(self->mark) : NULL;
    if (now == NULL || PyList_Append(marks, now) < 0) {
        Py_XDECREF(start);
        Py_XDECREF(now);
        goto done;
    }
    Py_DECREF(now);
    PyObject *row[8] = {name, start, self->no_mark, self->kind, self->no_mark, self->key,
                        Py_None, peer};
    for (int i = 0; i < 8; i++) {
        if (PyList_Append(cells, row[i]) < 0) {
            Py_DECREF(start);
            goto done;
        }
    }
    Py_DECREF(start);
    PyObject *count = PyObject_GetAttr(step, str_collectives);
    PyObject *more = count ? PyNumber_Add(count, one) : NULL;
    Py_XDECREF(count);
    if (more == NULL || PyObject_SetAttr(step, str_collectives, more) < 0) {
        Py_XDECREF(more);
        goto done;
    }
    Py_DECREF(more);
    *token = PyLong_FromLongLong((index << self->slot_bits) | (long long)base);
    status = *token ? 0 : -1;
done:
    Py_XDECREF(cells);
    Py_XDECREF(marks);
    Py_DECREF(step);
    return status;
}

/* recorder.begin(name, peer=NO_PEER): tracer.begin_collective(name, peer) on the host clock. */
static PyObject *recorder_begin(HostRecorder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "begin(name, peer=-1)");
        return NULL;
    }
    int off = attr_true(self->tracer, str_off);
    if (off != 0) {
        return off < 0 ? NULL : Py_NewRef(Py_None);
    }
    int sampled = attr_true(self->tracer, str_sampled);
    if (sampled != 0) { /* its CPU time is measured: the method does that */
        return sampled < 0 ? NULL : PyObject_Vectorcall(self->begin, args, nargs, NULL);
    }
    PyObject *peer = nargs > 1 ? args[1] : NULL;
    PyObject *no_peer = NULL;
    if (peer == NULL) {
        peer = no_peer = PyLong_FromLong(-1);
        if (peer == NULL) {
            return NULL;
        }
    }
    PyObject *lock = PyObject_GetAttr(self->tracer, str_lock);
    if (lock == NULL || lock_call(lock, str_acquire) < 0) {
        Py_XDECREF(lock);
        Py_XDECREF(no_peer);
        return NULL;
    }
    PyObject *token = NULL;
    int status = begin_locked(self, args[0], peer, &token);
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    int released = lock_call(lock, str_release);
    Py_DECREF(lock);
    Py_XDECREF(no_peer);
    if (status < 0 || released < 0) {
        if (type != NULL) {
            PyErr_Restore(type, value, trace);
        }
        Py_XDECREF(token);
        return NULL;
    }
    if (token == NULL) { /* off the common path */
        return PyObject_Vectorcall(self->begin, args, nargs, NULL);
    }
    return token;
}

/* Under the lock: end_collective's marks for ``token``; *late is 1 when the token's step has
 * closed, 0 when ended, 2 when left to the tracer's method. 0, or -1 with an exception. */
static int end_locked(HostRecorder *self, long long token, PyObject *waited_from, int *late) {
    PyObject *step = PyObject_GetAttr(self->tracer, str_current);
    if (step == NULL) {
        return -1;
    }
    int status = -1;
    PyObject *cells = PyObject_GetAttr(step, str_cells);
    PyObject *marks = cells ? PyObject_GetAttr(step, str_marks) : NULL;
    long long index;
    if (marks == NULL || !PyList_CheckExact(cells) || !PyList_CheckExact(marks) ||
        step_index(step, &index) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "a step's cells and marks are lists");
        }
        goto done;
    }
    long long base = token & ((1LL << self->slot_bits) - 1);
    if ((token >> self->slot_bits) != index || base == self->full ||
        base + self->waited_cell >= PyList_GET_SIZE(cells)) {
        *late = 2;
        status = 0;
        goto done;
    }
    PyObject *now = PyObject_CallNoArgs(self->mark);
    if (now == NULL) {
        goto done;
    }
    PyObject *end = PyLong_FromSsize_t(PyList_GET_SIZE(marks));
    if (end == NULL || PyList_SetItem(cells, base + self->end_cell, end) < 0) {
        Py_DECREF(now);
        goto done; /* SetItem took ``end`` either way */
    }
    if (PyList_Append(marks, now) < 0) {
        Py_DECREF(now);
        goto done;
    }
    Py_DECREF(now);
    if (waited_from != Py_None) {
        PyObject *waited = PyLong_FromSsize_t(PyList_GET_SIZE(marks));
        if (waited == NULL || PyList_SetItem(cells, base + self->waited_cell, waited) < 0 ||
            PyList_Append(marks, waited_from) < 0) {
            goto done;
        }
    }
    *late = 0;
    status = 0;
done:
    Py_XDECREF(cells);
    Py_XDECREF(marks);
    Py_DECREF(step);
    return status;
}

/* recorder.end(token, waited_from=None): tracer.end_collective on the host clock. */
static PyObject *recorder_end(HostRecorder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "end(token, waited_from=None)");
        return NULL;
    }
    PyObject *waited_from = nargs > 1 ? args[1] : Py_None;
    if (!PyLong_CheckExact(args[0])) { /* None (Argus was off at its begin) */
        return PyObject_Vectorcall(self->end, args, nargs, NULL);
    }
    int off = attr_true(self->tracer, str_off);
    if (off != 0) {
        return off < 0 ? NULL : PyObject_Vectorcall(self->end, args, nargs, NULL);
    }
    long long token = PyLong_AsLongLong(args[0]);
    if (token == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *lock = PyObject_GetAttr(self->tracer, str_lock);
    if (lock == NULL || lock_call(lock, str_acquire) < 0) {
        Py_XDECREF(lock);
        return NULL;
    }
    int late = 2;
    int status = end_locked(self, token, waited_from, &late);
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    int released = lock_call(lock, str_release);
    Py_DECREF(lock);
    if (status < 0 || released < 0) {
        if (type != NULL) {
            PyErr_Restore(type, value, trace);
        }
        return NULL;
    }
    if (late != 0) { /* a late or full end: the method counts it */
        return PyObject_Vectorcall(self->end, args, nargs, NULL);
    }
    Py_RETURN_NONE;
}

static PyMethodDef recorder_methods[] = {
    {"begin", (PyCFunction)(void (*)(void))recorder_begin, METH_FASTCALL,
     "tracer.begin_collective(name, peer=-1) on the host clock."},
    {"end", (PyCFunction)(void (*)(void))recorder_end, METH_FASTCALL,
     "tracer.end_collective(token, waited_from=None) on the host clock."},
    {NULL, NULL, 0, NULL},
};

static int recorder_traverse(HostRecorder *self, visitproc visit, void *arg) {
    Py_VISIT(self->tracer);
    Py_VISIT(self->mark);
    Py_VISIT(self->begin);
    Py_VISIT(self->end);
    Py_VISIT(self->kind);
    Py_VISIT(self->no_mark);
    Py_VISIT(self->key);
    return 0;
}

static int recorder_clear(HostRecorder *self) {
    Py_CLEAR(self->tracer);
    Py_CLEAR(self->mark);
    Py_CLEAR(self->begin);
    Py_CLEAR(self->end);
    Py_CLEAR(self->kind);
    Py_CLEAR(self->no_mark);
    Py_CLEAR(self->key);
    return 0;
}

static void recorder_dealloc(HostRecorder *self) {
    PyObject_GC_UnTrack(self);
    recorder_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *recorder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"tracer", "mark", "begin", "end", "kind", "no_mark", "key",
                               "max_cells", "stride", "end_cell", "waited_cell", "slot_bits",
                               "full", NULL};
    PyObject *tracer, *mark, *begin, *end, *kind, *no_mark, *key;
    Py_ssize_t max_cells, stride, end_cell, waited_cell;
    long long slot_bits, full;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOnnnnLL", keywords, &tracer, &mark,
                                     &begin, &end, &kind, &no_mark, &key, &max_cells, &stride,
                                     &end_cell, &waited_cell, &slot_bits, &full)) {
        return NULL;
    }
    if (slot_bits < 1 || slot_bits > 40 || end_cell >= stride || waited_cell >= stride) {
        PyErr_SetString(PyExc_ValueError, "HostRecorder: an impossible layout");
        return NULL;
    }
    HostRecorder *self = (HostRecorder *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->tracer = Py_NewRef(tracer);
    self->mark = Py_NewRef(mark);
    self->begin = Py_NewRef(begin);
    self->end = Py_NewRef(end);
    self->kind = Py_NewRef(kind);
    self->no_mark = Py_NewRef(no_mark);
    self->key = Py_NewRef(key);
    self->max_cells = max_cells;
    self->stride = stride;
    self->end_cell = end_cell;
    self->waited_cell = waited_cell;
    self->slot_bits = slot_bits;
    self->full = full;
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
};

static PyObject *abi(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    return PyLong_FromLong(ARGUS_HOOKS_ABI);
}

static PyMethodDef module_methods[] = {
    {"abi", abi, METH_NOARGS, "The interface version the Python side checks."},
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
    str_names = PyUnicode_InternFromString("names");
    str_cache = PyUnicode_InternFromString("_names");
    str_off = PyUnicode_InternFromString("_off");
    str_sampled = PyUnicode_InternFromString("_sampled");
    str_lock = PyUnicode_InternFromString("_lock");
    str_current = PyUnicode_InternFromString("_current");
    str_cells = PyUnicode_InternFromString("cells");
    str_marks = PyUnicode_InternFromString("marks");
    str_index = PyUnicode_InternFromString("index");
    str_collectives = PyUnicode_InternFromString("collectives");
    str_acquire = PyUnicode_InternFromString("acquire");
    str_release = PyUnicode_InternFromString("release");
    one = PyLong_FromLong(1);
    if (!str_muted || !str_compiling || !str_names || !str_cache || !str_off ||
        !str_sampled || !str_lock || !str_current || !str_cells || !str_marks || !str_index ||
        !str_collectives || !str_acquire || !str_release || !one ||
        PyType_Ready(&TimedMethodType) < 0 || PyType_Ready(&TimedWaitType) < 0 ||
        PyType_Ready(&HostRecorderType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&hooks_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "TimedMethod", (PyObject *)&TimedMethodType) < 0 ||
        PyModule_AddObjectRef(module, "TimedWait", (PyObject *)&TimedWaitType) < 0 ||
        PyModule_AddObjectRef(module, "HostRecorder", (PyObject *)&HostRecorderType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
