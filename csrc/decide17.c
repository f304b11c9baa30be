/* ==== kv-aware's decision: the index's holding() and overlaps_and_confirmed() without their Python frames ==========
 * (helper place17)
 *
 * Included by index.c after decide16.c. kv_decide asked the index, through its bound methods, which workers hold the
 * previous prompt's last block (``holding``: a Python frame, and one for the predictions' prune it calls) and for the
 * prompt's overlaps (``overlaps_and_confirmed``: a frame, the prune's again, and its checks before the one walk).
 * Live those ~5 frames a decision cost what their lines cost on cold caches (issue 15's fifteenth round: a decision's
 * time was mostly Python lines waiting on memory, not its C loops). Where the index hands over its tables
 * (``PrefixIndex.decide_parts``), these do the same:
 *
 *   holding(block, now)    the workers of holders.get(block, 0) | predicted.get(block, 0) (the predictions pruned at
 *                          ``now`` first when any are kept), lowest slot first, each once
 *   overlaps_and_confirmed(hashes, t)   its one walk, walk_both(hashes, shared, holders, names, predicted, -1), when
 *                          the method takes it: some prompt block, predictions kept (pruned at ``t``), and no
 *                          remembered run that may start at the prompt (none kept, or the prompt is not capturable
 *                          and no run starts with its first block); else the method itself is called (its prune then
 *                          finds nothing due: the same state)
 *
 * The prune (``Predictions.prune(now, workers)``) is called only when the heap's earliest expiry is due: with none
 * due it changes nothing. And ``ctx.hashes(size)`` (twice a decision: the previous prompt's and this one's) is read
 * from the context's kept lists where it has them (d17_hashes). */

enum { IP_HOLDERS, IP_SHARED, IP_PREDICTED, IP_HEAP, IP_NAMES, IP_RUNS, IP_PRUNE, IP_WORKERS, IP_MIN_BLOCKS, IP_N };

static PyObject *D17_ALL;  /* -1: every worker's guesses count */
static PyObject *STR_D17_KEPT;

/* the index's parts (decide_parts' tuple) as an array, or NULL with an error */
static PyObject **d17_parts(PyObject *parts) {
    if (!PyTuple_Check(parts) || PyTuple_GET_SIZE(parts) != IP_N) {
        PyErr_SetString(PyExc_TypeError, "kv_decide: the index's parts are decide_parts()' tuple");
        return NULL;
    }
    PyObject **ip = &PyTuple_GET_ITEM(parts, 0);
    if (!PyDict_Check(ip[IP_SHARED]) || !PyDict_Check(ip[IP_PREDICTED]) || !PyList_Check(ip[IP_HEAP]) ||
        !PyList_Check(ip[IP_NAMES]) || !(ip[IP_RUNS] == Py_None || PyDict_Check(ip[IP_RUNS])) ||
        !(PyDict_Check(ip[IP_HOLDERS]) || IS_MAP(ip[IP_HOLDERS]))) {
        PyErr_SetString(PyExc_TypeError, "kv_decide: the index's parts are its tables");
        return NULL;
    }
    return ip;
}

/* Predictions.prune(now, workers) when the earliest expiry is due (``heap[0][0] <= now``) */
static int d17_prune(PyObject **ip, PyObject *now) {
    PyObject *heap = ip[IP_HEAP];
    if (PyList_GET_SIZE(heap) == 0) return 0;
    PyObject *head = PyList_GET_ITEM(heap, 0);
    if (!PyTuple_Check(head) || PyTuple_GET_SIZE(head) < 1) {
        PyErr_SetString(PyExc_TypeError, "kv_decide: the expiry heap holds (expiry, ...) tuples");
        return -1;
    }
    PyObject *expiry = Py_NewRef(PyTuple_GET_ITEM(head, 0));
    int due = PyObject_RichCompareBool(expiry, now, Py_LE);
    Py_DECREF(expiry);
    if (due <= 0) return due;
    PyObject *r = call2(ip[IP_PRUNE], now, ip[IP_WORKERS]);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* holding(block, now): a new list of the names, lowest slot first, each once (the Python's list(dict)) */
static PyObject *d17_holding(PyObject **ip, PyObject *block, PyObject *now) {
    PyObject *mask = tab_get(ip[IP_HOLDERS], block);
    if (mask == NULL && PyErr_Occurred()) return NULL;
    Py_XINCREF(mask);
    if (PyList_GET_SIZE(ip[IP_HEAP]) > 0) {
        if (d17_prune(ip, now) < 0) goto fail;
        if (PyDict_GET_SIZE(ip[IP_PREDICTED]) > 0) {
            PyObject *g = PyDict_GetItemWithError(ip[IP_PREDICTED], block);
            if (g == NULL && PyErr_Occurred()) goto fail;
            if (g != NULL) {
                PyObject *both = mask == NULL ? Py_NewRef(g) : PyNumber_Or(mask, g);
                Py_XDECREF(mask);
                mask = both;
                if (mask == NULL) return NULL;
            }
        }
    }
    PyObject *seen = PyDict_New();
    if (seen == NULL) goto fail;
    if (mask != NULL) {
        if (!PyLong_Check(mask)) {
            PyErr_SetString(PyExc_TypeError, "masks must be ints");
            Py_DECREF(seen);
            goto fail;
        }
        size_t bits = _PyLong_NumBits(mask);
        if (bits == (size_t)-1) {
            Py_DECREF(seen);
            goto fail;
        }
        size_t nbytes = (bits + 7) / 8;
        unsigned char stack[128], *bytes = nbytes <= sizeof stack ? stack : PyMem_Malloc(nbytes ? nbytes : 1);
        if (bytes == NULL) {
            Py_DECREF(seen);
            PyErr_NoMemory();
            goto fail;
        }
        int bad = nbytes > 0 && AS_BYTES(mask, bytes, nbytes) < 0;
        for (size_t b = 0; !bad && b < nbytes; b++) {
            for (unsigned v = bytes[b]; v && !bad; v &= v - 1) {
                Py_ssize_t slot = (Py_ssize_t)(b * 8 + (size_t)__builtin_ctz(v));
                if (slot >= PyList_GET_SIZE(ip[IP_NAMES])) {
                    PyErr_SetString(PyExc_IndexError, "list index out of range");
                    bad = 1;
                } else {
                    bad = PyDict_SetItem(seen, PyList_GET_ITEM(ip[IP_NAMES], slot), Py_None) < 0;
                }
            }
        }
        if (bytes != stack) PyMem_Free(bytes);
        if (bad) {
            Py_DECREF(seen);
            goto fail;
        }
    }
    Py_XDECREF(mask);
    PyObject *out = PyDict_Keys(seen);
    Py_DECREF(seen);
    return out;
fail:
    Py_XDECREF(mask);
    return NULL;
}

/* overlaps_and_confirmed(hashes, t)'s one walk, (overlaps, confirmed); NULL without an error where the method takes
 * another path (the caller calls it) */
static PyObject *d17_overlaps(PyObject **ip, PyObject *hashes, PyObject *t) {
    if (!PyList_Check(hashes) || PyList_GET_SIZE(hashes) == 0 || PyList_GET_SIZE(ip[IP_HEAP]) == 0) return NULL;
    if (d17_prune(ip, t) < 0) return NULL;
    if (PyDict_GET_SIZE(ip[IP_PREDICTED]) == 0) return NULL;
    if (ip[IP_RUNS] != Py_None) {
        Py_ssize_t n = PyList_GET_SIZE(hashes), m = PyLong_AsSsize_t(ip[IP_MIN_BLOCKS]);
        if (m == -1 && PyErr_Occurred()) return NULL;
        if (m < 1) m = 1;
        PyObject *first = PyList_GET_ITEM(hashes, 0);
        int capturable = 0;
        if (n >= m) {
            capturable = PyDict_Contains(ip[IP_SHARED], first);
            if (capturable > 0) capturable = PyDict_Contains(ip[IP_SHARED], PyList_GET_ITEM(hashes, m - 1));
            if (capturable < 0) return NULL;
        }
        if (capturable) return NULL;
        int started = PyDict_Contains(ip[IP_RUNS], first);
        if (started != 0) return NULL;  /* a run may start here (or an error, set) */
    }
    PyObject *args[6] = {hashes, ip[IP_SHARED], ip[IP_HOLDERS], ip[IP_NAMES], ip[IP_PREDICTED], D17_ALL};
    return walk_both(NULL, args, 6);
}

/* ctx.hashes(size), a new reference: RoutingContext.hashes' kept list (``_hashes.get(size)``, the prompt cache's,
 * or an earlier call's) where ``ctx`` is a RoutingContext itself (``ctx_type``) and has it, else the method */
static PyObject *d17_hashes(PyObject *ctx, PyObject *size, PyObject *ctx_type) {
    if ((PyObject *)Py_TYPE(ctx) == ctx_type) {
        PyObject *kept = PyObject_GetAttr(ctx, STR_D17_KEPT);
        if (kept == NULL) return NULL;
        PyObject *got = PyDict_CheckExact(kept) ? PyDict_GetItemWithError(kept, size) : NULL;
        Py_XINCREF(got);
        Py_DECREF(kept);
        if (got != NULL || PyErr_Occurred()) return got;
    }
    return PyObject_CallMethodOneArg(ctx, STR_D_HASHES, size);
}

static int add_decide17(void) {
    D17_ALL = PyLong_FromLong(-1);
    STR_D17_KEPT = PyUnicode_InternFromString("_hashes");
    return D17_ALL == NULL || STR_D17_KEPT == NULL ? -1 : 0;
}
