/* ==== The load tracker's per-worker cells and tickets, and the prediction's prefetch (helper legs14) ================
 *
 * Included by index.c (it uses U64Map and load_refs_step). infera/kv/load.py's LoadTracker keeps, on this path, each
 * worker's load in a LoadCell and hands out LoadTickets; begin, prefill_done and end are one C call each (the Python
 * path's frames, a Ticket dataclass per request and a frozen TtftSample's five object.__setattr__ were ~2/3 of the
 * legs' bookkeeping). The values are the Python path's to the object: the clock's readings are kept as the objects
 * it returned (started, busy_since, a TTFT's seconds as ``now - started``), counts as ints, the TTFT window's
 * minimum kept as Python's lines do (a ``min`` over the window only when the minimum itself leaves it).
 *
 * load_begin(loads, clock, maxlen, worker_id, prefill_tokens, hashes, tail_blocks) -> LoadTicket
 *     (loads: worker id -> LoadCell, a cell made with ``maxlen`` TTFT samples for a worker not in it yet)
 * load_prefill_done(clock, sample_type, ticket) -> None   (sample_type: TtftSample, a slots class of 5 fields)
 * load_end(ticket) -> None                                 (idempotent)
 * (the arguments that stay the same lead, so that the tracker binds them once with functools.partial)
 * predict_map_prefetch(...): predict_map_add with the worker's expiry slots prefetched first (a routed prompt's ~64
 * slots are mostly cold by then: the walk waited on each miss in turn, ~10 µs of the legs stage) */

#include <structmember.h>

typedef struct {
    PyObject_HEAD
    long long in_flight, prefill_tokens, tail_blocks, prefilling, ttft_count;
    PyObject *busy_since;    /* the clock's reading when the worker started on its queued prefill (0.0 at first) */
    PyObject *block_refs;    /* router hash -> tickets holding it: a U64Map(False) */
    PyObject *ttfts;         /* deque(maxlen=TTFT_SAMPLES) of TtftSample */
    PyObject *ttft_seconds;  /* deque(maxlen=TTFT_SAMPLES) of their seconds */
    PyObject *ttft_fastest;  /* min(ttft_seconds), 0.0 while empty */
    Py_ssize_t maxlen;
} LoadCell;

typedef struct {
    PyObject_HEAD
    PyObject *worker_id, *hashes, *load, *started;
    long long prefill_tokens, tail_blocks, met_queued, met_decoding, met_active;
    char prefilling, open;
} LoadTicket;

static PyTypeObject LoadCellType, LoadTicketType;
static PyObject *LOAD_DEQUE, *LOAD_FZERO, *STR_APPEND;

static PyObject *cell_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Py_ssize_t maxlen;
    static char *kwlist[] = {"maxlen", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &maxlen)) return NULL;
    if (maxlen < 1) {
        PyErr_SetString(PyExc_ValueError, "LoadCell: maxlen must be positive");
        return NULL;
    }
    LoadCell *c = (LoadCell *)type->tp_alloc(type, 0);
    if (c == NULL) return NULL;
    c->maxlen = maxlen;
    c->busy_since = Py_NewRef(LOAD_FZERO);
    c->ttft_fastest = Py_NewRef(LOAD_FZERO);
    c->block_refs = PyObject_CallOneArg((PyObject *)&U64MapType, Py_False);
    PyObject *kw = c->block_refs ? Py_BuildValue("{s:n}", "maxlen", maxlen) : NULL;
    PyObject *empty = kw ? PyTuple_New(0) : NULL;
    if (empty != NULL) {
        c->ttfts = PyObject_Call(LOAD_DEQUE, empty, kw);
        c->ttft_seconds = c->ttfts ? PyObject_Call(LOAD_DEQUE, empty, kw) : NULL;
    }
    Py_XDECREF(kw);
    Py_XDECREF(empty);
    if (c->ttft_seconds == NULL) {
        Py_DECREF(c);
        return NULL;
    }
    return (PyObject *)c;
}

static int cell_traverse(LoadCell *c, visitproc visit, void *arg) {
    Py_VISIT(c->busy_since);
    Py_VISIT(c->block_refs);
    Py_VISIT(c->ttfts);
    Py_VISIT(c->ttft_seconds);
    Py_VISIT(c->ttft_fastest);
    return 0;
}

static int cell_clear(LoadCell *c) {
    Py_CLEAR(c->busy_since);
    Py_CLEAR(c->block_refs);
    Py_CLEAR(c->ttfts);
    Py_CLEAR(c->ttft_seconds);
    Py_CLEAR(c->ttft_fastest);
    return 0;
}

static void cell_dealloc(LoadCell *c) {
    PyObject_GC_UnTrack(c);
    cell_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyMemberDef cell_members[] = {
    {"in_flight", T_LONGLONG, offsetof(LoadCell, in_flight), READONLY, NULL},
    {"prefill_tokens", T_LONGLONG, offsetof(LoadCell, prefill_tokens), READONLY, NULL},
    {"tail_blocks", T_LONGLONG, offsetof(LoadCell, tail_blocks), READONLY, NULL},
    {"prefilling", T_LONGLONG, offsetof(LoadCell, prefilling), READONLY, NULL},
    {"ttft_count", T_LONGLONG, offsetof(LoadCell, ttft_count), READONLY, NULL},
    {"busy_since", T_OBJECT, offsetof(LoadCell, busy_since), READONLY, NULL},
    {"block_refs", T_OBJECT, offsetof(LoadCell, block_refs), READONLY, NULL},
    {"ttfts", T_OBJECT, offsetof(LoadCell, ttfts), READONLY, NULL},
    {"ttft_seconds", T_OBJECT, offsetof(LoadCell, ttft_seconds), READONLY, NULL},
    {"ttft_fastest", T_OBJECT, offsetof(LoadCell, ttft_fastest), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject LoadCellType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "infera.kv._native.LoadCell",
    .tp_basicsize = sizeof(LoadCell),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One worker's in-flight load (LoadTracker's C path): LoadCell(maxlen) with maxlen TTFT samples kept.",
    .tp_new = cell_new,
    .tp_traverse = (traverseproc)cell_traverse,
    .tp_clear = (inquiry)cell_clear,
    .tp_dealloc = (destructor)cell_dealloc,
    .tp_members = cell_members,
};

static int ticket_traverse(LoadTicket *t, visitproc visit, void *arg) {
    Py_VISIT(t->worker_id);
    Py_VISIT(t->hashes);
    Py_VISIT(t->load);
    Py_VISIT(t->started);
    return 0;
}

static int ticket_clear(LoadTicket *t) {
    Py_CLEAR(t->worker_id);
    Py_CLEAR(t->hashes);
    Py_CLEAR(t->load);
    Py_CLEAR(t->started);
    return 0;
}

static void ticket_dealloc(LoadTicket *t) {
    PyObject_GC_UnTrack(t);
    ticket_clear(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *ticket_met(LoadTicket *t, void *unused) {
    return Py_BuildValue("(LLL)", t->met_queued, t->met_decoding, t->met_active);
}

static PyGetSetDef ticket_getset[] = {
    {"met", (getter)ticket_met, NULL, "(queued tokens, decoding, active blocks) at dispatch", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef ticket_members[] = {
    {"worker_id", T_OBJECT, offsetof(LoadTicket, worker_id), READONLY, NULL},
    {"prefill_tokens", T_LONGLONG, offsetof(LoadTicket, prefill_tokens), READONLY, NULL},
    {"hashes", T_OBJECT, offsetof(LoadTicket, hashes), READONLY, NULL},
    {"tail_blocks", T_LONGLONG, offsetof(LoadTicket, tail_blocks), READONLY, NULL},
    {"load", T_OBJECT, offsetof(LoadTicket, load), READONLY, NULL},
    {"started", T_OBJECT, offsetof(LoadTicket, started), READONLY, NULL},
    {"prefilling", T_BOOL, offsetof(LoadTicket, prefilling), READONLY, NULL},
    {"open", T_BOOL, offsetof(LoadTicket, open), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject LoadTicketType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "infera.kv._native.LoadTicket",
    .tp_basicsize = sizeof(LoadTicket),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One request's load ticket on a LoadCell (made by load_begin).",
    .tp_traverse = (traverseproc)ticket_traverse,
    .tp_clear = (inquiry)ticket_clear,
    .tp_dealloc = (destructor)ticket_dealloc,
    .tp_members = ticket_members,
    .tp_getset = ticket_getset,
};

/* The ``n`` arguments named ``names`` of a METH_FASTCALL | METH_KEYWORDS call, positional or by keyword (as a Python
 * function takes them), into ``out`` (borrowed); -1 with a TypeError as Python's for a missing, repeated or unknown one */
static int call_args(const char *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *const *names,
                     Py_ssize_t n, PyObject **out) {
    if (nargs > n) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd positional arguments but %zd were given", fn, n, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) out[i] = i < nargs ? args[i] : NULL;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t i = 0;
        while (i < n && PyUnicode_CompareWithASCIIString(key, names[i]) != 0) i++;
        if (i == n) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fn, key);
            return -1;
        }
        if (out[i] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fn, names[i]);
            return -1;
        }
        out[i] = args[nargs + k];
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument: '%s'", fn, names[i]);
            return -1;
        }
    }
    return 0;
}

/* Prefetch the home slots of ``hashes``' keys in ``m`` (a hint: nothing read or changed; any other sequence, or a key
 * that is no u64, is left to the loop that follows to refuse). A prompt's slots are mostly cold by the time it is
 * placed or released; the loops then wait on each miss in turn, where prefetched misses overlap. */
static void prefetch_slots(const U64Map *m, PyObject *hashes) {
    if (m->cap == 0 || !(PyList_CheckExact(hashes) || PyTuple_CheckExact(hashes))) return;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(hashes);
    PyObject **items = PySequence_Fast_ITEMS(hashes);
    for (Py_ssize_t k = 0; k < n; k++) {
        uint64_t key;
        int r = map_key(items[k], &key);
        if (r == 1) __builtin_prefetch(&m->slots[map_home(m, key)]);
        else if (r < 0) PyErr_Clear();
    }
}

/* load_begin's work with its numbers parsed (also legs_hold's first step, csrc/hold18.c) */
static PyObject *begin_ticket(PyObject *loads, PyObject *clock, PyObject *maxlen, PyObject *worker_id, long long prefill,
                              PyObject *hashes, long long tail) {
    if (!PyDict_CheckExact(loads)) {
        PyErr_SetString(PyExc_TypeError, "load_begin: loads must be a dict");
        return NULL;
    }
    PyObject *cell = PyDict_GetItemWithError(loads, worker_id);  /* borrowed */
    if (cell == NULL) {
        if (PyErr_Occurred()) return NULL;
        cell = PyObject_CallOneArg((PyObject *)&LoadCellType, maxlen);
        if (cell == NULL) return NULL;
        int rc = PyDict_SetItem(loads, worker_id, cell);
        Py_DECREF(cell);  /* the dict holds it */
        if (rc < 0) return NULL;
    } else if (!Py_IS_TYPE(cell, &LoadCellType)) {
        PyErr_SetString(PyExc_TypeError, "load_begin: the worker's load is no LoadCell");
        return NULL;
    }
    LoadCell *c = (LoadCell *)cell;
    prefetch_slots((U64Map *)c->block_refs, hashes);  /* first: the clock's calls overlap the misses */
    long long queued = c->prefill_tokens, decoding = c->in_flight - c->prefilling;
    long long active = (long long)((U64Map *)c->block_refs)->used + c->tail_blocks;
    c->in_flight++;
    if (!c->prefilling) {
        PyObject *now = PyObject_CallNoArgs(clock);
        if (now == NULL) return NULL;
        Py_SETREF(c->busy_since, now);
    }
    c->prefilling++;
    c->prefill_tokens += prefill;
    c->tail_blocks += tail;
    PyObject *refs_args[2] = {c->block_refs, hashes};
    if (load_refs_step(refs_args, 2, 1) < 0) return NULL;
    PyObject *started = PyObject_CallNoArgs(clock);
    if (started == NULL) return NULL;
    LoadTicket *t = PyObject_GC_New(LoadTicket, &LoadTicketType);
    if (t == NULL) {
        Py_DECREF(started);
        return NULL;
    }
    t->worker_id = Py_NewRef(worker_id);
    t->hashes = Py_NewRef(hashes);
    t->load = Py_NewRef(cell);
    t->started = started;
    t->prefill_tokens = prefill;
    t->tail_blocks = tail;
    t->met_queued = queued;
    t->met_decoding = decoding;
    t->met_active = active;
    t->prefilling = 1;
    t->open = 1;
    PyObject_GC_Track(t);
    return (PyObject *)t;
}

static PyObject *load_begin(PyObject *self, PyObject *const *given, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[7] = {"loads", "clock", "maxlen", "worker_id", "prefill_tokens", "hashes",
                                         "tail_blocks"};
    PyObject *args[7];
    if (call_args("load_begin", given, nargs, kwnames, names, 7, args) < 0) return NULL;
    if (!PyDict_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "load_begin: loads must be a dict");
        return NULL;
    }
    long long prefill = PyLong_AsLongLong(args[4]), tail = PyLong_AsLongLong(args[6]);
    if ((prefill == -1 || tail == -1) && PyErr_Occurred()) return NULL;
    return begin_ticket(args[0], args[1], args[2], args[3], prefill, args[5], tail);
}

/* a TtftSample's five slots, by their member descriptors' offsets (looked up again for another class) */
static PyTypeObject *SAMPLE_TYPE;
static Py_ssize_t SAMPLE_OFFSETS[5];

static int sample_offsets(PyTypeObject *type) {
    static const char *names[5] = {"seconds", "queued_tokens", "prefill_tokens", "decoding", "active_blocks"};
    if (type == SAMPLE_TYPE) return 0;
    if (type->tp_dictoffset != 0 || type->tp_alloc == NULL) goto bad;
    for (int k = 0; k < 5; k++) {
        PyObject *d = PyDict_GetItemString(type->tp_dict, names[k]);
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)) goto bad;
        PyMemberDef *md = ((PyMemberDescrObject *)d)->d_member;
        if (md->type != T_OBJECT_EX || (md->flags & READONLY)) goto bad;
        SAMPLE_OFFSETS[k] = md->offset;
    }
    SAMPLE_TYPE = type;
    return 0;
bad:
    PyErr_SetString(PyExc_TypeError, "load_prefill_done: sample_type must be a slots class with seconds, "
                    "queued_tokens, prefill_tokens, decoding, active_blocks");
    return -1;
}

/* ``a == b`` as the operator answers it (no identity shortcut: a NaN is not equal to itself) */
static int equal(PyObject *a, PyObject *b) {
    PyObject *r = PyObject_RichCompare(a, b, Py_EQ);
    if (r == NULL) return -1;
    int truth = PyObject_IsTrue(r);
    Py_DECREF(r);
    return truth;
}

static void settle(LoadTicket *t) {
    if (t->prefilling) {
        LoadCell *c = (LoadCell *)t->load;
        t->prefilling = 0;
        c->prefilling--;
        c->prefill_tokens -= t->prefill_tokens;
    }
}

static PyObject *load_prefill_done(PyObject *self, PyObject *const *given, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[3] = {"clock", "sample_type", "ticket"};
    PyObject *args[3];
    if (call_args("load_prefill_done", given, nargs, kwnames, names, 3, args) < 0) return NULL;
    if (!Py_IS_TYPE(args[2], &LoadTicketType) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "load_prefill_done: a clock, a sample type and a LoadTicket");
        return NULL;
    }
    LoadTicket *t = (LoadTicket *)args[2];
    if (!(t->open && t->prefilling)) Py_RETURN_NONE;
    PyTypeObject *stype = (PyTypeObject *)args[1];
    if (sample_offsets(stype) < 0) return NULL;
    LoadCell *c = (LoadCell *)t->load;
    PyObject *now = PyObject_CallNoArgs(args[0]);
    if (now == NULL) return NULL;
    PyObject *seconds = PyNumber_Subtract(now, t->started);
    PyObject *sample = NULL, *leaving = NULL, *r = NULL;
    if (seconds == NULL) goto done;
    sample = stype->tp_alloc(stype, 0);
    if (sample == NULL) goto done;
    PyObject *vals[5] = {Py_NewRef(seconds), PyLong_FromLongLong(t->met_queued), PyLong_FromLongLong(t->prefill_tokens),
                         PyLong_FromLongLong(t->met_decoding), PyLong_FromLongLong(t->met_active)};
    int bad = 0;
    for (int k = 0; k < 5; k++) {
        if (vals[k] == NULL) bad = 1;
        *(PyObject **)((char *)sample + SAMPLE_OFFSETS[k]) = vals[k];
    }
    if (bad) goto done;
    r = PyObject_CallMethodOneArg(c->ttfts, STR_APPEND, sample);
    if (r == NULL) goto done;
    Py_DECREF(r);
    PyObject *window = c->ttft_seconds;
    Py_ssize_t size = PyObject_Size(window);
    if (size < 0) goto done;
    if (size == c->maxlen && (leaving = PySequence_GetItem(window, 0)) == NULL) goto done;
    r = PyObject_CallMethodOneArg(window, STR_APPEND, seconds);
    if (r == NULL) goto done;
    Py_CLEAR(r);
    /* the window's minimum, kept exact: looked for again only when the minimum itself left the window */
    int eq = 0, lt = 0;
    if ((size == c->maxlen ? size : size + 1) == 1) {
        Py_SETREF(c->ttft_fastest, Py_NewRef(seconds));
    } else if (leaving != NULL && (eq = equal(leaving, c->ttft_fastest)) != 0) {
        if (eq < 0) goto done;
        PyObject *least = NULL, *it = PyObject_GetIter(window), *item;
        if (it == NULL) goto done;
        while ((item = PyIter_Next(it)) != NULL) {  /* min(window): the first of the least, as min() keeps */
            int less = least == NULL ? 1 : PyObject_RichCompareBool(item, least, Py_LT);
            if (less < 0) {
                Py_DECREF(item);
                break;
            }
            if (less) Py_XSETREF(least, item);
            else Py_DECREF(item);
        }
        Py_DECREF(it);
        if (PyErr_Occurred() || least == NULL) {
            Py_XDECREF(least);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "min() arg is an empty sequence");
            goto done;
        }
        Py_SETREF(c->ttft_fastest, least);
    } else if ((lt = PyObject_RichCompareBool(seconds, c->ttft_fastest, Py_LT)) != 0) {
        if (lt < 0) goto done;
        Py_SETREF(c->ttft_fastest, Py_NewRef(seconds));
    }
    c->ttft_count++;
    Py_SETREF(c->busy_since, Py_NewRef(now));
    settle(t);
    r = Py_NewRef(Py_None);
done:
    Py_DECREF(now);
    Py_XDECREF(seconds);
    Py_XDECREF(sample);
    Py_XDECREF(leaving);
    return r;
}

static PyObject *load_end(PyObject *self, PyObject *const *given, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[1] = {"ticket"};
    PyObject *args[1];
    if (call_args("load_end", given, nargs, kwnames, names, 1, args) < 0) return NULL;
    if (!Py_IS_TYPE(args[0], &LoadTicketType)) {
        PyErr_SetString(PyExc_TypeError, "load_end takes a LoadTicket");
        return NULL;
    }
    LoadTicket *t = (LoadTicket *)args[0];
    if (!t->open) Py_RETURN_NONE;
    prefetch_slots((U64Map *)((LoadCell *)t->load)->block_refs, t->hashes);
    settle(t);  /* a request that failed or was cancelled first is no TTFT sample */
    t->open = 0;
    LoadCell *c = (LoadCell *)t->load;
    c->in_flight--;
    c->tail_blocks -= t->tail_blocks;
    PyObject *refs_args[2] = {c->block_refs, t->hashes};
    if (load_refs_step(refs_args, 2, 0) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *predict_map_prefetch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs == 5 && IS_MAP(args[0])) prefetch_slots((const U64Map *)args[0], args[3]);
    return predict_map_add(self, args, nargs);
}

static PyMethodDef load_methods[] = {
    {"load_begin", (PyCFunction)(void (*)(void))load_begin, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"load_prefill_done", (PyCFunction)(void (*)(void))load_prefill_done, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"load_end", (PyCFunction)(void (*)(void))load_end, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"predict_map_prefetch", (PyCFunction)(void (*)(void))predict_map_prefetch, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static int add_load(PyObject *mod) {
    PyObject *collections = PyImport_ImportModule("collections");
    if (collections == NULL) return -1;
    LOAD_DEQUE = PyObject_GetAttrString(collections, "deque");
    Py_DECREF(collections);
    LOAD_FZERO = PyFloat_FromDouble(0.0);
    STR_APPEND = PyUnicode_InternFromString("append");
    if (LOAD_DEQUE == NULL || LOAD_FZERO == NULL || STR_APPEND == NULL) return -1;
    if (PyType_Ready(&LoadCellType) < 0 || PyType_Ready(&LoadTicketType) < 0) return -1;
    if (PyModule_AddObjectRef(mod, "LoadCell", (PyObject *)&LoadCellType) < 0 ||
        PyModule_AddObjectRef(mod, "LoadTicket", (PyObject *)&LoadTicketType) < 0)
        return -1;
    return PyModule_AddFunctions(mod, load_methods);
}
