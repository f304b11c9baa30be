/* ==== kv-aware's decision: the load tracker's and the index's reads without their Python frames (helper pick16) =====
 *
 * Included by index.c after load.c (it reads LoadCell). kv_decide (index.c, helper pick14's block) asked the tracker
 * and the index through their bound methods: per worker prefill_tokens, active_blocks, held, ttft_samples, decoding,
 * and block_count per holder of the previous prompt, ~5 Python frames a worker (issue 15's fourteenth round: most of
 * what was left of a decision's Python calls). Where the policy hands it the tracker's cells (``LoadTracker._load``
 * on its C path) and the index's worker tables (``PrefixIndex._workers``), these read the same fields as those
 * methods' one-line bodies do, to the same values:
 *
 *   prefill_tokens(w)  load.prefill_tokens if load else 0
 *   active_blocks(w)   len(load.block_refs) + load.tail_blocks if load else 0
 *   decoding(w)        load.in_flight - load.prefilling if load else 0
 *   ttft_samples(w)    (load.ttft_count, load.ttfts) if load else (0, ())
 *   ttft_seconds(w), ttft_fastest(w)   load.ttft_seconds, load.ttft_fastest if load else (), 0.0
 *   held(w)            (len(worker.blocks), bool(worker.lower)) if worker is not None else (0, False)
 *   block_count(w)     len(worker.blocks) if worker is not None else 0
 *
 * (``load`` a LoadCell or absent: a dict holding anything else is an error, not a guess.) */

static PyObject *STR_D16_BLOCKS, *STR_D16_LOWER;

static int d16_cell(PyObject *cells, PyObject *wid, LoadCell **out) {
    PyObject *c = PyDict_GetItemWithError(cells, wid);
    if (c == NULL) {
        *out = NULL;
        return PyErr_Occurred() ? -1 : 0;
    }
    if (Py_TYPE(c) != &LoadCellType) {
        PyErr_SetString(PyExc_TypeError, "kv_decide: the tracker's cells hold LoadCell objects");
        return -1;
    }
    *out = (LoadCell *)c;
    return 0;
}

/* prefill_tokens(wid), active_blocks(wid) */
static int d16_load(PyObject *cells, PyObject *wid, long long *queued, long long *active) {
    LoadCell *c;
    if (d16_cell(cells, wid, &c) < 0) return -1;
    if (c == NULL) {
        *queued = *active = 0;
        return 0;
    }
    if (!IS_MAP(c->block_refs)) {
        PyErr_SetString(PyExc_TypeError, "kv_decide: a cell's block references are a U64Map");
        return -1;
    }
    *queued = c->prefill_tokens;
    *active = (long long)((U64Map *)c->block_refs)->used + c->tail_blocks;
    return 0;
}

/* decoding(wid) */
static int d16_decoding(PyObject *cells, PyObject *wid, long long *out) {
    LoadCell *c;
    if (d16_cell(cells, wid, &c) < 0) return -1;
    *out = c == NULL ? 0 : c->in_flight - c->prefilling;
    return 0;
}

/* ttft_samples(wid): a new (count, window) tuple */
static PyObject *d16_samples(PyObject *cells, PyObject *wid) {
    LoadCell *c;
    if (d16_cell(cells, wid, &c) < 0) return NULL;
    if (c == NULL) {
        PyObject *empty = PyTuple_New(0);
        if (empty == NULL) return NULL;
        PyObject *t = PyTuple_Pack(2, ZERO, empty);
        Py_DECREF(empty);
        return t;
    }
    PyObject *count = PyLong_FromLongLong(c->ttft_count);
    if (count == NULL) return NULL;
    PyObject *t = PyTuple_Pack(2, count, c->ttfts);
    Py_DECREF(count);
    return t;
}

/* ttft_seconds(wid), ttft_fastest(wid): new references */
static int d16_seconds(PyObject *cells, PyObject *wid, PyObject **seconds, PyObject **fastest) {
    LoadCell *c;
    if (d16_cell(cells, wid, &c) < 0) return -1;
    if (c == NULL) {
        *seconds = PyTuple_New(0);
        *fastest = *seconds ? PyFloat_FromDouble(0.0) : NULL;
    } else {
        *seconds = Py_NewRef(c->ttft_seconds);
        *fastest = Py_NewRef(c->ttft_fastest);
    }
    if (*fastest == NULL) {
        Py_CLEAR(*seconds);
        return -1;
    }
    return 0;
}

/* held(wid) (lower: NULL for block_count alone) */
static int d16_held(PyObject *tables, PyObject *wid, long long *cached, int *lower) {
    PyObject *w = PyDict_GetItemWithError(tables, wid);
    if (w == NULL) {
        *cached = 0;
        if (lower != NULL) *lower = 0;
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *blocks = PyObject_GetAttr(w, STR_D16_BLOCKS);
    if (blocks == NULL) return -1;
    Py_ssize_t n = PyObject_Size(blocks);
    Py_DECREF(blocks);
    if (n < 0) return -1;
    *cached = (long long)n;
    if (lower == NULL) return 0;
    PyObject *lo = PyObject_GetAttr(w, STR_D16_LOWER);
    if (lo == NULL) return -1;
    *lower = PyObject_IsTrue(lo);
    Py_DECREF(lo);
    return *lower < 0 ? -1 : 0;
}

/* KvTtftPolicy._refresh for a worker whose kept sums ``sums`` are behind ``count`` (the C branch, kv_refresh, with the
 * tracker's seconds and fastest; ``fallback(sums, seconds)`` sets the two sums by sum() when an item is not a float) */
static int d16_refresh(PyObject *cells, PyObject *fallback, PyObject *sums, PyObject *wid, PyObject *samples,
                       PyObject *count, long long capacity) {
    PyObject *seconds, *fastest;
    if (d16_seconds(cells, wid, &seconds, &fastest) < 0) return -1;
    PyObject *cap = PyLong_FromLongLong(capacity);
    PyObject *got = NULL;
    if (cap != NULL) {
        PyObject *rargs[6] = {sums, samples, count, cap, seconds, fastest};
        got = kv_refresh(NULL, rargs, 6);
        Py_DECREF(cap);
    }
    Py_DECREF(fastest);
    if (got == Py_None) {
        Py_DECREF(got);
        got = call2(fallback, sums, seconds);
    }
    Py_DECREF(seconds);
    if (got == NULL) return -1;
    Py_DECREF(got);
    return 0;
}

static int add_decide16(void) {
    STR_D16_BLOCKS = PyUnicode_InternFromString("blocks");
    STR_D16_LOWER = PyUnicode_InternFromString("lower");
    return STR_D16_BLOCKS == NULL || STR_D16_LOWER == NULL ? -1 : 0;
}
