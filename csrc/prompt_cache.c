/* ==== The prompt cache's per-request bookkeeping (infera/kv/prompt_cache.py) ====================================
 *
 * Included at the end of index.c (one extension module, infera.kv._native). Each function does what the Python
 * method named at it does, on the same tables (``_keys`` and ``_ends`` dicts of (holder, cut index) tuples, the
 * entries' lists of cut tuples), so which path ran leaves the same state; the one difference is the xxh3 state an
 * entry keeps to resume its prefix's key: here the bytes of an ``XXH3_state_t`` (only ever read back here), in the
 * pure path an ``xxhash.xxh3_64``. Only for ChatML-like boundary tokens (``first`` ... ``last`` bytes, no ``last``
 * inside): the regex path stays Python. tests/kv/test_prompt_cache.py runs both paths side by side. */

static PyObject *STR_CUTS, *STR_DATA;

/* The last byte ``c`` in p[0..hi): ``data.rfind(c, 0, hi)``. */
static inline Py_ssize_t rfind_byte(const char *p, Py_ssize_t hi, char c) {
#ifdef __GLIBC__
    const char *r = hi > 0 ? memrchr(p, c, (size_t)hi) : NULL; /* Python.h defines _GNU_SOURCE */
    return r ? r - p : -1;
#else
    while (--hi >= 0)
        if (p[hi] == c) return hi;
    return -1;
#endif
}

/* The first byte ``c`` in p[lo..n): ``data.find(c, lo)``. */
static inline Py_ssize_t find_byte(const char *p, Py_ssize_t lo, Py_ssize_t n, char c) {
    if (lo >= n) return -1;
    const char *r = memchr(p + lo, c, (size_t)(n - lo));
    return r ? r - p : -1;
}

/* The index of p[0..len) in the tuple of bytes ``names``, or -1: ``p in names``. */
static inline Py_ssize_t name_index(PyObject *names, const char *p, Py_ssize_t len) {
    Py_ssize_t m = PyTuple_GET_SIZE(names);
    for (Py_ssize_t k = 0; k < m; k++) {
        PyObject *b = PyTuple_GET_ITEM(names, k);
        if (PyBytes_GET_SIZE(b) == len && memcmp(PyBytes_AS_STRING(b), p, (size_t)len) == 0) return k;
    }
    return -1;
}

static int prompt_args(PyObject *data, PyObject *names, const char *name) {
    if (!PyBytes_Check(data) || !PyTuple_Check(names)) {
        PyErr_Format(PyExc_TypeError, "%s: data must be bytes, names a tuple of bytes", name);
        return -1;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(names); k++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(names, k))) {
            PyErr_Format(PyExc_TypeError, "%s: names must be bytes", name);
            return -1;
        }
    return 0;
}

/* ``entry.cuts[k][0] == end and entry.data.startswith(data[:end])``: 1, 0, or -1 with an exception. */
static int cut_confirms(PyObject *entry, PyObject *k, Py_ssize_t end, const char *data) {
    PyObject *cuts = PyObject_GetAttr(entry, STR_CUTS);
    if (cuts == NULL) return -1;
    PyObject *cut = PyObject_GetItem(cuts, k);
    Py_DECREF(cuts);
    if (cut == NULL) return -1;
    PyObject *off = PySequence_GetItem(cut, 0);
    Py_DECREF(cut);
    if (off == NULL) return -1;
    int eq = PyLong_Check(off) ? 1 : 0;
    Py_ssize_t o = eq ? PyLong_AsSsize_t(off) : -1;
    Py_DECREF(off);
    if (o == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear();
        return 0;
    }
    if (!eq || o != end) return 0;
    PyObject *d = PyObject_GetAttr(entry, STR_DATA);
    if (d == NULL) return -1;
    int same = PyBytes_Check(d) && PyBytes_GET_SIZE(d) >= end && memcmp(PyBytes_AS_STRING(d), data, (size_t)end) == 0;
    Py_DECREF(d);
    return same;
}

/* ``(place[0][0], place[1])`` of a (holder, k) place, new references in *entry and *k; -1 with an exception. */
static int place_of(PyObject *place, PyObject **entry, PyObject **k) {
    PyObject *holder = PySequence_GetItem(place, 0);
    if (holder == NULL) return -1;
    *entry = PySequence_GetItem(holder, 0);
    Py_DECREF(holder);
    if (*entry == NULL) return -1;
    *k = PySequence_GetItem(place, 1);
    if (*k == NULL) {
        Py_DECREF(*entry);
        return -1;
    }
    return 0;
}

/* PromptCache._hit: ``keys.get(xxh3(data[:end]))``'s (entry, k) if its cut is at ``end`` over the same bytes, else
 * None (new references), or NULL with an exception. */
static PyObject *prompt_hit(PyObject *keys, const char *data, Py_ssize_t end) {
    PyObject *key = PyLong_FromUnsignedLongLong(XXH3_64bits(data, (size_t)end));
    if (key == NULL) return NULL;
    PyObject *hit = PyDict_GetItemWithError(keys, key); /* borrowed */
    Py_DECREF(key);
    if (hit == NULL) return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    Py_INCREF(hit);
    PyObject *entry, *k;
    int got = place_of(hit, &entry, &k);
    Py_DECREF(hit);
    if (got < 0) return NULL;
    int same = cut_confirms(entry, k, end, data);
    PyObject *out = same > 0 ? PyTuple_Pack(2, entry, k) : same == 0 ? Py_NewRef(Py_None) : NULL;
    Py_DECREF(entry);
    Py_DECREF(k);
    return out;
}

#define TAIL_PROBES_MAX 64

/* prompt_tail(data, first, last, names, ends, keys, window, probes) -> (entry, k) | None: PromptCache._tail_hit
 * (``first``/``last``: the tokens' delimiting bytes as ints; ``names``: the tokens; ``window``: TAIL_WINDOW;
 * ``probes``: TAIL_PROBES). */
static PyObject *prompt_tail(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !PyDict_Check(args[4]) || !PyDict_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "prompt_tail(data, first, last, names, ends: dict, keys: dict, window, n)");
        return NULL;
    }
    PyObject *data = args[0], *names = args[3], *ends = args[4], *keys = args[5];
    if (prompt_args(data, names, "prompt_tail") < 0) return NULL;
    long first = PyLong_AsLong(args[1]), last = PyLong_AsLong(args[2]);
    Py_ssize_t window = PyLong_AsSsize_t(args[6]), probes = PyLong_AsSsize_t(args[7]);
    if (PyErr_Occurred()) return NULL;
    if (probes < 0 || probes > TAIL_PROBES_MAX || window < 0) {
        PyErr_SetString(PyExc_ValueError, "prompt_tail: probes in 0..64, window >= 0");
        return NULL;
    }
    const char *d = PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data), hi = n, seen[TAIL_PROBES_MAX], n_seen = 0;
    for (Py_ssize_t step = 0; step < 4 * probes && n_seen < probes; step++) {
        Py_ssize_t j = rfind_byte(d, hi, (char)last);
        Py_ssize_t i = j > 0 ? rfind_byte(d, j, (char)first) : -1;
        if (i < 0) break;
        hi = j;
        Py_ssize_t end = j + 1;
        if ((end < n && (unsigned char)d[end] >= 0x80) || name_index(names, d + i, end - i) < 0) continue;
        Py_ssize_t lo = end > window ? end - window : 0;
        XXH64_hash_t tail = XXH3_64bits_withSeed(d + lo, (size_t)(end - lo), (XXH64_hash_t)end);
        PyObject *key = PyLong_FromUnsignedLongLong(tail);
        if (key == NULL) return NULL;
        PyObject *got = PyDict_GetItemWithError(ends, key); /* borrowed */
        Py_DECREF(key);
        if (got == NULL && PyErr_Occurred()) return NULL;
        if (got != NULL) {
            Py_INCREF(got);
            PyObject *holder = PySequence_GetItem(got, 0);
            int live = holder == NULL ? -1 : PyObject_IsTrue(holder);
            Py_XDECREF(holder);
            PyObject *entry = NULL, *k = NULL;
            if (live > 0 && place_of(got, &entry, &k) < 0) live = -1;
            Py_DECREF(got);
            if (live < 0) return NULL;
            if (live) {
                int same = cut_confirms(entry, k, end, d);
                PyObject *out = same > 0 ? PyTuple_Pack(2, entry, k) : NULL;
                Py_DECREF(entry);
                Py_DECREF(k);
                if (same != 0) return out;
                out = prompt_hit(keys, d, end); /* another prompt with those bytes there: the whole prefix's key */
                if (out != Py_None) return out;
                Py_DECREF(out);
            }
        }
        seen[n_seen++] = end;
    }
    for (Py_ssize_t s = 0; s < n_seen; s++) { /* a cut whose short key another prompt's overwrote, then lost */
        PyObject *out = prompt_hit(keys, d, seen[s]);
        if (out != Py_None) return out;
        Py_DECREF(out);
    }
    Py_RETURN_NONE;
}

/* prompt_cuts(data, start, ids, pos, first, last, names, tokens, state, window, snap) -> (cuts, last, state, at_start)
 * | None:
 * PromptCache._matches(data, start) and PromptCache._entry's loop over them. ``ids``: the prompt's ids
 * (array('I')), the first boundary token past ``start`` looked for from ``pos + 1`` on; ``tokens``: the ids of
 * ``names``, in order; ``state``: the xxh3 state after data[:start] (bytes this function returned) or None (hashed
 * here). Returns the new cuts (end, key, ids before it, xxh3 of the ``window`` bytes before it seeded with ``end``),
 * the end of the last boundary token (``start`` if none), the state after data[:last] as bytes, and, when ``snap`` is
 * true and ``state`` None, the state after data[:start] as bytes (else None: the caller keeps it for the next prompt
 * made from the same cut); None when a token's id is not in ``ids`` where expected (the codec did not split there:
 * the prompt is not remembered). */
static PyObject *prompt_cuts(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11 || !PyTuple_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError,
                        "prompt_cuts(data, start, ids, pos, first, last, names, tokens: tuple, state, window, snap)");
        return NULL;
    }
    int snap = PyObject_IsTrue(args[10]);
    if (snap < 0) return NULL;
    PyObject *data = args[0], *names = args[6], *tokens = args[7], *state = args[8];
    if (prompt_args(data, names, "prompt_cuts") < 0) return NULL;
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), pos = PyLong_AsSsize_t(args[3]);
    long first = PyLong_AsLong(args[4]), last_byte = PyLong_AsLong(args[5]);
    Py_ssize_t window = PyLong_AsSsize_t(args[9]);
    if (PyErr_Occurred()) return NULL;
    const char *d = PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data), m = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(tokens) != m || start < 0 || start > n || window < 0 || pos < -1) {
        PyErr_SetString(PyExc_ValueError, "prompt_cuts: one id a name, 0 <= start <= len(data), pos >= -1");
        return NULL;
    }
    XXH3_state_t st;
    PyObject *at_start = NULL;
    if (state == Py_None) {
        XXH3_64bits_reset(&st);
        XXH3_64bits_update(&st, d, (size_t)start);
        if (snap && (at_start = PyBytes_FromStringAndSize((const char *)&st, sizeof st)) == NULL) return NULL;
    } else if (PyBytes_Check(state) && PyBytes_GET_SIZE(state) == (Py_ssize_t)sizeof st) {
        memcpy(&st, PyBytes_AS_STRING(state), sizeof st);
    } else {
        PyErr_SetString(PyExc_TypeError, "prompt_cuts: state must be None or a state this function returned");
        return NULL;
    }
    Py_buffer view;
    if (u32_view(args[2], &view) < 0) {
        Py_XDECREF(at_start);
        return NULL;
    }
    const uint32_t *ids = (const uint32_t *)view.buf;
    Py_ssize_t n_ids = view.len / 4;
    PyObject *cuts = PyList_New(0);
    if (cuts == NULL) goto fail;
    Py_ssize_t last = start;
    Py_ssize_t i = find_byte(d, start, n, (char)first);
    while (i >= 0) {
        Py_ssize_t j = find_byte(d, i + 1, n, (char)last_byte);
        if (j < 0) break;
        Py_ssize_t k = name_index(names, d + i, j + 1 - i);
        if (k < 0) {
            i = find_byte(d, i + 1, n, (char)first);
            continue;
        }
        unsigned long long tid = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(tokens, k));
        if (tid == (unsigned long long)-1 && PyErr_Occurred()) goto fail;
        Py_ssize_t end = j + 1, q = pos + 1;
        while (q < n_ids && ids[q] != tid) q++;
        if (q >= n_ids) { /* the codec did not split where expected */
            Py_DECREF(cuts);
            Py_XDECREF(at_start);
            PyBuffer_Release(&view);
            Py_RETURN_NONE;
        }
        pos = q;
        XXH3_64bits_update(&st, d + last, (size_t)(end - last));
        last = end;
        if (end == n || (unsigned char)d[end] < 0x80) {
            Py_ssize_t lo = end > window ? end - window : 0;
            PyObject *cut = PyTuple_New(4); /* (end, key, ids before it, tail key): no format string parsed per cut */
            if (cut != NULL) {
                PyTuple_SET_ITEM(cut, 0, PyLong_FromSsize_t(end));
                PyTuple_SET_ITEM(cut, 1, PyLong_FromUnsignedLongLong(XXH3_64bits_digest(&st)));
                PyTuple_SET_ITEM(cut, 2, PyLong_FromSsize_t(pos + 1));
                PyTuple_SET_ITEM(cut, 3, PyLong_FromUnsignedLongLong(
                                             XXH3_64bits_withSeed(d + lo, (size_t)(end - lo), (XXH64_hash_t)end)));
                for (int f = 0; f < 4; f++)
                    if (PyTuple_GET_ITEM(cut, f) == NULL) {
                        Py_CLEAR(cut); /* a tuple with NULL items deallocates */
                        break;
                    }
            }
            if (cut == NULL || PyList_Append(cuts, cut) < 0) {
                Py_XDECREF(cut);
                goto fail;
            }
            Py_DECREF(cut);
        }
        i = find_byte(d, end, n, (char)first);
    }
    PyBuffer_Release(&view);
    PyObject *saved = PyBytes_FromStringAndSize((const char *)&st, sizeof st);
    if (saved == NULL) {
        Py_DECREF(cuts);
        Py_XDECREF(at_start);
        return NULL;
    }
    return Py_BuildValue("(NnNN)", cuts, last, saved, at_start != NULL ? at_start : Py_NewRef(Py_None));
fail:
    Py_XDECREF(cuts);
    Py_XDECREF(at_start);
    PyBuffer_Release(&view);
    return NULL;
}

/* prompt_store(keys, ends, holder, cuts, first) -> None: PromptCache._store's registration: for each cut from
 * index ``first`` on, ``keys[cut[1]] = ends[cut[3]] = (holder, index)``. */
static PyObject *prompt_store(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyDict_Check(args[0]) || !PyDict_Check(args[1]) || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "prompt_store(keys: dict, ends: dict, holder, cuts: list, first)");
        return NULL;
    }
    PyObject *keys = args[0], *ends = args[1], *holder = args[2], *cuts = args[3];
    Py_ssize_t first = PyLong_AsSsize_t(args[4]);
    if (first == -1 && PyErr_Occurred()) return NULL;
    for (Py_ssize_t c = first < 0 ? 0 : first; c < PyList_GET_SIZE(cuts); c++) {
        PyObject *cut = PyList_GET_ITEM(cuts, c);
        if (!PyTuple_Check(cut) || PyTuple_GET_SIZE(cut) != 4) {
            PyErr_SetString(PyExc_TypeError, "prompt_store: a cut is a 4-tuple");
            return NULL;
        }
        PyObject *place = Py_BuildValue("(On)", holder, c);
        if (place == NULL) return NULL;
        int bad = PyDict_SetItem(keys, PyTuple_GET_ITEM(cut, 1), place) < 0 ||
                  PyDict_SetItem(ends, PyTuple_GET_ITEM(cut, 3), place) < 0;
        Py_DECREF(place);
        if (bad) return NULL;
    }
    Py_RETURN_NONE;
}

/* Delete ``d[key]`` when its value's holder (item 0) is ``holder``: 0, or -1 with an exception. */
static int drop_if_held(PyObject *d, PyObject *key, PyObject *holder) {
    PyObject *got = PyDict_GetItemWithError(d, key); /* borrowed */
    if (got == NULL) return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(got);
    PyObject *h = PySequence_GetItem(got, 0);
    Py_DECREF(got);
    if (h == NULL) return -1;
    int mine = h == holder;
    Py_DECREF(h);
    return mine ? PyDict_DelItem(d, key) : 0;
}

/* prompt_evict(keys, ends, holder, cuts, first) -> None: PromptCache._store's eviction of one entry: each cut's key
 * and tail key from index ``first`` on (those its holder keyed) deleted where they still lead to ``holder``. */
static PyObject *prompt_evict(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyDict_Check(args[0]) || !PyDict_Check(args[1]) || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "prompt_evict(keys: dict, ends: dict, holder, cuts: list, first)");
        return NULL;
    }
    PyObject *keys = args[0], *ends = args[1], *holder = args[2], *cuts = args[3];
    Py_ssize_t first = PyLong_AsSsize_t(args[4]);
    if (first == -1 && PyErr_Occurred()) return NULL;
    for (Py_ssize_t c = first < 0 ? 0 : first; c < PyList_GET_SIZE(cuts); c++) {
        PyObject *cut = PyList_GET_ITEM(cuts, c);
        if (!PyTuple_Check(cut) || PyTuple_GET_SIZE(cut) != 4) {
            PyErr_SetString(PyExc_TypeError, "prompt_evict: a cut is a 4-tuple");
            return NULL;
        }
        Py_INCREF(cut);
        int bad = drop_if_held(keys, PyTuple_GET_ITEM(cut, 1), holder) < 0 ||
                  drop_if_held(ends, PyTuple_GET_ITEM(cut, 3), holder) < 0;
        Py_DECREF(cut);
        if (bad) return NULL;
    }
    Py_RETURN_NONE;
}

/* u32_pack(ids: list) -> bytes | None: ``array('I', ids).tobytes()`` for a list of ints in 0..2**32-1, else None (the
 * caller's ``array.extend`` then takes it, and raises as before). */
static PyObject *u32_pack(PyObject *self, PyObject *arg) {
    if (!PyList_Check(arg)) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(arg);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 4);
    if (out == NULL) return NULL;
    uint32_t *p = (uint32_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(arg, i);
        int overflow;
        long long x = PyLong_Check(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : -1;
        if (!PyLong_Check(v) || overflow != 0 || x < 0 || x > 0xFFFFFFFFLL) {
            PyErr_Clear();
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        p[i] = (uint32_t)x;
    }
    return out;
}

/* extend_u32(ids, known, block_size, most) -> list[int]: infera.kv.hashing.extend_hashes: the hashes of every full
 * block of ``ids`` (array('I')), the first min(len(known), most, blocks) taken from the list ``known``, the rest
 * chained from the last of those (or 0), in one list (the Python lines slice, hash and concatenate). */
static PyObject *extend_u32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "extend_u32(ids: array('I'), known: list, block_size, most)");
        return NULL;
    }
    PyObject *known = args[1];
    Py_ssize_t bs = PyLong_AsSsize_t(args[2]), most = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "block_size must be positive");
        return NULL;
    }
    Py_buffer view;
    if (u32_view(args[0], &view) < 0) return NULL;
    Py_ssize_t n_blocks = view.len / 4 / bs, k = PyList_GET_SIZE(known);
    if (k > n_blocks) k = n_blocks;
    if (k > most) k = most < 0 ? 0 : most;
    unsigned long long h = 0;
    if (k > 0) {
        h = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(known, k - 1));
        if (h == (unsigned long long)-1 && PyErr_Occurred()) {
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    PyObject *out = PyList_New(n_blocks);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    for (Py_ssize_t b = 0; b < k; b++) PyList_SET_ITEM(out, b, Py_NewRef(PyList_GET_ITEM(known, b)));
    const uint32_t *ids = (const uint32_t *)view.buf;
    for (Py_ssize_t b = k; b < n_blocks; b++) {
        const uint32_t *block = ids + b * bs;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        uint32_t swapped[64];
        uint32_t *heap = bs > 64 ? PyMem_Malloc(sizeof(uint32_t) * (size_t)bs) : swapped;
        if (heap == NULL) {
            Py_DECREF(out);
            PyBuffer_Release(&view);
            return PyErr_NoMemory();
        }
        for (Py_ssize_t j = 0; j < bs; j++) heap[j] = __builtin_bswap32(block[j]);
        h = XXH3_64bits_withSeed(heap, (size_t)bs * 4, h);
        if (heap != swapped) PyMem_Free(heap);
#else
        h = XXH3_64bits_withSeed(block, (size_t)bs * 4, h);
#endif
        PyObject *o = PyLong_FromUnsignedLongLong(h);
        if (o == NULL) {
            Py_DECREF(out);
            PyBuffer_Release(&view);
            return NULL;
        }
        PyList_SET_ITEM(out, b, o);
    }
    PyBuffer_Release(&view);
    return out;
}

#include "prompt_extend.c"

static PyMethodDef prompt_cache_methods[] = {
    {"extend_u32", (PyCFunction)(void (*)(void))extend_u32, METH_FASTCALL, NULL},
    {"u32_pack", u32_pack, METH_O, NULL},
    {"prompt_tail", (PyCFunction)(void (*)(void))prompt_tail, METH_FASTCALL, NULL},
    {"prompt_cuts", (PyCFunction)(void (*)(void))prompt_cuts, METH_FASTCALL, NULL},
    {"prompt_store", (PyCFunction)(void (*)(void))prompt_store, METH_FASTCALL, NULL},
    {"prompt_evict", (PyCFunction)(void (*)(void))prompt_evict, METH_FASTCALL, NULL},
    {"prompt_extend", (PyCFunction)(void (*)(void))prompt_extend, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static int add_prompt_cache(PyObject *mod) {
    STR_CUTS = PyUnicode_InternFromString("cuts");
    STR_DATA = PyUnicode_InternFromString("data");
    STR_FROMBYTES = PyUnicode_InternFromString("frombytes");
    if (STR_CUTS == NULL || STR_DATA == NULL || STR_FROMBYTES == NULL) return -1;
    return PyModule_AddFunctions(mod, prompt_cache_methods);
}
