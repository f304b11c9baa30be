/* ==== kv-aware's decision: the workers' record values kept per candidates' list (helper pick20) ====================
 *
 * Included by index.c after decide17.c. kv_decide read, per worker and per decision, ``instance_id``,
 * ``kv_block_size`` and ``capacity.kv_blocks`` from the worker records: pydantic models, each read a getattr through
 * BaseModel's ``__getattr__`` hook into the record's and its Capacity's ``__dict__`` (issue 15's seventeenth round:
 * with the policy's own attributes ~23 % of a decision live, on cold memory). The candidates' list the router hands
 * over is the same object from one fleet change to the next (Candidates._group: the list of a (model, role, kind),
 * rebuilt only when the fleet's mapping is replaced), so the values are read once per list and kept in C:
 *
 *   facts = [workers, packed, refs]   (KvEvictPolicy._decide_facts, the last item of kv_decide's cfg)
 *
 * ``workers`` the list they were read from (held: its id cannot be reused), ``packed`` a bytes object holding one
 * D20Fact per worker (the record's pointer, its id and block size objects, the size and capacity as C values) and
 * ``refs`` a tuple holding the records, ids and sizes the packed pointers name. They are used when ``workers`` is the
 * same list object with the same length and the same record objects at every position (a list changed in place is
 * read again); else read again, as kv_decide read them, and kept. A worker record is never changed in place (a fleet
 * change replaces it: the fleet views parse a new record), so the values are the record's. */

/* D20Fact (one worker's values: its record, id and block size objects, borrowed from ``refs``; the size and capacity
 * as C values) is declared in index.c, before kv_decide reads it */

enum { D20_WORKERS, D20_PACKED, D20_REFS, D20_N };

static PyObject *STR_D20_ID, *STR_D20_SIZE, *STR_D20_CAPACITY, *STR_D20_KV_BLOCKS;

/* the kept facts when they are ``workers``' (the same list, length and records), else NULL (no error set) */
static const D20Fact *d20_kept(PyObject *facts, PyObject *workers) {
    if (PyList_GET_ITEM(facts, D20_WORKERS) != workers) return NULL;
    PyObject *packed = PyList_GET_ITEM(facts, D20_PACKED);
    Py_ssize_t n = PyList_GET_SIZE(workers);
    if (!PyBytes_CheckExact(packed) || PyBytes_GET_SIZE(packed) != n * (Py_ssize_t)sizeof(D20Fact)) return NULL;
    const D20Fact *f = (const D20Fact *)PyBytes_AS_STRING(packed);
    for (Py_ssize_t i = 0; i < n; i++)
        if (f[i].worker != PyList_GET_ITEM(workers, i)) return NULL;
    return f;
}

/* an int attribute as a long long (-1 with an error set on failure) */
static int d20_ll(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* ``workers``' facts, kept in ``facts`` (a list of D20_N items) for the next decision with the same list: read here
 * when not kept yet. NULL with an error set when a record lacks a value or a block size is not positive (kv_decide's
 * errors, nothing kept). */
static const D20Fact *d20_facts(PyObject *facts, PyObject *workers) {
    if (!PyList_CheckExact(facts) || PyList_GET_SIZE(facts) != D20_N) {
        PyErr_SetString(PyExc_TypeError, "kv_decide: the workers' facts are a list of 3");
        return NULL;
    }
    const D20Fact *kept = d20_kept(facts, workers);
    if (kept != NULL) return kept;
    Py_ssize_t n = PyList_GET_SIZE(workers);
    PyObject *packed = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(D20Fact));
    PyObject *refs = packed ? PyTuple_New(3 * n) : NULL;
    if (refs == NULL) {
        Py_XDECREF(packed);
        return NULL;
    }
    D20Fact *f = (D20Fact *)PyBytes_AS_STRING(packed);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *worker = PyList_GET_ITEM(workers, i), *wid, *size, *cap;
        PyTuple_SET_ITEM(refs, 3 * i, Py_NewRef(worker));
        f[i].worker = worker;
        if ((wid = PyObject_GetAttr(worker, STR_D20_ID)) == NULL) goto fail;
        PyTuple_SET_ITEM(refs, 3 * i + 1, wid);
        f[i].wid = wid;
        if ((size = PyObject_GetAttr(worker, STR_D20_SIZE)) == NULL) goto fail;
        PyTuple_SET_ITEM(refs, 3 * i + 2, size);
        f[i].size_obj = size;
        if ((cap = PyObject_GetAttr(worker, STR_D20_CAPACITY)) == NULL) goto fail;
        int bad = d20_ll(cap, STR_D20_KV_BLOCKS, &f[i].capacity) < 0;
        Py_DECREF(cap);
        f[i].size = bad ? 0 : PyLong_AsLongLong(size);
        if (bad || (f[i].size == -1 && PyErr_Occurred())) goto fail;
        if (f[i].size <= 0) {
            PyErr_SetString(PyExc_ValueError, "kv_decide: the block size must be positive");
            goto fail;
        }
    }
    /* the list itself last: a list kept is one whose facts are all there */
    if (PyList_SetItem(facts, D20_PACKED, packed) < 0 || PyList_SetItem(facts, D20_REFS, refs) < 0) {
        packed = refs = NULL;  /* stolen either way */
        return NULL;
    }
    if (PyList_SetItem(facts, D20_WORKERS, Py_NewRef(workers)) < 0) return NULL;
    return (const D20Fact *)PyBytes_AS_STRING(PyList_GET_ITEM(facts, D20_PACKED));
fail:
    Py_DECREF(packed);
    Py_DECREF(refs);  /* the tuple's unset items are NULL: its dealloc skips them */
    return NULL;
}

static int add_decide20(void) {
    STR_D20_ID = PyUnicode_InternFromString("instance_id");
    STR_D20_SIZE = PyUnicode_InternFromString("kv_block_size");
    STR_D20_CAPACITY = PyUnicode_InternFromString("capacity");
    STR_D20_KV_BLOCKS = PyUnicode_InternFromString("kv_blocks");
    return STR_D20_ID == NULL || STR_D20_SIZE == NULL || STR_D20_CAPACITY == NULL || STR_D20_KV_BLOCKS == NULL ? -1
                                                                                                             : 0;
}
