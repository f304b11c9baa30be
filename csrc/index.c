/* infera.kv._native: the prefix index's per-block loops in C (block hashes, stores, removals, the walk).
 *
 * Each function does exactly what the pure-Python code it stands in for does (infera/kv/hashing.py,
 * infera/kv/index.py, infera/kv/bitmasks.py), on the same dicts, for the common case; where a block
 * needs the rarer side tables' logic it stops and says where, and Python carries on from there.
 * tests/kv/test_native.py checks both paths against each other on random streams.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include "xxhash.h"

#if PY_VERSION_HEX >= 0x030D0000
#define AS_BYTES(v, b, n) _PyLong_AsByteArray((PyLongObject *)(v), (b), (n), 1, 0, 1)
#else
#define AS_BYTES(v, b, n) _PyLong_AsByteArray((PyLongObject *)(v), (b), (n), 1, 0)
#endif

/* d.pop(k, None), a new reference */
#if PY_VERSION_HEX >= 0x030D0000
static PyObject *dict_pop(PyObject *d, PyObject *k) {
    PyObject *r;
    int rc = PyDict_Pop(d, k, &r);
    if (rc < 0) return NULL;
    if (rc == 0) Py_RETURN_NONE;
    return r;
}
#else
#define dict_pop(d, k) _PyDict_Pop((d), (k), Py_None)
#endif

static PyObject *ONE, *ZERO;

/* ---- block hashes ---------------------------------------------------------------------------- */

/* chain_hashes(tokens, first, n_blocks, block_size, parent) -> list[int] | None
 * Hashes of blocks first..n_blocks-1 of ``tokens``, chained from ``parent``: xxh3_64 of each block's
 * tokens as little-endian uint32, seeded with the previous hash. None when a token id is not an int in
 * [0, 2**32) (the caller's pure path then raises what it raises). */
static PyObject *chain_hashes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "chain_hashes takes 5 arguments");
        return NULL;
    }
    Py_ssize_t first = PyLong_AsSsize_t(args[1]);
    Py_ssize_t n_blocks = PyLong_AsSsize_t(args[2]);
    Py_ssize_t bs = PyLong_AsSsize_t(args[3]);
    unsigned long long h = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (bs <= 0 || first < 0) {
        PyErr_SetString(PyExc_ValueError, "block_size must be positive");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "token ids must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    if (n_blocks > len / bs) n_blocks = len / bs;
    if (n_blocks < first) n_blocks = first;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(n_blocks - first);
    uint32_t stack[256];
    uint32_t *buf = bs <= 256 ? stack : PyMem_Malloc(sizeof(uint32_t) * (size_t)bs);
    if (out == NULL || buf == NULL) goto fail;
    for (Py_ssize_t b = first; b < n_blocks; b++) {
        PyObject **tok = items + b * bs;
        for (Py_ssize_t j = 0; j < bs; j++) {
            PyObject *t = tok[j];
            unsigned long v;
            if (!PyLong_Check(t) || (v = PyLong_AsUnsignedLong(t)) > 0xFFFFFFFFUL) {
                PyErr_Clear();
                if (buf != stack) PyMem_Free(buf);
                Py_DECREF(out);
                Py_DECREF(seq);
                Py_RETURN_NONE;
            }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            buf[j] = __builtin_bswap32((uint32_t)v);
#else
            buf[j] = (uint32_t)v;
#endif
        }
        h = XXH3_64bits_withSeed(buf, (size_t)bs * 4, h);
        PyObject *o = PyLong_FromUnsignedLongLong(h);
        if (o == NULL) goto fail;
        PyList_SET_ITEM(out, b - first, o);
    }
    if (buf != stack) PyMem_Free(buf);
    Py_DECREF(seq);
    return out;
fail:
    if (buf != NULL && buf != stack) PyMem_Free(buf);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* ---- block hashes from msgpack ------------------------------------------------------------------- */

/* One msgpack int at *p (< end) into *v if it is in [0, 2**32): 1; anything else (another type, a negative or larger
 * int, bytes cut short): 0. Every int width counts (positive fixint, uint8/16/32/64, int8/16/32/64, negative fixint),
 * as the Python path takes any int in range whatever its encoding. */
static int packed_u32(const unsigned char **p, const unsigned char *end, uint32_t *v) {
    const unsigned char *q = *p;
    if (q >= end) return 0;
    unsigned char c = *q++;
    uint64_t u;
    int neg = 0;
    size_t w;
    if (c <= 0x7f) {
        *v = c;
        *p = q;
        return 1;
    }
    switch (c) {
        case 0xcc: w = 1; break;
        case 0xcd: w = 2; break;
        case 0xce: w = 4; break;
        case 0xcf: w = 8; break;
        case 0xd0: w = 1; neg = 1; break;
        case 0xd1: w = 2; neg = 1; break;
        case 0xd2: w = 4; neg = 1; break;
        case 0xd3: w = 8; neg = 1; break;
        default: return 0;  /* negative fixint, or not an int */
    }
    if ((size_t)(end - q) < w) return 0;
    u = 0;
    for (size_t k = 0; k < w; k++) u = (u << 8) | q[k];
    if (neg && (u >> (8 * w - 1)) & 1) return 0;  /* a signed form holding a negative value */
    if (u > 0xFFFFFFFFULL) return 0;
    *v = (uint32_t)u;
    *p = q + w;
    return 1;
}

/* chain_hashes_packed(raw, n_blocks, block_size, parent) -> list[int] | None
 * chain_hashes(tokens, 0, n_blocks, block_size, parent) for ``raw``, the msgpack encoding of the token-id array
 * (any bytes-like object), read in place: no int object per token. None when ``raw`` is not exactly one msgpack
 * array of ints in [0, 2**32) (the caller decodes it and takes the Python path, which raises what it raises). */
static PyObject *chain_hashes_packed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "chain_hashes_packed takes 4 arguments");
        return NULL;
    }
    Py_ssize_t n_blocks = PyLong_AsSsize_t(args[1]);
    Py_ssize_t bs = PyLong_AsSsize_t(args[2]);
    unsigned long long h = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "block_size must be positive");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = view.buf, *end = p + view.len;
    PyObject *out = NULL;
    uint32_t stack[256];
    uint32_t *buf = stack;
    size_t count;
    if (p >= end) goto none;
    if ((*p & 0xf0) == 0x90) {
        count = *p++ & 0x0f;
    } else if (*p == 0xdc && end - p >= 3) {
        count = ((size_t)p[1] << 8) | p[2];
        p += 3;
    } else if (*p == 0xdd && end - p >= 5) {
        count = ((size_t)p[1] << 24) | ((size_t)p[2] << 16) | ((size_t)p[3] << 8) | p[4];
        p += 5;
    } else {
        goto none;
    }
    if (count > (size_t)(end - p)) goto none;  /* every element takes a byte at least */
    if (n_blocks < 0) n_blocks = 0;
    if ((size_t)n_blocks > count / (size_t)bs) n_blocks = (Py_ssize_t)(count / (size_t)bs);
    if (bs > 256 && (buf = PyMem_Malloc(sizeof(uint32_t) * (size_t)bs)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    uint64_t *hs = PyMem_Malloc(sizeof(uint64_t) * (size_t)(n_blocks ? n_blocks : 1));
    if (hs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t b = 0; b < n_blocks; b++) {
        for (Py_ssize_t j = 0; j < bs; j++) {
            uint32_t v;
            if (!packed_u32(&p, end, &v)) {
                PyMem_Free(hs);
                goto none;
            }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            buf[j] = __builtin_bswap32(v);
#else
            buf[j] = v;
#endif
        }
        hs[b] = h = XXH3_64bits_withSeed(buf, (size_t)bs * 4, h);
    }
    for (size_t k = (size_t)n_blocks * (size_t)bs; k < count; k++) {  /* the rest: checked, not hashed */
        uint32_t v;
        if (!packed_u32(&p, end, &v)) {
            PyMem_Free(hs);
            goto none;
        }
    }
    if (p != end) {  /* bytes after the array */
        PyMem_Free(hs);
        goto none;
    }
    out = PyList_New(n_blocks);
    for (Py_ssize_t b = 0; out != NULL && b < n_blocks; b++) {
        PyObject *o = PyLong_FromUnsignedLongLong(hs[b]);
        if (o == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, b, o);
    }
    PyMem_Free(hs);
    goto done;
none:
    out = Py_None;
    Py_INCREF(out);
done:
    if (buf != stack) PyMem_Free(buf);
    PyBuffer_Release(&view);
    return out;
}

/* ---- shared helpers --------------------------------------------------------------------------- */

/* mask & bit != 0 (both non-negative ints, bit == 1 << slot); -1 on error */
static int has_bit(PyObject *mask, PyObject *bit, Py_ssize_t slot) {
    if (mask == bit) return 1;
#if PY_VERSION_HEX < 0x030C0000
    if (PyLong_CheckExact(mask) && Py_SIZE(mask) >= 0) {  /* read the digit: no int built */
        Py_ssize_t k = slot / PyLong_SHIFT;
        return k < Py_SIZE(mask) && (((PyLongObject *)mask)->ob_digit[k] >> (slot % PyLong_SHIFT)) & 1;
    }
#endif
    (void)slot;
    PyObject *a = PyNumber_And(mask, bit);
    if (a == NULL) return -1;
    int r = PyObject_IsTrue(a);
    Py_DECREF(a);
    return r;
}

/* d.pop(key, None) with the result dropped */
static int discard(PyObject *d, PyObject *key) {
    if (PyDict_GET_SIZE(d) == 0) return 0;
    if (PyDict_DelItem(d, key) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
        PyErr_Clear();
    }
    return 0;
}

/* Predictions.drop(worker, local): forget the worker's prediction of ``local``, if any. */
static int drop_guess(PyObject *predicted, PyObject *guess_masks, PyObject *bit, PyObject *local) {
    if (PyDict_GET_SIZE(predicted) == 0) return 0;
    PyObject *had = PyDict_GetItemWithError(predicted, local);
    if (had == NULL) return PyErr_Occurred() ? -1 : 0;
    if (PyDict_DelItem(predicted, local) < 0) return -1;
    PyObject *old = PyDict_GetItemWithError(guess_masks, local);
    if (old == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, local);
        return -1;
    }
    PyObject *m = PyNumber_Xor(old, bit);
    if (m == NULL) return -1;
    int t = PyObject_IsTrue(m);
    int r = t ? PyDict_SetItem(guess_masks, local, m) : PyDict_DelItem(guess_masks, local);
    Py_DECREF(m);
    return r;
}

/* The per-worker and index tables a store or a removal touches, in the order the functions take them. */
typedef struct {
    PyObject *blocks, *media, *extra, *lower, *predicted, *holders, *shared, *watched, *guess_masks, *bit;
    Py_ssize_t slot;
} Tables;

static int tables(PyObject *const *args, Tables *t) {
    PyObject **f = (PyObject **)t;
    for (int i = 0; i < 9; i++) {
        if (!(i == 7 ? PyAnySet_Check(args[i]) : PyDict_Check(args[i]))) {
            PyErr_SetString(PyExc_TypeError, "expected the index's dicts and watched set");
            return -1;
        }
        f[i] = args[i];
    }
    if (!PyLong_Check(args[9])) {
        PyErr_SetString(PyExc_TypeError, "bit must be an int");
        return -1;
    }
    t->bit = args[9];
    t->slot = (Py_ssize_t)_PyLong_NumBits(args[9]) - 1;
    if (t->slot < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bit must be positive");
        return -1;
    }
    return 0;
}

/* ---- stores ------------------------------------------------------------------------------------ */

/* store_blocks(blocks, media, extra, lower, predicted, holders, shared, watched, guess_masks, bit,
 *              engine_hashes, router_hashes, start) -> (stop, forget)
 * PrefixIndex._store's loop for blocks stored on the device ("GPU"), from ``start``: stops before a block
 * the worker holds already in another tier (stop < len: Python goes on from there). ``forget``: a mask a
 * remembered walk covers changed (the caller forgets its runs). */
static PyObject *store_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Tables t;
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "store_blocks takes 13 arguments");
        return NULL;
    }
    if (tables(args, &t) < 0) return NULL;
    Py_ssize_t i = PyLong_AsSsize_t(args[12]);
    if (i == -1 && PyErr_Occurred()) return NULL;
    PyObject *ehs = PySequence_Fast(args[10], "engine hashes must be a sequence");
    if (ehs == NULL) return NULL;
    PyObject *locals = PySequence_Fast(args[11], "router hashes must be a sequence");
    if (locals == NULL) {
        Py_DECREF(ehs);
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ehs);
    if (PySequence_Fast_GET_SIZE(locals) < n) n = PySequence_Fast_GET_SIZE(locals);
    int forget = 0;
    for (; i < n; i++) {
        PyObject *eh = PySequence_Fast_GET_ITEM(ehs, i), *local = PySequence_Fast_GET_ITEM(locals, i);
        Py_ssize_t size = PyDict_GET_SIZE(t.blocks);
        if (PyDict_SetDefault(t.blocks, eh, local) == NULL) goto done;
        int r;
        if (PyDict_GET_SIZE(t.blocks) == size) {  /* held already: nothing to do if only on the device */
            if (PyDict_GET_SIZE(t.media) == 0) continue;
            r = PyDict_Contains(t.media, eh);
            if (r < 0) goto done;
            if (r) break;  /* tiers to merge: Python's _add_tier */
            continue;
        }
        size = PyDict_GET_SIZE(t.holders);
        PyObject *mask = PyDict_SetDefault(t.holders, local, t.bit);  /* held by this worker alone if new */
        if (mask == NULL) goto done;
        if (PyDict_GET_SIZE(t.holders) != size) mask = NULL;
        r = mask == NULL ? 0 : has_bit(mask, t.bit, t.slot);
        if (r < 0) goto done;
        if (r) {  /* another engine block of this worker has the same tokens: one more reference */
            PyObject *refs = PyDict_GetItemWithError(t.extra, local);
            if (refs == NULL && PyErr_Occurred()) goto done;
            PyObject *one = PyLong_FromLong(1);
            PyObject *more = refs == NULL ? one : PyNumber_Add(refs, one);
            if (more == NULL) goto done;
            r = PyDict_SetItem(t.extra, local, more);
            if (more != one) Py_DECREF(more);
            Py_DECREF(one);
            if (r < 0) goto done;
        } else if (mask != NULL) {  /* held by others: shared now */
            PyObject *m = PyNumber_Or(mask, t.bit);
            if (m == NULL) goto done;
            r = PyDict_SetItem(t.holders, local, m);
            if (r == 0) r = PyDict_SetItem(t.shared, local, m);
            Py_DECREF(m);
            if (r < 0) goto done;
            if (!forget && PySet_GET_SIZE(t.watched)) {
                r = PySet_Contains(t.watched, local);
                if (r < 0) goto done;
                forget = r;
            }
        }
        if (discard(t.lower, local) < 0) goto done;
        if (drop_guess(t.predicted, t.guess_masks, t.bit, local) < 0) goto done;
    }
    out = Py_BuildValue("(nO)", i, forget ? Py_True : Py_False);
done:
    Py_DECREF(ehs);
    Py_DECREF(locals);
    return out;
}

/* ---- removals ---------------------------------------------------------------------------------- */

/* remove_blocks(blocks, media, extra, lower, predicted, holders, shared, watched, guess_masks, bit,
 *               engine_hashes, start) -> (stop, unknown, forget)
 * PrefixIndex._remove for each engine hash from ``start``: stops before a block held in another tier
 * than the device alone, or behind a router hash other engine blocks share while the worker has tiers
 * to track (Python's _remove goes on from there). ``unknown``: hashes the worker did not hold. */
static PyObject *remove_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Tables t;
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "remove_blocks takes 12 arguments");
        return NULL;
    }
    if (tables(args, &t) < 0) return NULL;
    Py_ssize_t i = PyLong_AsSsize_t(args[11]);
    if (i == -1 && PyErr_Occurred()) return NULL;
    PyObject *ehs = PySequence_Fast(args[10], "engine hashes must be a sequence");
    if (ehs == NULL) return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ehs), unknown = 0;
    int forget = 0, r;
    for (; i < n; i++) {
        PyObject *eh = PySequence_Fast_GET_ITEM(ehs, i), *local, *refs;
        if (PyDict_GET_SIZE(t.media) == 0) {  /* on the device only: one lookup takes it out */
            local = dict_pop(t.blocks, eh);
            if (local == NULL) goto done;
            if (local == Py_None) {
                Py_DECREF(local);
                unknown++;
                continue;
            }
            refs = PyDict_GET_SIZE(t.extra) ? PyDict_GetItemWithError(t.extra, local) : NULL;
            if (refs == NULL && PyErr_Occurred()) goto fail;
        } else {
            local = PyDict_GetItemWithError(t.blocks, eh);
            if (local == NULL) {
                if (PyErr_Occurred()) goto done;
                unknown++;
                continue;
            }
            r = PyDict_Contains(t.media, eh);
            if (r < 0) goto done;
            if (r) break;
            refs = PyDict_GET_SIZE(t.extra) ? PyDict_GetItemWithError(t.extra, local) : NULL;
            if (refs == NULL && PyErr_Occurred()) goto done;
            if (refs != NULL) break;  /* _relower scans the worker's blocks' tiers */
            Py_INCREF(local);  /* blocks held the reference */
            if (PyDict_DelItem(t.blocks, eh) < 0) goto fail;
        }
        if (refs != NULL) {  /* still held through another engine block */
            long k = PyLong_AsLong(refs);
            if (k == -1 && PyErr_Occurred()) goto fail;
            if (k == 1) {
                r = PyDict_DelItem(t.extra, local);
            } else {
                PyObject *less = PyLong_FromLong(k - 1);
                if (less == NULL) goto fail;
                r = PyDict_SetItem(t.extra, local, less);
                Py_DECREF(less);
            }
            if (r < 0 || discard(t.lower, local) < 0) goto fail;  /* every copy on the device: not lower */
            Py_DECREF(local);
            continue;
        }
        PyObject *old = PyDict_GetItemWithError(t.holders, local);
        if (old == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, local);
            goto fail;
        }
        PyObject *m = PyNumber_Xor(old, t.bit);
        if (m == NULL) goto fail;
        int any = PyObject_IsTrue(m);
        if (any) {
            r = PyDict_SetItem(t.holders, local, m);
            if (r == 0) {  /* one holder left: no longer shared */
                PyObject *below = PyNumber_Subtract(m, ONE);
                PyObject *both = below == NULL ? NULL : PyNumber_And(m, below);
                int many = both == NULL ? -1 : PyObject_IsTrue(both);
                Py_XDECREF(below);
                Py_XDECREF(both);
                r = many < 0 ? -1 : many ? PyDict_SetItem(t.shared, local, m) : PyDict_DelItem(t.shared, local);
            }
            if (r == 0 && !forget && PySet_GET_SIZE(t.watched)) {
                r = PySet_Contains(t.watched, local);
                if (r > 0) forget = 1;
                if (r > 0) r = 0;
            }
        } else {
            r = PyDict_DelItem(t.holders, local);
        }
        Py_DECREF(m);
        if (r < 0) goto fail;
        if (discard(t.lower, local) < 0) goto fail;
        if (drop_guess(t.predicted, t.guess_masks, t.bit, local) < 0) goto fail;
        Py_DECREF(local);
        continue;
    fail:
        Py_DECREF(local);
        goto done;
    }
    out = Py_BuildValue("(nnO)", i, unknown, forget ? Py_True : Py_False);
done:
    Py_DECREF(ehs);
    return out;
}

/* ---- the walk ---------------------------------------------------------------------------------- */

/* Masks as arrays of CPython's own int digits (PyLong_SHIFT bits each): on 3.11 a mask is read in place. */
typedef struct {
    Py_ssize_t nd;  /* digits per mask: enough for every slot */
    digit *active, *gone, *mixed, *conv, *allowed;
    unsigned char *bytes;  /* conversions through bytes (int subclasses, other CPython versions) */
} Walk;

/* The digits of mask ``m`` (NULL: 0) in ``*out`` (``*nd`` of them, no more than w->nd) */
static int digits_of(PyObject *m, Walk *w, const digit **out, Py_ssize_t *nd) {
    if (m == NULL) {
        *nd = 0;
        return 0;
    }
    if (!PyLong_Check(m)) {
        PyErr_SetString(PyExc_TypeError, "masks must be ints");
        return -1;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyLong_CheckExact(m) && Py_SIZE(m) >= 0 && Py_SIZE(m) <= w->nd) {
        *out = ((PyLongObject *)m)->ob_digit;
        *nd = Py_SIZE(m);
        return 0;
    }
#endif
    size_t nbytes = ((size_t)w->nd * PyLong_SHIFT + 7) / 8;
    if (AS_BYTES(m, w->bytes, nbytes) < 0) return -1;
    for (Py_ssize_t k = 0; k < w->nd; k++) {
        size_t bit = (size_t)k * PyLong_SHIFT;
        uint64_t v = 0;
        for (size_t b = bit / 8, s = 0; b < nbytes && s < PyLong_SHIFT + 8; b++, s += 8) v |= (uint64_t)w->bytes[b] << s;
        w->conv[k] = (digit)((v >> (bit % 8)) & PyLong_MASK);
    }
    *out = w->conv;
    *nd = w->nd;
    return 0;
}

/* The mask of ``h`` (shared first: ``*from_shared`` says whether it was there, else holders), with the
 * allowed guesses ORed in */
static int mask_of(PyObject *h, PyObject *shared, PyObject *holders, PyObject *guessed, Walk *w,
                   const digit **out, Py_ssize_t *nd, int *from_shared) {
    PyObject *m = PyDict_GetItemWithError(shared, h);
    *from_shared = m != NULL;
    if (m == NULL) {
        if (PyErr_Occurred()) return -1;
        m = PyDict_GetItemWithError(holders, h);
        if (m == NULL && PyErr_Occurred()) return -1;
    }
    if (digits_of(m, w, out, nd) < 0) return -1;
    if (guessed != NULL) {
        PyObject *g = PyDict_GetItemWithError(guessed, h);
        if (g == NULL && PyErr_Occurred()) return -1;
        if (g != NULL) {
            for (Py_ssize_t k = 0; k < w->nd; k++) w->mixed[k] = k < *nd ? (*out)[k] : 0;
            const digit *gd;
            Py_ssize_t gn;
            if (digits_of(g, w, &gd, &gn) < 0) return -1;
            for (Py_ssize_t k = 0; k < gn; k++) w->mixed[k] |= gd[k] & w->allowed[k];
            *out = w->mixed;
            *nd = w->nd;
        }
    }
    return 0;
}

/* result[names[slot]] = depth, the depth's int made once per call site (``*d``, released on error) */
static int record_slot(PyObject *result, PyObject *names, Py_ssize_t slot, Py_ssize_t depth, PyObject **d) {
    if (slot >= PyList_GET_SIZE(names)) {
        PyErr_SetString(PyExc_IndexError, "mask bit without a slot");
        Py_CLEAR(*d);
        return -1;
    }
    if (*d == NULL && (*d = PyLong_FromSsize_t(depth)) == NULL) return -1;
    if (PyDict_SetItem(result, PyList_GET_ITEM(names, slot), *d) < 0) {
        Py_CLEAR(*d);
        return -1;
    }
    return 0;
}

/* result[names[slot]] = depth for each bit of ``gone`` */
static int record(PyObject *result, const digit *gone, Py_ssize_t nd, Py_ssize_t depth, PyObject *names) {
    PyObject *d = NULL;
    for (Py_ssize_t k = 0; k < nd; k++) {
        uint32_t g = gone[k];
        while (g) {
            Py_ssize_t slot = k * PyLong_SHIFT + __builtin_ctz(g);
            g &= g - 1;
            if (record_slot(result, names, slot, depth, &d) < 0) return -1;
        }
    }
    Py_XDECREF(d);
    return 0;
}

/* (end, last, active as an int, a copy of result) */
static PyObject *run_tuple(Py_ssize_t end, PyObject *last, Walk *w, PyObject *result) {
    size_t nbytes = ((size_t)w->nd * PyLong_SHIFT + 7) / 8;
    memset(w->bytes, 0, nbytes + 8);
    for (Py_ssize_t k = 0; k < w->nd; k++) {
        size_t bit = (size_t)k * PyLong_SHIFT;
        uint64_t v = (uint64_t)w->active[k] << (bit % 8);
        for (size_t b = bit / 8; v; b++, v >>= 8) w->bytes[b] |= (unsigned char)v;
    }
    PyObject *act = _PyLong_FromByteArray(w->bytes, nbytes, 1, 0);
    PyObject *copy = PyDict_Copy(result);
    PyObject *out = act && copy ? Py_BuildValue("(nOOO)", end, last, act, copy) : NULL;
    Py_XDECREF(act);
    Py_XDECREF(copy);
    return out;
}

/* walk(hashes, shared, holders, names, resume, capture, guessed, allowed) -> (result, run | None)
 * bitmasks.walk, one block at a time: ``resume`` and the returned run are (end, last, active, result)
 * tuples; ``guessed`` a dict or None, ``allowed`` an int (-1: every worker). The run it captures is the
 * prompt's whole leading stretch of shared masks (up to where the walk ends), from ``capture`` blocks on. */
static PyObject *walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "walk takes 8 arguments");
        return NULL;
    }
    PyObject *shared = args[1], *holders = args[2], *names = args[3], *resume = args[4];
    PyObject *guessed = args[6] == Py_None ? NULL : args[6];
    Py_ssize_t capture = PyLong_AsSsize_t(args[5]);
    if (capture == -1 && PyErr_Occurred()) return NULL;
    if (!PyDict_Check(shared) || !PyDict_Check(holders) || !PyList_Check(names) ||
        (guessed != NULL && !PyDict_Check(guessed))) {
        PyErr_SetString(PyExc_TypeError, "walk: expected dicts and a list of names");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **hs = PySequence_Fast_ITEMS(seq);
    Walk w;
    w.nd = (PyList_GET_SIZE(names) + PyLong_SHIFT - 1) / PyLong_SHIFT + 1;
    digit *mem = PyMem_Calloc((size_t)w.nd * 5, sizeof(digit));
    w.bytes = PyMem_Calloc((size_t)w.nd * sizeof(digit) + 16, 1);
    if (mem == NULL || w.bytes == NULL) {
        PyMem_Free(mem);
        PyMem_Free(w.bytes);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    w.active = mem;
    w.gone = mem + w.nd;
    w.mixed = mem + 2 * w.nd;
    w.conv = mem + 3 * w.nd;
    w.allowed = mem + 4 * w.nd;
    PyObject *result = NULL, *run = Py_None, *out = NULL;
    Py_INCREF(Py_None);
    int in_run, from_shared;
    Py_ssize_t base, nd, k;
    const digit *md;
    if (guessed != NULL) {
        int all = PyObject_RichCompareBool(args[7], ZERO, Py_LT);
        if (all < 0) goto done;
        if (all) {
            for (k = 0; k < w.nd; k++) w.allowed[k] = PyLong_MASK;
        } else {
            if (digits_of(args[7], &w, &md, &nd) < 0) goto done;
            for (k = 0; k < nd; k++) w.allowed[k] = md[k];
        }
    }
    if (n == 0) {
        result = PyDict_New();
        goto finish;
    }
    if (resume != Py_None) {
        Py_ssize_t end;
        PyObject *last, *act, *res;
        if (!PyArg_ParseTuple(resume, "nOOO!", &end, &last, &act, &PyDict_Type, &res)) goto done;
        if (digits_of(act, &w, &md, &nd) < 0) goto done;
        for (k = 0; k < nd; k++) w.active[k] = md[k];
        result = PyDict_Copy(res);
        if (result == NULL) goto done;
        base = end;
        int any = 0;
        for (k = 0; k < w.nd; k++) any |= w.active[k] != 0;
        if (!any) goto finish;
        in_run = capture > 0;
        if (capture < base + 1) capture = base + 1;
    } else {
        result = PyDict_New();
        if (result == NULL) goto done;
        if (mask_of(hs[0], shared, holders, guessed, &w, &md, &nd, &from_shared) < 0) goto done;
        in_run = from_shared && capture > 0 && guessed == NULL;
        int any = 0;
        for (k = 0; k < nd; k++) any |= (w.active[k] = md[k]) != 0;
        if (!any) goto finish;
        base = 1;
    }
    Py_ssize_t top = w.nd;  /* digits of active above this one are 0 */
    while (top > 0 && !w.active[top - 1]) top--;
    for (Py_ssize_t i = base; i < n; i++) {
        if (mask_of(hs[i], shared, holders, guessed, &w, &md, &nd, &from_shared) < 0) goto done;
        if (in_run && !from_shared) {  /* the leading stretch of shared masks ends before block i */
            in_run = 0;
            if (i >= capture) {
                Py_DECREF(run);
                if ((run = run_tuple(i, hs[i - 1], &w, result)) == NULL) goto done;
            }
        }
        digit changed = 0;
        for (k = 0; k < top; k++) {
            digit still = w.active[k] & (k < nd ? md[k] : 0);
            changed |= w.gone[k] = w.active[k] ^ still;
        }
        if (!changed) continue;
        if (record(result, w.gone, top, i, names) < 0) goto done;
        for (k = 0; k < top; k++) w.active[k] ^= w.gone[k];
        while (top > 0 && !w.active[top - 1]) top--;
        if (top == 0) {  /* no worker holds block i */
            if (in_run && i + 1 >= capture) {
                Py_DECREF(run);
                if ((run = run_tuple(i + 1, hs[i], &w, result)) == NULL) goto done;
            }
            goto finish;
        }
    }
    if (in_run && n >= capture) {
        Py_DECREF(run);
        if ((run = run_tuple(n, hs[n - 1], &w, result)) == NULL) goto done;
    }
    if (record(result, w.active, top, n, names) < 0) goto done;
finish:
    out = PyTuple_Pack(2, result, run);
done:
    Py_XDECREF(result);
    Py_XDECREF(run);
    PyMem_Free(mem);
    PyMem_Free(w.bytes);
    Py_DECREF(seq);
    return out;
}

/* ---- remembered runs as rows of 64-bit words ------------------------------------------------------ */

/* A remembered prefix keeps its blocks' masks as rows of ``width`` bytes (little-endian, width a multiple of
 * 8) in one buffer, patched in place when one of them changes (infera/kv/index_rows.py): a walk after a
 * change reads them in order instead of looking each mask up in the index's dicts. */

static inline uint64_t load_le64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* result[names[slot]] = depth for each bit of words lo..hi-1 of ``gone`` */
static int record_words(PyObject *result, const uint64_t *gone, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t depth,
                        PyObject *names) {
    PyObject *d = NULL;
    for (Py_ssize_t k = lo; k < hi; k++) {
        uint64_t g = gone[k];
        while (g) {
            Py_ssize_t slot = k * 64 + __builtin_ctzll(g);
            g &= g - 1;
            if (record_slot(result, names, slot, depth, &d) < 0) return -1;
        }
    }
    Py_XDECREF(d);
    return 0;
}

/* The guess of row ``i`` (guessed[hashes[i]] & allowed) in ``g`` (nw words); 0: none, 1: some, -1: error, 2: a
 * guess does not fit in a row */
static int guess_row(PyObject *guessed, PyObject *const *hs, Py_ssize_t i, const uint64_t *allowed, Py_ssize_t nw,
                     unsigned char *tmp, uint64_t *g) {
    PyObject *m = PyDict_GetItemWithError(guessed, hs[i]);
    if (m == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyLong_Check(m)) {
        PyErr_SetString(PyExc_TypeError, "masks must be ints");
        return -1;
    }
    if (AS_BYTES(m, tmp, (size_t)nw * 8) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear();
        return 2;
    }
    for (Py_ssize_t k = 0; k < nw; k++) g[k] = load_le64(tmp + 8 * k) & allowed[k];
    return 1;
}

/* walk_rows(rows, n, width, names, finish[, hashes, guessed, allowed]) -> (active, result) | None
 * The walk over the first ``n`` rows of ``rows`` (a buffer of rows of ``width`` bytes): ``active`` the workers
 * (an int mask) holding all ``n`` blocks, ``result`` the depth of each worker that dropped out before; with
 * ``finish`` also the workers of ``active`` at depth ``n`` (the answer for a prompt of ``n`` blocks). With
 * ``guessed`` (a dict of masks by router hash, ``hashes`` the rows' router hashes), row i also counts for the
 * workers in ``allowed`` (an int; -1: every worker, else no wider than a row) whose bit guessed[hashes[i]] sets;
 * None when such a guess does not fit in a row. */
static PyObject *walk_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 && nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "walk_rows takes 5 or 8 arguments");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[1]), width = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return NULL;
    PyObject *names = args[3];
    int finish = PyObject_IsTrue(args[4]);
    if (finish < 0) return NULL;
    if (!PyList_Check(names)) {
        PyErr_SetString(PyExc_TypeError, "walk_rows: names must be a list");
        return NULL;
    }
    if (width <= 0 || width % 8 || n < 1) {
        PyErr_SetString(PyExc_ValueError, "walk_rows: width must be a positive multiple of 8, n positive");
        return NULL;
    }
    PyObject *guessed = nargs == 8 && args[6] != Py_None ? args[6] : NULL, *seq = NULL;
    if (guessed != NULL && !PyDict_Check(guessed)) {
        PyErr_SetString(PyExc_TypeError, "walk_rows: guessed must be a dict");
        return NULL;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL, *act = NULL, *out = NULL;
    PyObject *const *hs = NULL;
    Py_ssize_t nw = width / 8, k;
    uint64_t *active = PyMem_Calloc((size_t)nw * 4 + 1, sizeof(uint64_t));
    if (active == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    uint64_t *gone = active + nw, *g = active + 2 * nw, *allowed = active + 3 * nw;
    unsigned char *tmp = (unsigned char *)gone;  /* guess_row's bytes: gone is free then */
    if (buf.len / width < n) {
        PyErr_SetString(PyExc_ValueError, "walk_rows: fewer rows than n");
        goto done;
    }
    if (guessed != NULL) {
        if ((seq = PySequence_Fast(args[5], "hashes must be a sequence")) == NULL) goto done;
        if (PySequence_Fast_GET_SIZE(seq) < n) {
            PyErr_SetString(PyExc_ValueError, "walk_rows: fewer hashes than n");
            goto done;
        }
        hs = PySequence_Fast_ITEMS(seq);
        int all = PyObject_RichCompareBool(args[7], ZERO, Py_LT);
        if (all < 0) goto done;
        if (all) {
            for (k = 0; k < nw; k++) allowed[k] = ~(uint64_t)0;
        } else {
            if (AS_BYTES(args[7], tmp, (size_t)width) < 0) goto done;
            for (k = 0; k < nw; k++) allowed[k] = load_le64(tmp + 8 * k);
        }
    }
    if ((result = PyDict_New()) == NULL) goto done;
    const unsigned char *row = buf.buf;
    int r = guessed == NULL ? 0 : guess_row(guessed, hs, 0, allowed, nw, tmp, g);
    if (r < 0) goto done;
    if (r == 2) goto none;
    for (k = 0; k < nw; k++) active[k] = load_le64(row + 8 * k) | (r ? g[k] : 0);
    Py_ssize_t lo = 0, hi = nw;  /* words of active outside lo..hi-1 are 0 */
    while (hi > 0 && !active[hi - 1]) hi--;
    while (lo < hi && !active[lo]) lo++;
    for (Py_ssize_t i = 1; i < n && lo < hi; i++) {
        row += width;
        r = guessed == NULL ? 0 : guess_row(guessed, hs, i, allowed, nw, tmp, g);
        if (r < 0) goto done;
        if (r == 2) goto none;
        uint64_t changed = 0;
        if (r) {
            for (k = lo; k < hi; k++) changed |= gone[k] = active[k] & ~(load_le64(row + 8 * k) | g[k]);
        } else {
            for (k = lo; k < hi; k++) changed |= gone[k] = active[k] & ~load_le64(row + 8 * k);
        }
        if (!changed) continue;
        if (record_words(result, gone, lo, hi, i, names) < 0) goto done;
        for (k = lo; k < hi; k++) active[k] ^= gone[k];
        while (hi > lo && !active[hi - 1]) hi--;
        while (lo < hi && !active[lo]) lo++;
    }
    if (finish && lo < hi && record_words(result, active, lo, hi, n, names) < 0) goto done;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    for (k = 0; k < nw; k++) active[k] = __builtin_bswap64(active[k]);
#endif
    act = _PyLong_FromByteArray((const unsigned char *)active, (size_t)width, 1, 0);
    if (act != NULL) out = PyTuple_Pack(2, act, result);
    goto done;
none:
    out = Py_None;
    Py_INCREF(out);
done:
    Py_XDECREF(act);
    Py_XDECREF(result);
    Py_XDECREF(seq);
    PyMem_Free(active);
    PyBuffer_Release(&buf);
    return out;
}

/* capture_rows(hashes, shared, width, min_rows) -> bytearray | None
 * The masks of the prompt's leading blocks that two or more workers hold (found in ``shared``) as rows of
 * ``width`` bytes, up to the first block no worker holding all before it holds; None when fewer than
 * ``min_rows`` (at least 1) or a mask does not fit in a row. */
static PyObject *capture_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "capture_rows takes 4 arguments");
        return NULL;
    }
    Py_ssize_t width = PyLong_AsSsize_t(args[2]), min_rows = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) return NULL;
    PyObject *shared = args[1];
    if (!PyDict_Check(shared) || width <= 0 || width % 8) {
        PyErr_SetString(PyExc_ValueError, "capture_rows: expected a dict and a positive multiple of 8");
        return NULL;
    }
    if (min_rows < 1) min_rows = 1;
    PyObject *seq = PySequence_Fast(args[0], "hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), nw = width / 8, i, k;
    PyObject **hs = PySequence_Fast_ITEMS(seq);
    PyObject *out = NULL;
    uint64_t *running = NULL;
    for (i = 0; i < n && i < min_rows; i++) {  /* the cheap refusal first: most prompts have no such stretch */
        int r = PyDict_Contains(shared, hs[i]);
        if (r < 0) goto done;
        if (!r) break;
    }
    if (i < min_rows) {
        out = Py_None;
        Py_INCREF(out);
        goto done;
    }
    if ((out = PyByteArray_FromStringAndSize(NULL, 0)) == NULL) goto done;
    if ((running = PyMem_Malloc((size_t)width)) == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (i = 0; i < n; i++) {
        PyObject *m = PyDict_GetItemWithError(shared, hs[i]);
        if (m == NULL) {
            if (PyErr_Occurred()) goto fail;
            break;
        }
        Py_ssize_t at = PyByteArray_GET_SIZE(out);
        if (PyByteArray_Resize(out, at + width) < 0) goto fail;
        unsigned char *dst = (unsigned char *)PyByteArray_AS_STRING(out) + at;
        if (!PyLong_Check(m)) {
            PyErr_SetString(PyExc_TypeError, "masks must be ints");
            goto fail;
        }
        if (AS_BYTES(m, dst, (size_t)width) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) goto fail;
            PyErr_Clear();
            Py_DECREF(out);
            out = Py_None;
            Py_INCREF(out);
            goto done;
        }
        uint64_t any = 0;
        for (k = 0; k < nw; k++) any |= running[k] = (i ? running[k] : ~(uint64_t)0) & load_le64(dst + 8 * k);
        if (!any) {
            i++;
            break;
        }
    }
    if (i < min_rows) {
        Py_DECREF(out);
        out = Py_None;
        Py_INCREF(out);
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    PyMem_Free(running);
    Py_DECREF(seq);
    return out;
}

/* fill_rows(hashes, start, stop, shared, holders, width) -> bytearray | None
 * The masks of hashes[start:stop] (shared first, else holders, else 0) as rows of ``width`` bytes; None when a
 * mask does not fit in a row. */
static PyObject *fill_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "fill_rows takes 6 arguments");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), stop = PyLong_AsSsize_t(args[2]), width = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred()) return NULL;
    PyObject *shared = args[3], *holders = args[4];
    if (!PyDict_Check(shared) || !PyDict_Check(holders)) {
        PyErr_SetString(PyExc_TypeError, "fill_rows: expected dicts");
        return NULL;
    }
    if (width <= 0 || width % 8) {
        PyErr_SetString(PyExc_ValueError, "fill_rows: width must be a positive multiple of 8");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (stop > n) stop = n;
    if (start < 0 || start > stop) start = stop;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, (stop - start) * width);
    if (out == NULL) goto fail;
    unsigned char *dst = (unsigned char *)PyByteArray_AS_STRING(out);
    memset(dst, 0, (size_t)((stop - start) * width));
    for (Py_ssize_t i = start; i < stop; i++, dst += width) {
        PyObject *h = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *m = PyDict_GetItemWithError(shared, h);
        if (m == NULL) {
            if (PyErr_Occurred()) goto fail;
            m = PyDict_GetItemWithError(holders, h);
            if (m == NULL) {
                if (PyErr_Occurred()) goto fail;
                continue;
            }
        }
        if (!PyLong_Check(m)) {
            PyErr_SetString(PyExc_TypeError, "masks must be ints");
            goto fail;
        }
        if (AS_BYTES(m, dst, (size_t)width) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) goto fail;
            PyErr_Clear();  /* a slot beyond the row (or a negative int): the caller does without rows */
            Py_DECREF(out);
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* scan_column(rows, width, slot, start, n) -> int
 * The first row from ``start`` (below ``n``) of ``rows`` (rows of ``width`` bytes) whose bit ``slot`` is clear, else n:
 * how far a worker that holds block ``start - 1`` holds the run on. */
static PyObject *scan_column(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "scan_column takes 5 arguments");
        return NULL;
    }
    Py_ssize_t width = PyLong_AsSsize_t(args[1]), slot = PyLong_AsSsize_t(args[2]);
    Py_ssize_t i = PyLong_AsSsize_t(args[3]), n = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (width <= 0 || slot < 0 || slot >= 8 * width || i < 0) {
        PyErr_SetString(PyExc_ValueError, "scan_column: slot outside the row");
        return NULL;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (n > buf.len / width) n = buf.len / width;
    const unsigned char *p = (const unsigned char *)buf.buf + slot / 8;
    unsigned char b = (unsigned char)(1u << (slot % 8));
    while (i < n && (p[i * width] & b)) i++;
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(i);
}

static PyMethodDef methods[] = {
    {"chain_hashes", (PyCFunction)(void (*)(void))chain_hashes, METH_FASTCALL, NULL},
    {"chain_hashes_packed", (PyCFunction)(void (*)(void))chain_hashes_packed, METH_FASTCALL, NULL},
    {"store_blocks", (PyCFunction)(void (*)(void))store_blocks, METH_FASTCALL, NULL},
    {"remove_blocks", (PyCFunction)(void (*)(void))remove_blocks, METH_FASTCALL, NULL},
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL, NULL},
    {"walk_rows", (PyCFunction)(void (*)(void))walk_rows, METH_FASTCALL, NULL},
    {"fill_rows", (PyCFunction)(void (*)(void))fill_rows, METH_FASTCALL, NULL},
    {"scan_column", (PyCFunction)(void (*)(void))scan_column, METH_FASTCALL, NULL},
    {"capture_rows", (PyCFunction)(void (*)(void))capture_rows, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The prefix index's per-block loops in C (see csrc/index.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    ONE = PyLong_FromLong(1);
    ZERO = PyLong_FromLong(0);
    if (ONE == NULL || ZERO == NULL) return NULL;
    return PyModule_Create(&module);
}
