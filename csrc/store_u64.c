/* ==== A stored event's blocks into the index from their u64 hashes (apply_payload's store, helper intake20) ====
 *
 * Included by index.c, before index_payload.c (its apply_stored calls this). store_loop (index.c) takes the engine
 * and router hashes as lists of ints: a payload's stored event built two lists of ~10 new ints for it, and each block
 * then paid map_key on both, a lookup in the worker's predictions (tab_get) and a second one to delete the entry
 * (tab_del). Live, a decision's catch-up applies its ~2.5 batches cold (the loop wakes to each request after the
 * engines and the client ran): ~1.2 µs a block, two thirds of it the dropped guess (helper intake20's figures).
 *
 * This is store_loop from 0 for the common tables (the worker's blocks a U64Map(False), the holders a U64Map(True),
 * the predictions a U64Map(True) or empty, no block in other tiers), block by block in the same order with the same
 * effects, on the u64s themselves: an int is made for a router hash only where a dict or set needs one (a shared
 * block's mask, a worker's extra reference, a dropped guess's mask, a lower tier's entry, the touched list), and
 * every table slot a block will read is prefetched before the loop, so that the blocks' cache misses overlap
 * instead of coming one after another. */

/* The cache line of ``key``'s home slot in ``m`` when it holds anything (a write is coming: prefetch for it). */
static inline void su_prefetch(const U64Map *m, uint64_t key) {
#if defined(__GNUC__) || defined(__clang__)
    if (m->used) __builtin_prefetch(&m->slots[map_home(m, key)], 1);
#else
    (void)m;
    (void)key;
#endif
}

/* Whether store_u64 takes these tables (else the caller builds the lists and runs store_loop). */
static inline int su_takes(const Tables *t) {
    return IS_MAP(t->blocks) && !((U64Map *)t->blocks)->objvals && IS_MAP(t->holders) &&
           ((U64Map *)t->holders)->objvals && PyDict_GET_SIZE(t->media) == 0 &&
           (IS_MAP(t->predicted) ? ((U64Map *)t->predicted)->objvals : tab_size(t->predicted) == 0);
}

/* drop_guess for a router hash the worker's predictions (a U64Map(True) with entries) may hold: 0, or -1 on
 * error. ``*obj``: the hash's int, made here if needed (the caller's reference). */
static int su_drop_guess(Tables *t, uint64_t local, PyObject **obj) {
    U64Map *pm = (U64Map *)t->predicted;
    Py_ssize_t i = map_find(pm, local);
    if (i < 0) return 0;
    PyObject *had = (PyObject *)(uintptr_t)pm->slots[i].val;
    map_unlink(pm, i);
    Py_DECREF(had);
    if (*obj == NULL && (*obj = PyLong_FromUnsignedLongLong(local)) == NULL) return -1;
    PyObject *old = PyDict_GetItemWithError(t->guess_masks, *obj);
    if (old == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, *obj);
        return -1;
    }
    PyObject *m = PyNumber_Xor(old, t->bit);
    if (m == NULL) return -1;
    int truth = PyObject_IsTrue(m);
    int r = truth < 0 ? -1 : truth ? PyDict_SetItem(t->guess_masks, *obj, m) : PyDict_DelItem(t->guess_masks, *obj);
    Py_DECREF(m);
    return r;
}

/* store_loop(t, ehs, locals, 0, forget) for ``n`` blocks given as u64s (su_takes(t) true); the router hashes of
 * the blocks are appended to ``touched`` as ints when a mask a remembered walk covers changed (apply_stored's
 * caller's _touch). 0, or -1 on error (the blocks before the failing one stored, as store_loop leaves them). */
static int store_u64(Tables *tp, const uint64_t *ehs, const uint64_t *locals, Py_ssize_t n, PyObject *touched) {
    Tables t = *tp;
    U64Map *blocks = (U64Map *)t.blocks, *holders = (U64Map *)t.holders;
    int guesses = IS_MAP(t.predicted), forget = 0;
    for (Py_ssize_t b = 0; b < n; b++) {
        su_prefetch(blocks, ehs[b]);
        su_prefetch(holders, locals[b]);
        if (guesses) su_prefetch((U64Map *)t.predicted, locals[b]);
    }
    for (Py_ssize_t b = 0; b < n; b++) {
        uint64_t local = locals[b];
        PyObject *obj = NULL; /* local's int, made when a dict or set needs it */
        int added, r = 0;
        Py_ssize_t i = map_slot(blocks, ehs[b], &added);
        if (i < 0) return -1;
        if (!added) continue; /* held already, and only on the device (no other tier: su_takes) */
        blocks->slots[i].val = local;
        Py_ssize_t h = map_slot(holders, local, &added);
        if (h < 0) return -1;
        if (added) { /* held by this worker alone */
            Py_INCREF(t.bit);
            holders->slots[h].val = (uint64_t)(uintptr_t)t.bit;
        } else {
            PyObject *mask = (PyObject *)(uintptr_t)holders->slots[h].val;
            r = has_bit(mask, t.bit, t.slot);
            if (r < 0) return -1;
            if ((obj = PyLong_FromUnsignedLongLong(local)) == NULL) return -1;
            if (r) { /* another engine block of this worker has the same tokens: one more reference */
                PyObject *refs = PyDict_GetItemWithError(t.extra, obj);
                PyObject *one = refs == NULL && PyErr_Occurred() ? NULL : PyLong_FromLong(1);
                PyObject *more = one == NULL ? NULL : refs == NULL ? (Py_INCREF(one), one) : PyNumber_Add(refs, one);
                r = more == NULL ? -1 : PyDict_SetItem(t.extra, obj, more);
                Py_XDECREF(more);
                Py_XDECREF(one);
            } else { /* held by others: shared now */
                PyObject *m = PyNumber_Or(mask, t.bit);
                if (m == NULL) {
                    r = -1;
                } else {
                    holders->slots[h].val = (uint64_t)(uintptr_t)m; /* the map's reference to the old mask, dropped */
                    Py_DECREF(mask);
                    r = PyDict_SetItem(t.shared, obj, m);
                    if (r == 0 && !forget && PySet_GET_SIZE(t.watched)) {
                        r = PySet_Contains(t.watched, obj);
                        if (r > 0) forget = 1, r = 0;
                    }
                }
            }
        }
        if (r == 0 && PyDict_GET_SIZE(t.lower)) {
            if (obj == NULL && (obj = PyLong_FromUnsignedLongLong(local)) == NULL) r = -1;
            else r = discard(t.lower, obj);
        }
        if (r == 0 && guesses && ((U64Map *)t.predicted)->used) r = su_drop_guess(&t, local, &obj);
        Py_XDECREF(obj);
        if (r < 0) return -1;
    }
    for (Py_ssize_t b = 0; forget && b < n; b++) {
        PyObject *o = PyLong_FromUnsignedLongLong(locals[b]);
        int r = o == NULL ? -1 : PyList_Append(touched, o);
        Py_XDECREF(o);
        if (r < 0) return -1;
    }
    return 0;
}
