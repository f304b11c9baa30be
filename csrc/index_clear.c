/* ==== A worker's clear: PrefixIndex._clear in one C call (issue 15, thirteenth round, helper rq15) ================
 *
 * Included by index.c (it uses U64Map and has_bit). An engine's AllBlocksCleared (vLLM publishes one on a cache
 * reset) empties the worker's tables; Python's _clear was a loop over every engine block with an _unshare call per
 * router hash other workers hold too (~1 µs a block: a 32k-token worker's clear stalled the event loop for ms).
 *
 * clear_worker(blocks, holders, shared, watched, predicted, guess_masks, bit) -> touched
 *     blocks: the worker's U64Map(False) (engine hash -> router hash), emptied; holders: the index's U64Map(True)
 *     (router hash -> mask), the worker's bit taken out of each of its router hashes' masks (an entry left with no
 *     holder deleted); shared: the dict of masks two or more workers hold (set, or deleted when one holder is
 *     left); predicted: the worker's U64Map(True) of prediction expiries, emptied, each one's bit taken out of
 *     guess_masks (Predictions.drop). touched: the router hashes in ``watched`` whose mask changed and is still
 *     held (what _unshare handed _touch), in the worker's block order. Python clears media, extra and lower. */

/* m & (m - 1) != 0: two or more bits set in ``m`` (a positive int); read from its digits where CPython's layout is
 * known, else through two int operations. -1 on error. */
static int many_bits(PyObject *m) {
#if PY_VERSION_HEX < 0x030C0000
    if (PyLong_CheckExact(m) && Py_SIZE(m) > 0) {
        int seen = 0;
        for (Py_ssize_t k = 0; k < Py_SIZE(m); k++) {
            digit d = ((PyLongObject *)m)->ob_digit[k];
            if (d == 0) continue;
            if ((d & (d - 1)) || seen) return 1;
            seen = 1;
        }
        return 0;
    }
#endif
    PyObject *below = PyNumber_Subtract(m, ONE);
    PyObject *both = below == NULL ? NULL : PyNumber_And(m, below);
    int many = both == NULL ? -1 : PyObject_IsTrue(both);
    Py_XDECREF(below);
    Py_XDECREF(both);
    return many;
}

#define CLEAR_AHEAD 8  /* blocks whose holders slot is prefetched ahead of the one taken out (a big index's slots are
                        * cold: the loop waited on each miss in turn) */

static PyObject *clear_worker(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "clear_worker takes 7 arguments");
        return NULL;
    }
    PyObject *shared = args[2], *watched = args[3], *guess_masks = args[5], *bit = args[6];
    if (!IS_MAP(args[0]) || ((U64Map *)args[0])->objvals || !IS_MAP(args[1]) || !((U64Map *)args[1])->objvals ||
        !PyDict_Check(shared) || !PyAnySet_Check(watched) || !IS_MAP(args[4]) || !((U64Map *)args[4])->objvals ||
        !PyDict_Check(guess_masks) || !PyLong_Check(bit)) {
        PyErr_SetString(PyExc_TypeError, "expected the worker's and the index's U64Maps, dicts and watched set");
        return NULL;
    }
    U64Map *blocks = (U64Map *)args[0], *holders = (U64Map *)args[1], *predicted = (U64Map *)args[4];
    Py_ssize_t slot = (Py_ssize_t)_PyLong_NumBits(bit) - 1;
    if (slot < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bit must be positive");
        return NULL;
    }
    PyObject *touched = PyList_New(0);
    if (touched == NULL) return NULL;
    int32_t ahead = blocks->head;
    for (int k = 0; k < CLEAR_AHEAD && ahead != SLOT_NONE; k++, ahead = blocks->slots[ahead].next) {
        if (holders->cap) __builtin_prefetch(&holders->slots[map_home(holders, blocks->slots[ahead].val)]);
    }
    for (int32_t j = blocks->head; j != SLOT_NONE; j = blocks->slots[j].next) {
        if (ahead != SLOT_NONE) {
            if (holders->cap) __builtin_prefetch(&holders->slots[map_home(holders, blocks->slots[ahead].val)]);
            ahead = blocks->slots[ahead].next;
        }
        uint64_t local = blocks->slots[j].val;
        Py_ssize_t i = map_find(holders, local);
        if (i < 0) continue;
        PyObject *mask = (PyObject *)(uintptr_t)holders->slots[i].val;
        if (mask == bit) {  /* held by this worker alone (stores leave its own bit object): no int built */
            map_unlink(holders, i);
            Py_DECREF(mask);
            continue;
        }
        int r = has_bit(mask, bit, slot);
        if (r < 0) goto fail;
        if (!r) continue;  /* a router hash two of its engine blocks share: taken out already */
        PyObject *m = PyNumber_Xor(mask, bit);
        if (m == NULL) goto fail;
        int any = PyObject_IsTrue(m);
        if (any <= 0) {
            Py_DECREF(m);
            if (any < 0) goto fail;
            map_unlink(holders, i);
            Py_DECREF(mask);
            continue;
        }
        map_put(holders, i, m, 0);  /* an object value: cannot fail */
        PyObject *lo = PyLong_FromUnsignedLongLong(local);
        int many = lo == NULL ? -1 : many_bits(m);
        r = many < 0 ? -1 : many ? PyDict_SetItem(shared, lo, m) : PyDict_DelItem(shared, lo);
        Py_DECREF(m);
        if (r == 0 && PySet_GET_SIZE(watched)) {
            r = PySet_Contains(watched, lo);
            if (r > 0) r = PyList_Append(touched, lo);
        }
        Py_XDECREF(lo);
        if (r < 0) goto fail;
    }
    map_clear_all(blocks);
    for (int32_t j = predicted->head; j != SLOT_NONE; j = predicted->slots[j].next) {
        PyObject *lo = PyLong_FromUnsignedLongLong(predicted->slots[j].key);
        if (lo == NULL) goto fail;
        PyObject *old = PyDict_GetItemWithError(guess_masks, lo);
        if (old == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, lo);
            Py_DECREF(lo);
            goto fail;
        }
        PyObject *m = PyNumber_Xor(old, bit);
        int t = m == NULL ? -1 : PyObject_IsTrue(m);
        int r = t < 0 ? -1 : t ? PyDict_SetItem(guess_masks, lo, m) : PyDict_DelItem(guess_masks, lo);
        Py_XDECREF(m);
        Py_DECREF(lo);
        if (r < 0) goto fail;
    }
    map_clear_all(predicted);
    return touched;
fail:
    Py_DECREF(touched);
    return NULL;
}

static PyMethodDef clear15_methods[] = {
    {"clear_worker", (PyCFunction)(void (*)(void))clear_worker, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static int add_clear15(PyObject *mod) { return PyModule_AddFunctions(mod, clear15_methods); }
