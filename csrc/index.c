/* infera.kv._native: the prefix index's per-block loops in C (block hashes, stores, removals, the walk).
 *
 * Each function does exactly what the pure-Python code it stands in for does (infera/kv/hashing.py,
 * infera/kv/index.py, infera/kv/bitmasks.py), on the same tables (dicts, or for the index's two big tables the
 * U64Map below, which the C path's PrefixIndex uses instead of dicts), for the common case; where a block
 * needs the rarer side tables' logic it stops and says where, and Python carries on from there.
 * tests/kv/test_native.py checks both paths against each other on random streams.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
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

/* ---- U64Map: an insertion-ordered hash table keyed by 64-bit ints ------------------------------------ */

/* The index's big tables (a worker's engine hash -> router hash, the index's router hash -> mask of
 * holders) as open addressing over u64 keys: a lookup reads one slot (key and value inline) instead of a
 * dict's index, entry and key int. Linear probing with backward-shift deletion (no tombstones); the slots are also a doubly linked
 * list in insertion order, so that iteration gives the order a dict would (cache_view, the tests' state
 * comparisons). Values are ints stored as u64 (``U64Map(False)``: the engine-hash table, no int object
 * per block) or any object (``U64Map(True)``: the masks). Keys are ints in [0, 2**64); looking up any
 * other key finds nothing, storing one raises (OverflowError or TypeError), as the router's hashes and
 * the decoder's engine hashes never are. The Python side is the part of the dict API the index uses. */

#define SLOT_EMPTY (-3)
#define SLOT_NONE (-1)

typedef struct {
    uint64_t key;
    uint64_t val;  /* the int, or a PyObject * (a strong reference) */
    int32_t prev;  /* SLOT_EMPTY, else the previous slot in insertion order or SLOT_NONE */
    int32_t next;
} MapSlot;

typedef struct {
    PyObject_HEAD
    MapSlot *slots;
    Py_ssize_t cap;   /* a power of two, or 0 */
    Py_ssize_t used;  /* live entries */
    int32_t head, tail;
    int shift;        /* 64 - log2(cap) */
    int objvals;
    uint64_t version; /* bumped on every insertion or removal (iterators check it) */
    /* recency_tail's cursor (helper pick15): slot cur_slot is cur_rank steps from the head while version is
     * cur_version (every change of the order or of the slots' places bumps it; SLOT_NONE: none) */
    uint64_t cur_version;
    Py_ssize_t cur_rank;
    int32_t cur_slot;
} U64Map;

static PyTypeObject U64MapType;

#define IS_MAP(o) Py_IS_TYPE((o), &U64MapType)

/* The u64 of ``k``: 1, or 0 when it is not an int in [0, 2**64) (no exception set). -1 on other errors. */
static inline int map_key(PyObject *k, uint64_t *out) {
#if PY_VERSION_HEX < 0x030C0000
    if (PyLong_CheckExact(k)) {
        Py_ssize_t size = Py_SIZE(k);
        const digit *d = ((PyLongObject *)k)->ob_digit;
        if (size == 0) { *out = 0; return 1; }
        if (size == 1) { *out = d[0]; return 1; }
        if (size == 2) { *out = (uint64_t)d[0] | ((uint64_t)d[1] << PyLong_SHIFT); return 1; }
        if (size == 3 && PyLong_SHIFT == 30 && d[2] < 16) {
            *out = (uint64_t)d[0] | ((uint64_t)d[1] << 30) | ((uint64_t)d[2] << 60);
            return 1;
        }
        if (size < 0 || size > 3) return 0;
    }
#endif
    if (!PyLong_Check(k)) return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(k);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear();
        return 0;
    }
    *out = v;
    return 1;
}

/* map_key, raising for a key that cannot be stored */
static int map_key_strict(PyObject *k, uint64_t *out) {
    int r = map_key(k, out);
    if (r == 0) {
        if (PyLong_Check(k)) PyErr_SetString(PyExc_OverflowError, "U64Map keys are ints in [0, 2**64)");
        else PyErr_Format(PyExc_TypeError, "U64Map keys are ints, not %.100s", Py_TYPE(k)->tp_name);
        return -1;
    }
    return r < 0 ? -1 : 0;
}

static inline Py_ssize_t map_home(const U64Map *m, uint64_t key) {
    return (Py_ssize_t)((key * 0x9E3779B97F4A7C15ull) >> m->shift);
}

/* the cache line of ``key``'s home slot, on its way (a hint: the walks know their keys blocks ahead; helper pick15) */
static inline void map_prefetch(const U64Map *m, uint64_t key) {
#if defined(__GNUC__) || defined(__clang__)
    if (m->cap) __builtin_prefetch(&m->slots[map_home(m, key)]);
#else
    (void)m;
    (void)key;
#endif
}

/* map_prefetch of ``k`` when it is an exact int in [0, 2**64) (no error set either way) */
static inline void map_prefetch_obj(const U64Map *m, PyObject *k) {
    uint64_t key;
    if (PyLong_CheckExact(k) && map_key(k, &key) == 1) map_prefetch(m, key);
}

static inline Py_ssize_t map_find(const U64Map *m, uint64_t key) {
    if (m->cap == 0) return -1;
    Py_ssize_t mask = m->cap - 1, i = map_home(m, key);
    for (;;) {
        const MapSlot *s = &m->slots[i];
        if (s->prev == SLOT_EMPTY) return -1;
        if (s->key == key) return i;
        i = (i + 1) & mask;
    }
}

/* the slot of key ``k``: its index; -1 when absent or ``k`` is no storable key (no error set); -2 on an error */
static inline Py_ssize_t map_lookup(const U64Map *m, PyObject *k) {
    uint64_t key;
    int r = map_key(k, &key);
    if (r <= 0) return r < 0 ? -2 : -1;
    return map_find(m, key);
}

/* a new reference to slot i's value as an object */
static inline PyObject *map_value(const U64Map *m, Py_ssize_t i) {
    if (m->objvals) {
        PyObject *v = (PyObject *)(uintptr_t)m->slots[i].val;
        Py_INCREF(v);
        return v;
    }
    return PyLong_FromUnsignedLongLong(m->slots[i].val);
}

static int map_resize(U64Map *m, Py_ssize_t want) {
    Py_ssize_t cap = 8;
    while (cap * 7 < want * 10) cap <<= 1;  /* load at most 0.7 */
    if (cap > ((Py_ssize_t)1 << 30)) {
        PyErr_NoMemory();
        return -1;
    }
    MapSlot *slots = PyMem_Malloc((size_t)cap * sizeof(MapSlot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < cap; i++) slots[i].prev = SLOT_EMPTY;
    int shift = 64;
    for (Py_ssize_t c = cap; c > 1; c >>= 1) shift--;
    int32_t head = SLOT_NONE, tail = SLOT_NONE;
    for (int32_t j = m->head; j != SLOT_NONE; j = m->slots[j].next) {
        uint64_t key = m->slots[j].key;
        Py_ssize_t i = (Py_ssize_t)((key * 0x9E3779B97F4A7C15ull) >> shift);
        while (slots[i].prev != SLOT_EMPTY) i = (i + 1) & (cap - 1);
        slots[i].key = key;
        slots[i].val = m->slots[j].val;
        slots[i].prev = tail;
        slots[i].next = SLOT_NONE;
        if (tail == SLOT_NONE) head = (int32_t)i;
        else slots[tail].next = (int32_t)i;
        tail = (int32_t)i;
    }
    PyMem_Free(m->slots);
    m->slots = slots;
    m->version++;  /* every entry moved: recency_tail's cursor is stale */
    m->cap = cap;
    m->shift = shift;
    m->head = head;
    m->tail = tail;
    return 0;
}

/* The slot of ``key``, inserted (value unset: *added = 1) if absent; -1 on error. */
static Py_ssize_t map_slot(U64Map *m, uint64_t key, int *added) {
    Py_ssize_t i = map_find(m, key);
    if (i >= 0) {
        *added = 0;
        return i;
    }
    if ((m->used + 1) * 10 > m->cap * 7 && map_resize(m, 2 * (m->used + 1)) < 0) return -1;
    Py_ssize_t mask = m->cap - 1;
    i = map_home(m, key);
    while (m->slots[i].prev != SLOT_EMPTY) i = (i + 1) & mask;
    MapSlot *s = &m->slots[i];
    s->key = key;
    s->val = 0;
    s->prev = m->tail;
    s->next = SLOT_NONE;
    if (m->tail == SLOT_NONE) m->head = (int32_t)i;
    else m->slots[m->tail].next = (int32_t)i;
    m->tail = (int32_t)i;
    m->used++;
    m->version++;
    *added = 1;
    return i;
}

/* Unlink slot i (its value is the caller's) and close the gap (backward-shift deletion: no tombstones),
 * relinking the entries that move */
static void map_unlink(U64Map *m, Py_ssize_t i) {
    MapSlot *s = &m->slots[i];
    if (s->prev == SLOT_NONE) m->head = s->next;
    else m->slots[s->prev].next = s->next;
    if (s->next == SLOT_NONE) m->tail = s->prev;
    else m->slots[s->next].prev = s->prev;
    s->prev = SLOT_EMPTY;
    m->used--;
    m->version++;
    Py_ssize_t mask = m->cap - 1, j = i;
    for (;;) {
        j = (j + 1) & mask;
        MapSlot *t = &m->slots[j];
        if (t->prev == SLOT_EMPTY) return;
        Py_ssize_t home = map_home(m, t->key);
        if (((j - home) & mask) < ((j - i) & mask)) continue;  /* its probe does not pass the gap */
        m->slots[i] = *t;
        if (t->prev == SLOT_NONE) m->head = (int32_t)i;
        else m->slots[t->prev].next = (int32_t)i;
        if (t->next == SLOT_NONE) m->tail = (int32_t)i;
        else m->slots[t->next].prev = (int32_t)i;
        t->prev = SLOT_EMPTY;
        i = j;
    }
}

/* Store ``v`` at slot i (a new slot or an existing one); -1 if ``v`` cannot be stored */
static int map_put(U64Map *m, Py_ssize_t i, PyObject *v, int added) {
    if (m->objvals) {
        Py_INCREF(v);
        PyObject *old = added ? NULL : (PyObject *)(uintptr_t)m->slots[i].val;
        m->slots[i].val = (uint64_t)(uintptr_t)v;
        Py_XDECREF(old);
        return 0;
    }
    uint64_t u;
    int r = map_key(v, &u);
    if (r <= 0) {
        if (r == 0) PyErr_SetString(PyExc_OverflowError, "U64Map(False) values are ints in [0, 2**64)");
        if (added) map_unlink(m, i);
        return -1;
    }
    m->slots[i].val = u;
    return 0;
}

static int map_set(PyObject *self, PyObject *k, PyObject *v) {
    U64Map *m = (U64Map *)self;
    uint64_t key;
    int added;
    if (map_key_strict(k, &key) < 0) return -1;
    Py_ssize_t i = map_slot(m, key, &added);
    if (i < 0) return -1;
    return map_put(m, i, v, added);
}

/* remove ``k``: its value (a new reference), or NULL with no error if absent */
static PyObject *map_take(PyObject *self, PyObject *k) {
    U64Map *m = (U64Map *)self;
    Py_ssize_t i = map_lookup(m, k);
    if (i < 0) return NULL;
    PyObject *v;
    if (m->objvals) {
        v = (PyObject *)(uintptr_t)m->slots[i].val;  /* the map's reference becomes the caller's */
    } else {
        v = PyLong_FromUnsignedLongLong(m->slots[i].val);
        if (v == NULL) return NULL;
    }
    map_unlink(m, i);
    return v;
}

static void map_clear_all(U64Map *m) {
    MapSlot *slots = m->slots;
    int32_t j = m->head;
    int objvals = m->objvals;
    m->slots = NULL;
    m->cap = m->used = 0;
    m->head = m->tail = SLOT_NONE;
    m->version++;
    if (objvals) {
        for (; j != SLOT_NONE; j = slots[j].next) Py_DECREF((PyObject *)(uintptr_t)slots[j].val);
    }
    PyMem_Free(slots);
}

/* ---- the generic table access the C loops use (a dict or a U64Map) ---- */

/* d[k] as a borrowed reference (U64Map(True) or dict), NULL without error if absent */
static inline PyObject *tab_get(PyObject *d, PyObject *k) {
    if (IS_MAP(d)) {
        U64Map *m = (U64Map *)d;
        Py_ssize_t i = map_lookup(m, k);
        return i < 0 ? NULL : (PyObject *)(uintptr_t)m->slots[i].val;
    }
    return PyDict_GetItemWithError(d, k);
}

/* d.get(k) as a new reference (any table), NULL without error if absent */
static inline PyObject *tab_get_new(PyObject *d, PyObject *k) {
    if (IS_MAP(d)) {
        U64Map *m = (U64Map *)d;
        Py_ssize_t i = map_lookup(m, k);
        return i < 0 ? NULL : map_value(m, i);
    }
    PyObject *v = PyDict_GetItemWithError(d, k);
    Py_XINCREF(v);
    return v;
}

static inline Py_ssize_t tab_size(PyObject *d) {
    return IS_MAP(d) ? ((U64Map *)d)->used : PyDict_GET_SIZE(d);
}

static inline int tab_set(PyObject *d, PyObject *k, PyObject *v) {
    return IS_MAP(d) ? map_set(d, k, v) : PyDict_SetItem(d, k, v);
}

/* del d[k]; KeyError if absent */
static inline int tab_del(PyObject *d, PyObject *k) {
    if (IS_MAP(d)) {
        PyObject *v = map_take(d, k);
        if (v == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, k);
            return -1;
        }
        Py_DECREF(v);
        return 0;
    }
    return PyDict_DelItem(d, k);
}

/* d.pop(k, None) as a new reference */
static inline PyObject *tab_pop(PyObject *d, PyObject *k) {
    if (IS_MAP(d)) {
        PyObject *v = map_take(d, k);
        if (v == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
        return v;
    }
    return dict_pop(d, k);
}

/* d.setdefault(k, v) as a borrowed reference for U64Map(True) and dicts; *added: it was absent.
 * For U64Map(False) the result is only good as non-NULL (success). */
static inline PyObject *tab_setdefault(PyObject *d, PyObject *k, PyObject *v, int *added) {
    if (IS_MAP(d)) {
        U64Map *m = (U64Map *)d;
        uint64_t key;
        if (map_key_strict(k, &key) < 0) return NULL;
        Py_ssize_t i = map_slot(m, key, added);
        if (i < 0) return NULL;
        if (*added) {
            if (map_put(m, i, v, 1) < 0) return NULL;
            return v;
        }
        return m->objvals ? (PyObject *)(uintptr_t)m->slots[i].val : Py_None;
    }
    Py_ssize_t size = PyDict_GET_SIZE(d);
    PyObject *r = PyDict_SetDefault(d, k, v);
    *added = PyDict_GET_SIZE(d) != size;
    return r;
}

/* ---- U64Map's Python side ---- */

static PyObject *map_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    int objvals = 1;
    static char *kw[] = {"objects", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|p:U64Map", kw, &objvals)) return NULL;
    U64Map *m = (U64Map *)type->tp_alloc(type, 0);
    if (m == NULL) return NULL;
    m->slots = NULL;
    m->cap = m->used = 0;
    m->head = m->tail = SLOT_NONE;
    m->objvals = objvals;
    m->version = 0;
    m->cur_slot = SLOT_NONE;
    return (PyObject *)m;
}

static int map_traverse(U64Map *m, visitproc visit, void *arg) {
    if (m->objvals) {
        for (int32_t j = m->head; j != SLOT_NONE; j = m->slots[j].next) Py_VISIT((PyObject *)(uintptr_t)m->slots[j].val);
    }
    return 0;
}

static int map_tp_clear(U64Map *m) {
    map_clear_all(m);
    return 0;
}

static void map_dealloc(U64Map *m) {
    PyObject_GC_UnTrack(m);
    map_clear_all(m);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t map_len(PyObject *self) { return ((U64Map *)self)->used; }

static PyObject *map_subscript(PyObject *self, PyObject *k) {
    PyObject *v = tab_get_new(self, k);
    if (v == NULL && !PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, k);
    return v;
}

static int map_ass_subscript(PyObject *self, PyObject *k, PyObject *v) {
    return v == NULL ? tab_del(self, k) : map_set(self, k, v);
}

static int map_contains(PyObject *self, PyObject *k) {
    Py_ssize_t i = map_lookup((U64Map *)self, k);
    return i == -2 ? -1 : i >= 0;
}

static PyObject *map_get(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get takes 1 or 2 arguments");
        return NULL;
    }
    PyObject *v = tab_get_new(self, args[0]);
    if (v == NULL && !PyErr_Occurred()) {
        v = nargs == 2 ? args[1] : Py_None;
        Py_INCREF(v);
    }
    return v;
}

static PyObject *map_pop(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop takes 1 or 2 arguments");
        return NULL;
    }
    PyObject *v = map_take(self, args[0]);
    if (v == NULL && !PyErr_Occurred()) {
        if (nargs == 1) {
            PyErr_SetObject(PyExc_KeyError, args[0]);
            return NULL;
        }
        v = args[1];
        Py_INCREF(v);
    }
    return v;
}

/* 0: keys, 1: values, 2: items, as a list in insertion order */
static PyObject *map_list(U64Map *m, int what) {
    PyObject *out = PyList_New(m->used);
    if (out == NULL) return NULL;
    Py_ssize_t n = 0;
    for (int32_t j = m->head; j != SLOT_NONE; j = m->slots[j].next, n++) {
        PyObject *x;
        if (what == 0) {
            x = PyLong_FromUnsignedLongLong(m->slots[j].key);
        } else if (what == 1) {
            x = map_value(m, j);
        } else {
            PyObject *k = PyLong_FromUnsignedLongLong(m->slots[j].key), *v = k == NULL ? NULL : map_value(m, j);
            x = v == NULL ? NULL : PyTuple_Pack(2, k, v);
            Py_XDECREF(k);
            Py_XDECREF(v);
        }
        if (x == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, n, x);
    }
    return out;
}

static PyObject *map_keys(PyObject *self, PyObject *unused) { return map_list((U64Map *)self, 0); }
static PyObject *map_values(PyObject *self, PyObject *unused) { return map_list((U64Map *)self, 1); }
static PyObject *map_items(PyObject *self, PyObject *unused) { return map_list((U64Map *)self, 2); }

static PyObject *map_clear_py(PyObject *self, PyObject *unused) {
    map_clear_all((U64Map *)self);
    Py_RETURN_NONE;
}

/* update(pairs): each (key, value) of an iterable of pairs, or of a mapping's items() */
static PyObject *map_update(PyObject *self, PyObject *arg) {
    PyObject *src = arg, *owned = NULL;
    if (PyDict_Check(arg) || IS_MAP(arg)) {
        src = owned = PyObject_CallMethod(arg, "items", NULL);
        if (src == NULL) return NULL;
    }
    PyObject *it = PyObject_GetIter(src);
    Py_XDECREF(owned);
    if (it == NULL) return NULL;
    PyObject *pair;
    while ((pair = PyIter_Next(it)) != NULL) {
        PyObject *k, *v;
        int r = -1;
        if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2) {
            k = PyTuple_GET_ITEM(pair, 0);
            v = PyTuple_GET_ITEM(pair, 1);
            r = map_set(self, k, v);
        } else {
            PyErr_SetString(PyExc_TypeError, "U64Map.update takes (key, value) pairs");
        }
        Py_DECREF(pair);
        if (r < 0) {
            Py_DECREF(it);
            return NULL;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyObject *map_iter(PyObject *self) {
    PyObject *keys = map_list((U64Map *)self, 0);
    if (keys == NULL) return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

/* head(n): the first n keys in insertion order (cache_view), without listing them all */
static PyObject *map_head(PyObject *self, PyObject *arg) {
    U64Map *m = (U64Map *)self;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) n = 0;
    if (n > m->used) n = m->used;
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    int32_t j = m->head;
    for (Py_ssize_t i = 0; i < n; i++, j = m->slots[j].next) {
        PyObject *k = PyLong_FromUnsignedLongLong(m->slots[j].key);
        if (k == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, k);
    }
    return out;
}

/* bytes of C memory the table holds (for the memory figures) */
static PyObject *map_sizeof(PyObject *self, PyObject *unused) {
    U64Map *m = (U64Map *)self;
    return PyLong_FromSsize_t((Py_ssize_t)sizeof(U64Map) + m->cap * (Py_ssize_t)sizeof(MapSlot));
}

static PyObject *map_as_dict(PyObject *self, PyObject *unused) {
    U64Map *m = (U64Map *)self;
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    for (int32_t j = m->head; j != SLOT_NONE; j = m->slots[j].next) {
        PyObject *k = PyLong_FromUnsignedLongLong(m->slots[j].key), *v = k == NULL ? NULL : map_value(m, j);
        int r = v == NULL ? -1 : PyDict_SetItem(d, k, v);
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (r < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

/* == and != against a dict or another U64Map: as dicts */
static PyObject *map_richcompare(PyObject *self, PyObject *other, int op) {
    if ((op != Py_EQ && op != Py_NE) || !(PyDict_Check(other) || IS_MAP(other))) Py_RETURN_NOTIMPLEMENTED;
    PyObject *a = map_as_dict(self, NULL);
    if (a == NULL) return NULL;
    PyObject *b = IS_MAP(other) ? map_as_dict(other, NULL) : (Py_INCREF(other), other);
    if (b == NULL) {
        Py_DECREF(a);
        return NULL;
    }
    PyObject *r = PyObject_RichCompare(a, b, op);
    Py_DECREF(a);
    Py_DECREF(b);
    return r;
}

static PyObject *map_repr(PyObject *self) {
    PyObject *d = map_as_dict(self, NULL);
    if (d == NULL) return NULL;
    PyObject *r = PyUnicode_FromFormat("U64Map(%R)", d);
    Py_DECREF(d);
    return r;
}

static PyMethodDef map_methods[] = {
    {"get", (PyCFunction)(void (*)(void))map_get, METH_FASTCALL, NULL},
    {"pop", (PyCFunction)(void (*)(void))map_pop, METH_FASTCALL, NULL},
    {"keys", map_keys, METH_NOARGS, NULL},
    {"values", map_values, METH_NOARGS, NULL},
    {"items", map_items, METH_NOARGS, NULL},
    {"clear", map_clear_py, METH_NOARGS, NULL},
    {"update", map_update, METH_O, NULL},
    {"head", map_head, METH_O, NULL},
    {"table_bytes", map_sizeof, METH_NOARGS, NULL},
    {"as_dict", map_as_dict, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods map_as_mapping = {map_len, map_subscript, map_ass_subscript};
static PySequenceMethods map_as_sequence = {.sq_contains = map_contains};

static PyTypeObject U64MapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "infera.kv._native.U64Map",
    .tp_doc = "An insertion-ordered hash table keyed by ints in [0, 2**64) (see csrc/index.c).",
    .tp_basicsize = sizeof(U64Map),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = map_new,
    .tp_dealloc = (destructor)map_dealloc,
    .tp_traverse = (traverseproc)map_traverse,
    .tp_clear = (inquiry)map_tp_clear,
    .tp_as_mapping = &map_as_mapping,
    .tp_as_sequence = &map_as_sequence,
    .tp_iter = map_iter,
    .tp_methods = map_methods,
    .tp_richcompare = map_richcompare,
    .tp_repr = map_repr,
    .tp_hash = PyObject_HashNotImplemented,
};

static PyObject *ONE, *ZERO;

/* ---- block hashes ---------------------------------------------------------------------------- */

/* chain_hashes(tokens, first, n_blocks, block_size, parent) -> list[int] | None
 * Hashes of blocks first..n_blocks-1 of ``tokens``, chained from ``parent``: xxh3_64 of each block's
 * tokens as little-endian uint32, seeded with the previous hash. None when a token id is not an int in
 * [0, 2**32) (the caller's pure path then raises what it raises). */
/* The arguments after ``tokens`` shared by chain_hashes and chain_hashes_u32: (first, n_blocks, block_size, parent). */
typedef struct {
    Py_ssize_t first, n_blocks, bs;
    unsigned long long h;
} ChainArgs;

static int chain_args(const char *name, PyObject *const *args, Py_ssize_t nargs, ChainArgs *c) {
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "%s takes 5 arguments", name);
        return -1;
    }
    c->first = PyLong_AsSsize_t(args[1]);
    c->n_blocks = PyLong_AsSsize_t(args[2]);
    c->bs = PyLong_AsSsize_t(args[3]);
    c->h = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred()) return -1;
    if (c->bs <= 0 || c->first < 0) {
        PyErr_SetString(PyExc_ValueError, "block_size must be positive");
        return -1;
    }
    return 0;
}

/* The blocks to hash of ``len`` tokens: at most the whole blocks there are, and none before ``first``. */
static void chain_clamp(ChainArgs *c, Py_ssize_t len) {
    if (c->n_blocks > len / c->bs) c->n_blocks = len / c->bs;
    if (c->n_blocks < c->first) c->n_blocks = c->first;
}

static PyObject *chain_hashes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    ChainArgs c;
    if (chain_args("chain_hashes", args, nargs, &c) < 0) return NULL;
    Py_ssize_t first = c.first, bs = c.bs;
    unsigned long long h = c.h;
    PyObject *seq = PySequence_Fast(args[0], "token ids must be a sequence");
    if (seq == NULL) return NULL;
    chain_clamp(&c, PySequence_Fast_GET_SIZE(seq));
    Py_ssize_t n_blocks = c.n_blocks;
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

/* Any msgpack int at *p (< end), every width (positive and negative fixint, uint8/16/32/64, int8/16/32/64): 1 with
 * *u its value's bits (sign-extended for a negative one) and *neg set for a negative value, *p past it; 0: not an
 * int, or cut short (nothing read). */
static inline int msgpack_int(const unsigned char **p, const unsigned char *end, uint64_t *u, int *neg) {
    const unsigned char *q = *p;
    if (q >= end) return 0;
    unsigned char c = *q++;
    size_t w;
    int sig = 0;
    *neg = 0;
    if (c <= 0x7f || c >= 0xe0) {  /* fixints */
        *u = c <= 0x7f ? c : (uint64_t)(int64_t)(int8_t)c;
        *neg = c >= 0xe0;
        *p = q;
        return 1;
    }
    switch (c) {
        case 0xcc: w = 1; break;
        case 0xcd: w = 2; break;
        case 0xce: w = 4; break;
        case 0xcf: w = 8; break;
        case 0xd0: w = 1; sig = 1; break;
        case 0xd1: w = 2; sig = 1; break;
        case 0xd2: w = 4; sig = 1; break;
        case 0xd3: w = 8; sig = 1; break;
        default: return 0;
    }
    if ((size_t)(end - q) < w) return 0;
    uint64_t v = 0;
    for (size_t k = 0; k < w; k++) v = (v << 8) | q[k];
    if (sig && (v >> (8 * w - 1)) & 1) {
        *neg = 1;
        if (w < 8) v |= ~(uint64_t)0 << (8 * w);  /* sign-extend */
    }
    *u = v;
    *p = q + w;
    return 1;
}

/* One msgpack int at *p (< end) into *v if it is in [0, 2**32): 1; anything else (another type, a negative or larger
 * int, bytes cut short): 0. Every int width counts, as the Python path takes any int in range whatever its
 * encoding. */
static inline int packed_u32(const unsigned char **p, const unsigned char *end, uint32_t *v) {
    const unsigned char *q = *p;
    uint64_t u;
    int neg;
    if (!msgpack_int(&q, end, &u, &neg) || neg || u > 0xFFFFFFFFULL) return 0;
    *v = (uint32_t)u;
    *p = q;
    return 1;
}

/* chain_hashes_packed(raw, n_blocks, block_size, parent) -> list[int] | None
 * chain_hashes(tokens, 0, n_blocks, block_size, parent) for ``raw``, the msgpack encoding of the token-id array
 * (any bytes-like object), read in place: no int object per token. None when ``raw`` is not exactly one msgpack
 * array of ints in [0, 2**32) (the caller decodes it and takes the Python path, which raises what it raises). */
static PyObject *packed_chain(PyObject *raw, Py_ssize_t n_blocks, Py_ssize_t bs, unsigned long long h);

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
    return packed_chain(args[0], n_blocks, bs, h);
}

/* chain_hashes_packed's work, its arguments read (bs > 0) */
static PyObject *packed_chain(PyObject *raw, Py_ssize_t n_blocks, Py_ssize_t bs, unsigned long long h) {
    Py_buffer view;
    if (PyObject_GetBuffer(raw, &view, PyBUF_SIMPLE) < 0) return NULL;
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
    if (tab_size(predicted) == 0) return 0;
    PyObject *had = tab_get(predicted, local);  /* a dict, or a U64Map(True) (predict_map_add) */
    if (had == NULL) return PyErr_Occurred() ? -1 : 0;
    if (tab_del(predicted, local) < 0) return -1;
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
        if (!(i == 7 ? PyAnySet_Check(args[i]) : PyDict_Check(args[i]) || ((i == 0 || i == 4 || i == 5) &&
                                                                           IS_MAP(args[i])))) {
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

/* store_blocks' loop over ``ehs`` and ``locals`` (PySequence_Fast results) from ``i``: the stop, or -1 on error;
 * *forget set when a mask a remembered walk covers changed. */
static Py_ssize_t store_loop(Tables *tp, PyObject *ehs, PyObject *locals, Py_ssize_t i, int *forget) {
    Tables t = *tp;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ehs);
    if (PySequence_Fast_GET_SIZE(locals) < n) n = PySequence_Fast_GET_SIZE(locals);
    for (; i < n; i++) {
        PyObject *eh = PySequence_Fast_GET_ITEM(ehs, i), *local = PySequence_Fast_GET_ITEM(locals, i);
        int r, added;
        if (tab_setdefault(t.blocks, eh, local, &added) == NULL) return -1;
        if (!added) {  /* held already: nothing to do if only on the device */
            if (PyDict_GET_SIZE(t.media) == 0) continue;
            r = PyDict_Contains(t.media, eh);
            if (r < 0) return -1;
            if (r) break;  /* tiers to merge: Python's _add_tier */
            continue;
        }
        PyObject *mask = tab_setdefault(t.holders, local, t.bit, &added);  /* held by this worker alone if new */
        if (mask == NULL) return -1;
        if (added) mask = NULL;
        r = mask == NULL ? 0 : has_bit(mask, t.bit, t.slot);
        if (r < 0) return -1;
        if (r) {  /* another engine block of this worker has the same tokens: one more reference */
            PyObject *refs = PyDict_GetItemWithError(t.extra, local);
            if (refs == NULL && PyErr_Occurred()) return -1;
            PyObject *one = PyLong_FromLong(1);
            PyObject *more = refs == NULL ? one : PyNumber_Add(refs, one);
            if (more == NULL) return -1;
            r = PyDict_SetItem(t.extra, local, more);
            if (more != one) Py_DECREF(more);
            Py_DECREF(one);
            if (r < 0) return -1;
        } else if (mask != NULL) {  /* held by others: shared now */
            PyObject *m = PyNumber_Or(mask, t.bit);
            if (m == NULL) return -1;
            r = tab_set(t.holders, local, m);
            if (r == 0) r = PyDict_SetItem(t.shared, local, m);
            Py_DECREF(m);
            if (r < 0) return -1;
            if (!*forget && PySet_GET_SIZE(t.watched)) {
                r = PySet_Contains(t.watched, local);
                if (r < 0) return -1;
                *forget = r;
            }
        }
        if (discard(t.lower, local) < 0) return -1;
        if (drop_guess(t.predicted, t.guess_masks, t.bit, local) < 0) return -1;
    }
    return i;
}

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
    int forget = 0;
    Py_ssize_t stop = store_loop(&t, ehs, locals, i, &forget);
    PyObject *out = stop < 0 ? NULL : Py_BuildValue("(nO)", stop, forget ? Py_True : Py_False);
    Py_DECREF(ehs);
    Py_DECREF(locals);
    return out;
}

/* store_packed(blocks, media, extra, lower, predicted, holders, shared, watched, guess_masks, bit,
 *              engine_hashes, parent_engine_hash, packed, block_size) -> (router_hashes, stop, forget) | None
 * PrefixIndex._store's C path for a decoded event on the device, in one call: the parent's router hash (0 for no
 * parent), chain_hashes_packed, then store_blocks from 0. ``router_hashes`` None: the worker does not hold the
 * parent (nothing changed); fewer than the engine hashes: too few token ids (only those blocks are stored).
 * None: ``packed`` is not one msgpack array of ints in [0, 2**32) (nothing changed; the caller decodes it). */
static PyObject *store_packed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Tables t;
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "store_packed takes 14 arguments");
        return NULL;
    }
    if (tables(args, &t) < 0) return NULL;
    Py_ssize_t bs = PyLong_AsSsize_t(args[13]);
    if (bs == -1 && PyErr_Occurred()) return NULL;
    if (bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "block_size must be positive");
        return NULL;
    }
    unsigned long long h = 0;
    if (args[11] != Py_None) {
        PyObject *found = tab_get_new(t.blocks, args[11]);
        if (found == NULL) {
            if (PyErr_Occurred()) return NULL;
            return Py_BuildValue("(OnO)", Py_None, (Py_ssize_t)0, Py_False);  /* missed the parent's event */
        }
        h = PyLong_AsUnsignedLongLong(found);
        Py_DECREF(found);
        if (h == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    }
    PyObject *ehs = PySequence_Fast(args[10], "engine hashes must be a sequence");
    if (ehs == NULL) return NULL;
    PyObject *locals = packed_chain(args[12], PySequence_Fast_GET_SIZE(ehs), bs, h);
    PyObject *out = NULL;
    if (locals == Py_None) {
        out = locals;
        locals = NULL;
    } else if (locals != NULL) {
        int forget = 0;
        Py_ssize_t stop = store_loop(&t, ehs, locals, 0, &forget);
        if (stop >= 0) out = Py_BuildValue("(OnO)", locals, stop, forget ? Py_True : Py_False);
    }
    Py_DECREF(ehs);
    Py_XDECREF(locals);
    return out;
}

/* ---- removals ---------------------------------------------------------------------------------- */

/* remove_blocks(blocks, media, extra, lower, predicted, holders, shared, watched, guess_masks, bit,
 *               engine_hashes, start) -> (stop, unknown, forget)
 * PrefixIndex._remove for each engine hash from ``start``: stops before a block held in another tier
 * than the device alone, or behind a router hash other engine blocks share while the worker has tiers
 * to track (Python's _remove goes on from there). ``unknown``: hashes the worker did not hold. */
/* The common removal on U64Map tables, without an int object: engine hash ``eh`` of a worker with no blocks in
 * other tiers and no router hash two of its engine blocks share, held by this worker alone (its mask is the
 * worker's own bit object, as stores leave it). 1: done (or unknown: *unknown counted); 0: not that case,
 * nothing changed (the general path goes on); -1: error. */
static int remove_alone(Tables *t, PyObject *eh, Py_ssize_t *unknown) {
    U64Map *blocks = (U64Map *)t->blocks, *holders = (U64Map *)t->holders;
    if (PyDict_GET_SIZE(t->extra)) return 0;
    uint64_t key;
    int r = map_key(eh, &key);
    if (r <= 0) {
        if (r == 0) (*unknown)++;
        return r < 0 ? -1 : 1;
    }
    Py_ssize_t i = map_find(blocks, key);
    if (i < 0) {
        (*unknown)++;
        return 1;
    }
    uint64_t local = blocks->slots[i].val;
    Py_ssize_t j = map_find(holders, local);
    if (j < 0 || (PyObject *)(uintptr_t)holders->slots[j].val != t->bit) return 0;
    if (PyDict_GET_SIZE(t->lower) || tab_size(t->predicted)) {
        PyObject *lo = PyLong_FromUnsignedLongLong(local);
        if (lo == NULL) return -1;
        r = discard(t->lower, lo) < 0 || drop_guess(t->predicted, t->guess_masks, t->bit, lo) < 0 ? -1 : 0;
        Py_DECREF(lo);
        if (r < 0) return -1;
        j = map_find(holders, local);  /* (the dicts' upkeep cannot touch the maps, but be exact) */
        i = map_find(blocks, key);
        if (i < 0 || j < 0) return 0;
    }
    map_unlink(blocks, i);
    PyObject *mask = (PyObject *)(uintptr_t)holders->slots[j].val;
    map_unlink(holders, j);
    Py_DECREF(mask);
    return 1;
}

/* remove_blocks' step for engine hash ``eh``: 1 done (or unknown: *unknown counted), 0 stop before it (a block in
 * other tiers: Python's _remove), -1 error. ``alone``: the tables are U64Maps remove_alone reads. */
static int remove_one(Tables *tp, PyObject *eh, int alone, Py_ssize_t *unknown, int *forget) {
    Tables t = *tp;
    PyObject *local, *refs;
    int r;
    if (PyDict_GET_SIZE(t.media) == 0) {  /* on the device only: one lookup takes it out */
        if (alone) {
            r = remove_alone(&t, eh, unknown);
            if (r) return r;
        }
        local = tab_pop(t.blocks, eh);
        if (local == NULL) return -1;
        if (local == Py_None) {
            Py_DECREF(local);
            (*unknown)++;
            return 1;
        }
        refs = PyDict_GET_SIZE(t.extra) ? PyDict_GetItemWithError(t.extra, local) : NULL;
        if (refs == NULL && PyErr_Occurred()) goto fail;
    } else {
        local = tab_get_new(t.blocks, eh);
        if (local == NULL) {
            if (PyErr_Occurred()) return -1;
            (*unknown)++;
            return 1;
        }
        r = PyDict_Contains(t.media, eh);
        if (r < 0) goto fail;
        if (r) {
            Py_DECREF(local);
            return 0;
        }
        refs = PyDict_GET_SIZE(t.extra) ? PyDict_GetItemWithError(t.extra, local) : NULL;
        if (refs == NULL && PyErr_Occurred()) goto fail;
        if (refs != NULL) {  /* _relower scans the worker's blocks' tiers */
            Py_DECREF(local);
            return 0;
        }
        if (tab_del(t.blocks, eh) < 0) goto fail;
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
        return 1;
    }
    PyObject *old = tab_get(t.holders, local);
    if (old == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, local);
        goto fail;
    }
    PyObject *m = PyNumber_Xor(old, t.bit);
    if (m == NULL) goto fail;
    int any = PyObject_IsTrue(m);
    if (any) {
        r = tab_set(t.holders, local, m);
        if (r == 0) {  /* one holder left: no longer shared */
            PyObject *below = PyNumber_Subtract(m, ONE);
            PyObject *both = below == NULL ? NULL : PyNumber_And(m, below);
            int many = both == NULL ? -1 : PyObject_IsTrue(both);
            Py_XDECREF(below);
            Py_XDECREF(both);
            r = many < 0 ? -1 : many ? PyDict_SetItem(t.shared, local, m) : PyDict_DelItem(t.shared, local);
        }
        if (r == 0 && !*forget && PySet_GET_SIZE(t.watched)) {
            r = PySet_Contains(t.watched, local);
            if (r > 0) *forget = 1;
            if (r > 0) r = 0;
        }
    } else {
        r = tab_del(t.holders, local);
    }
    Py_DECREF(m);
    if (r < 0) goto fail;
    if (discard(t.lower, local) < 0) goto fail;
    if (drop_guess(t.predicted, t.guess_masks, t.bit, local) < 0) goto fail;
    Py_DECREF(local);
    return 1;
fail:
    Py_DECREF(local);
    return -1;
}

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
    int forget = 0;
    int alone = IS_MAP(t.blocks) && !((U64Map *)t.blocks)->objvals && IS_MAP(t.holders) && ((U64Map *)t.holders)->objvals;
    for (; i < n; i++) {
        int r = remove_one(&t, PySequence_Fast_GET_ITEM(ehs, i), alone, &unknown, &forget);
        if (r < 0) goto done;
        if (r == 0) break;
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
        m = tab_get(holders, h);
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
/* A walk's working masks: five (and ``extra`` more, returned) of w->nd digits each, and its conversion buffer.
 * NULL with MemoryError set (nothing left allocated) when memory runs out; free with walk_close. */
static digit *walk_open(Walk *w, PyObject *names, Py_ssize_t extra) {
    w->nd = (PyList_GET_SIZE(names) + PyLong_SHIFT - 1) / PyLong_SHIFT + 1;
    digit *mem = PyMem_Calloc((size_t)w->nd * (size_t)(5 + extra), sizeof(digit));
    w->bytes = PyMem_Calloc((size_t)w->nd * sizeof(digit) + 16, 1);
    if (mem == NULL || w->bytes == NULL) {
        PyMem_Free(mem);
        PyMem_Free(w->bytes);
        PyErr_NoMemory();
        return NULL;
    }
    w->active = mem;
    w->gone = mem + w->nd;
    w->mixed = mem + 2 * w->nd;
    w->conv = mem + 3 * w->nd;
    w->allowed = mem + 4 * w->nd;
    return mem;
}

static void walk_close(Walk *w, digit *mem) {
    PyMem_Free(mem);
    PyMem_Free(w->bytes);
}

/* The workers whose guesses count: every one for a negative ``allowed``, else its bits. */
static int walk_allow(Walk *w, PyObject *allowed) {
    int all = PyObject_RichCompareBool(allowed, ZERO, Py_LT);
    if (all < 0) return -1;
    if (all) {
        for (Py_ssize_t k = 0; k < w->nd; k++) w->allowed[k] = PyLong_MASK;
        return 0;
    }
    const digit *md;
    Py_ssize_t nd;
    if (digits_of(allowed, w, &md, &nd) < 0) return -1;
    for (Py_ssize_t k = 0; k < nd; k++) w->allowed[k] = md[k];
    return 0;
}

/* Block i's mask (md, nd digits) against the workers still holding every block before it: those it lacks
 * leave the walk with depth i (recorded in ``result``). 1 when some worker still holds block i, 0 when none
 * does, -1 on error; *top follows the highest non-zero digit of w->active. */
static int walk_step(Walk *w, const digit *md, Py_ssize_t nd, Py_ssize_t *top, Py_ssize_t i, PyObject *result,
                     PyObject *names) {
    Py_ssize_t k, t = *top;
    digit changed = 0;
    for (k = 0; k < t; k++) {
        digit still = w->active[k] & (k < nd ? md[k] : 0);
        changed |= w->gone[k] = w->active[k] ^ still;
    }
    if (!changed) return 1;
    if (record(result, w->gone, t, i, names) < 0) return -1;
    for (k = 0; k < t; k++) w->active[k] ^= w->gone[k];
    while (t > 0 && !w->active[t - 1]) t--;
    *top = t;
    return t > 0;
}

static PyObject *walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "walk takes 8 arguments");
        return NULL;
    }
    PyObject *shared = args[1], *holders = args[2], *names = args[3], *resume = args[4];
    PyObject *guessed = args[6] == Py_None ? NULL : args[6];
    Py_ssize_t capture = PyLong_AsSsize_t(args[5]);
    if (capture == -1 && PyErr_Occurred()) return NULL;
    if (!PyDict_Check(shared) || !(PyDict_Check(holders) || IS_MAP(holders)) || !PyList_Check(names) ||
        (guessed != NULL && !PyDict_Check(guessed))) {
        PyErr_SetString(PyExc_TypeError, "walk: expected dicts and a list of names");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **hs = PySequence_Fast_ITEMS(seq);
    Walk w;
    digit *mem = walk_open(&w, names, 0);
    if (mem == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    PyObject *result = NULL, *run = Py_None, *out = NULL;
    Py_INCREF(Py_None);
    int in_run, from_shared;
    Py_ssize_t base, nd, k;
    const digit *md;
    if (guessed != NULL && walk_allow(&w, args[7]) < 0) goto done;
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
        int held = walk_step(&w, md, nd, &top, i, result, names);
        if (held < 0) goto done;
        if (held == 0) {  /* no worker holds block i */
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
    walk_close(&w, mem);
    Py_DECREF(seq);
    return out;
}

/* pick7's block, at the end of the file */
static PyObject *walk_both(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
static PyObject *kv_terms(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
static PyObject *kv_terms_model(PyObject *self, PyObject *unused);
static PyObject *kv_modelled(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

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
    if (!PyDict_Check(shared) || !(PyDict_Check(holders) || IS_MAP(holders))) {
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
            m = tab_get(holders, h);
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

/* ---- the router's per-request bookkeeping over a prompt's block hashes ---------------------------------- */

/* predict_add(predicted, masks, bit, hashes, expiry) -> list
 * infera.kv.index_tables.Predictions.add's loop: for each router hash in ``hashes``, a worker that did not predict
 * it yet gains ``bit`` in ``masks`` (hash -> mask of predicting workers); its expiry in ``predicted`` (hash ->
 * expiry) becomes ``expiry`` unless it is already as late. Returns the hashes whose expiry it set, in order. */
static PyObject *predict_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "predict_add takes 5 arguments");
        return NULL;
    }
    PyObject *predicted = args[0], *masks = args[1], *bit = args[2], *expiry = args[4];
    if (!PyDict_CheckExact(predicted) || !PyDict_CheckExact(masks)) {
        PyErr_SetString(PyExc_TypeError, "predict_add: predicted and masks must be dicts");
        return NULL;
    }
    double until = PyFloat_AsDouble(expiry);
    if (until == -1.0 && PyErr_Occurred()) return NULL;
    PyObject *seq = PySequence_Fast(args[3], "predict_add: hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = items[i];
        PyObject *old = PyDict_GetItemWithError(predicted, h);
        if (old == NULL) {
            if (PyErr_Occurred()) goto fail;
            PyObject *mask = PyDict_GetItemWithError(masks, h);
            if (mask == NULL && PyErr_Occurred()) goto fail;
            PyObject *joined = PyNumber_Or(mask != NULL ? mask : ZERO, bit);
            if (joined == NULL) goto fail;
            int rc = PyDict_SetItem(masks, h, joined);
            Py_DECREF(joined);
            if (rc < 0) goto fail;
        } else {
            double was = PyFloat_AsDouble(old);
            if (was == -1.0 && PyErr_Occurred()) goto fail;
            if (was >= until) continue;
        }
        if (PyDict_SetItem(predicted, h, expiry) < 0 || PyList_Append(fresh, h) < 0) goto fail;
    }
    Py_DECREF(seq);
    return fresh;
fail:
    Py_XDECREF(fresh);
    Py_DECREF(seq);
    return NULL;
}

/* refs_add(refs, hashes) / refs_release(refs, hashes) -> None
 * infera.kv.load.LoadTracker's block references: each hash's count in ``refs`` (a dict) goes up by one / down by
 * one, a count that reaches 0 leaving the dict (a hash missing from it on release: KeyError, as in Python). */
static PyObject *refs_step(PyObject *const *args, Py_ssize_t nargs, int up) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "refs_add/refs_release take 2 arguments");
        return NULL;
    }
    PyObject *refs = args[0];
    if (!PyDict_CheckExact(refs)) {
        PyErr_SetString(PyExc_TypeError, "refs must be a dict");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[1], "hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = items[i];
        PyObject *count = PyDict_GetItemWithError(refs, h);
        if (count == NULL) {
            if (PyErr_Occurred()) goto fail;
            if (!up) {
                PyErr_SetObject(PyExc_KeyError, h);
                goto fail;
            }
            if (PyDict_SetItem(refs, h, ONE) < 0) goto fail;
            continue;
        }
        long c = PyLong_AsLong(count);
        if (c == -1 && PyErr_Occurred()) goto fail;
        c += up ? 1 : -1;
        if (c == 0) {
            if (PyDict_DelItem(refs, h) < 0) goto fail;
            continue;
        }
        PyObject *next = PyLong_FromLong(c);
        if (next == NULL) goto fail;
        int rc = PyDict_SetItem(refs, h, next);
        Py_DECREF(next);
        if (rc < 0) goto fail;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyObject *refs_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs) { return refs_step(args, nargs, 1); }
static PyObject *refs_release(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return refs_step(args, nargs, 0);
}

static PyMethodDef methods[] = {
    {"chain_hashes", (PyCFunction)(void (*)(void))chain_hashes, METH_FASTCALL, NULL},
    {"chain_hashes_packed", (PyCFunction)(void (*)(void))chain_hashes_packed, METH_FASTCALL, NULL},
    {"store_blocks", (PyCFunction)(void (*)(void))store_blocks, METH_FASTCALL, NULL},
    {"store_packed", (PyCFunction)(void (*)(void))store_packed, METH_FASTCALL, NULL},
    {"remove_blocks", (PyCFunction)(void (*)(void))remove_blocks, METH_FASTCALL, NULL},
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL, NULL},
    {"walk_both", (PyCFunction)(void (*)(void))walk_both, METH_FASTCALL, NULL},
    {"kv_terms", (PyCFunction)(void (*)(void))kv_terms, METH_FASTCALL, NULL},
    {"kv_terms_model", kv_terms_model, METH_NOARGS, NULL},
    {"kv_modelled", (PyCFunction)(void (*)(void))kv_modelled, METH_FASTCALL, NULL},
    {"walk_rows", (PyCFunction)(void (*)(void))walk_rows, METH_FASTCALL, NULL},
    {"fill_rows", (PyCFunction)(void (*)(void))fill_rows, METH_FASTCALL, NULL},
    {"scan_column", (PyCFunction)(void (*)(void))scan_column, METH_FASTCALL, NULL},
    {"capture_rows", (PyCFunction)(void (*)(void))capture_rows, METH_FASTCALL, NULL},
    {"predict_add", (PyCFunction)(void (*)(void))predict_add, METH_FASTCALL, NULL},
    {"refs_add", (PyCFunction)(void (*)(void))refs_add, METH_FASTCALL, NULL},
    {"refs_release", (PyCFunction)(void (*)(void))refs_release, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The prefix index's per-block loops in C (see csrc/index.c).", -1, methods,
};

static int add_prompt_ids(PyObject *mod); /* the prompt cache's uint32 ids: the block at the end of this file */
static int add_recency(PyObject *mod); /* kv-aware's recency shadow: the block at the end of this file */
static int add_scales(PyObject *mod);  /* kv-aware's speed scale: after it */
static int add_pick11(PyObject *mod); /* the load tracker's block references, kv-aware's pick glue: after it */
static int add_pick14(PyObject *mod); /* kv-aware's whole decision in one call: after it */
static int add_prompt_cache(PyObject *mod); /* the prompt cache's bookkeeping: csrc/prompt_cache.c, included last */
static int add_payload(PyObject *mod); /* a KV-event batch from its payload: csrc/index_payload.c, included last */
static int add_load(PyObject *mod); /* the load tracker's cells and tickets: csrc/load.c, included last */
static int add_clear15(PyObject *mod); /* a worker's clear (PrefixIndex._clear): csrc/index_clear.c, included last */
static int add_drain16(PyObject *mod); /* a ZMQ socket's batches (PrefixIndex.drain_socket): csrc/zmq_drain.c */
static int add_stream17(PyObject *mod); /* a ZMTP stream's batches (PrefixIndex.drain_stream): csrc/zmtp_drain.c */
static int add_ready20(PyObject *mod); /* a catch-up as one bound call (PrefixIndex.ready_sink): csrc/ready_bound.c */
static int add_hold18(PyObject *mod); /* one leg's hold (Legs.hold) in one call: csrc/hold18.c, included last */
static int splice_register(PyObject *mod); /* a streamed chunk to the client (infera.server.splice): csrc/splice.c, last */
static int headers_register(PyObject *mod); /* a request's header fields (infera.server.arrival): csrc/headers.c */
static double recency_tail(U64Map *m, long long blocks, double tau, double now);

PyMODINIT_FUNC PyInit__native(void) {
    ONE = PyLong_FromLong(1);
    ZERO = PyLong_FromLong(0);
    if (ONE == NULL || ZERO == NULL) return NULL;
    if (PyType_Ready(&U64MapType) < 0) return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) return NULL;
    Py_INCREF(&U64MapType);
    if (PyModule_AddObject(mod, "U64Map", (PyObject *)&U64MapType) < 0) {
        Py_DECREF(&U64MapType);
        Py_DECREF(mod);
        return NULL;
    }
    if (add_prompt_ids(mod) < 0 || add_recency(mod) < 0 || add_scales(mod) < 0 || add_pick11(mod) < 0 ||
        add_pick14(mod) < 0 || add_prompt_cache(mod) < 0 || add_payload(mod) < 0 || add_load(mod) < 0 ||
        add_clear15(mod) < 0 || add_drain16(mod) < 0 || add_stream17(mod) < 0 || add_ready20(mod) < 0 || add_hold18(mod) < 0 || splice_register(mod) < 0 ||
        headers_register(mod) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}

/* ==== The prompt cache's token ids as uint32 (infera/kv/prompt_cache.py, infera/kv/hashing.py) ====================
 *
 * The prompt cache keeps each prompt's ids in an array('I') (4 bytes an id, no object per id, nothing for the cyclic
 * GC to visit, freed in one piece) and hands each caller its own list. These three stand in for the Python lines
 * noted at each; the pure path (INFERA_PURE_PYTHON, or no compiler) runs those lines with the same results
 * (tests/kv/test_prompt_cache.py runs both). */

/* A uint32 buffer's items: 0 with *view filled (release it), -1 with an exception for anything else. */
static int u32_view(PyObject *obj, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->itemsize != 4 || view->format == NULL || (strcmp(view->format, "I") != 0 && strcmp(view->format, "=I")
                                                        != 0 && strcmp(view->format, "<I") != 0)) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_TypeError, "token ids must be a buffer of uint32 (array('I'))");
        return -1;
    }
    return 0;
}

/* u32_fill(out, ids, table) -> None: ``out += ids.tolist()`` for an empty list ``out`` (any list subclass), each
 * id < len(table) as the int object table[id] (a tuple of ints: no int allocated, none freed with the list), any
 * other as a new int. */
static PyObject *u32_fill(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[0]) || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "u32_fill(out: list, ids: array('I'), table: tuple)");
        return NULL;
    }
    PyListObject *out = (PyListObject *)args[0];
    if (Py_SIZE(out) != 0) {
        PyErr_SetString(PyExc_ValueError, "u32_fill fills an empty list");
        return NULL;
    }
    Py_buffer view;
    if (u32_view(args[1], &view) < 0) return NULL;
    Py_ssize_t n = view.len / 4;
    const uint32_t *ids = (const uint32_t *)view.buf;
    PyObject *table = args[2];
    Py_ssize_t known = PyTuple_GET_SIZE(table);
    PyObject **items = n ? PyMem_New(PyObject *, (size_t)n) : NULL;
    if (n && items == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t v = ids[i];
        PyObject *o;
        if ((Py_ssize_t)v < known) {
            o = PyTuple_GET_ITEM(table, v);
            Py_INCREF(o);
        } else if ((o = PyLong_FromUnsignedLong(v)) == NULL) {
            while (i--) Py_DECREF(items[i]);
            PyMem_Free(items);
            PyBuffer_Release(&view);
            return NULL;
        }
        items[i] = o;
    }
    PyBuffer_Release(&view);
    PyMem_Free(out->ob_item);  /* an empty list's, NULL or spare room */
    out->ob_item = items;
    out->allocated = n;
    Py_SET_SIZE(out, n);
    Py_RETURN_NONE;
}

/* u32_equal(seq, ids, table) -> bool | None: ``list(seq) == ids.tolist()`` for a list ``seq``: same length, and each
 * item an int equal to the id at its place (an int subclass or a bool compares by value, as list equality does);
 * None when an item is not an int (a float 1.0 equals 1 in a list compare: the caller's Python says). An item that is
 * table[id] itself (u32_fill put it there) is equal without reading it: the pointers alone, as the list compare this
 * replaces did (reading every int object made it ~3x slower at 16k tokens). */
static PyObject *u32_equal(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[0]) || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "u32_equal(seq: list, ids: array('I'), table: tuple)");
        return NULL;
    }
    Py_buffer view;
    if (u32_view(args[1], &view) < 0) return NULL;
    Py_ssize_t n = view.len / 4;
    const uint32_t *ids = (const uint32_t *)view.buf;
    PyObject *table = args[2];
    Py_ssize_t known = PyTuple_GET_SIZE(table);
    PyObject **items = ((PyListObject *)args[0])->ob_item;
    int same = PyList_GET_SIZE(args[0]) == n;
    for (Py_ssize_t i = 0; same && i < n; i++) {
        PyObject *t = items[i];
        uint32_t v = ids[i];
        if ((Py_ssize_t)v < known && t == PyTuple_GET_ITEM(table, v)) continue;
        if (!PyLong_Check(t)) {
            PyBuffer_Release(&view);
            Py_RETURN_NONE;
        }
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(t, &overflow);
        same = overflow == 0 && x == (long long)v;
    }
    PyBuffer_Release(&view);
    if (PyErr_Occurred()) return NULL;
    return PyBool_FromLong(same);
}

/* chain_hashes_u32(ids, first, n_blocks, block_size, parent) -> list[int]: chain_hashes over a uint32 buffer, read in
 * place (the Python path: block_hashes of ids.tolist()). */
static PyObject *chain_hashes_u32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    ChainArgs c;
    if (chain_args("chain_hashes_u32", args, nargs, &c) < 0) return NULL;
    Py_ssize_t first = c.first, bs = c.bs;
    unsigned long long h = c.h;
    Py_buffer view;
    if (u32_view(args[0], &view) < 0) return NULL;
    chain_clamp(&c, view.len / 4);
    Py_ssize_t n_blocks = c.n_blocks;
    const uint32_t *ids = (const uint32_t *)view.buf;
    PyObject *out = PyList_New(n_blocks - first);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    uint32_t *swapped = PyMem_Malloc(sizeof(uint32_t) * (size_t)bs);
    if (swapped == NULL) {
        Py_DECREF(out);
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
#endif
    for (Py_ssize_t b = first; b < n_blocks; b++) {
        const uint32_t *block = ids + b * bs;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        for (Py_ssize_t j = 0; j < bs; j++) swapped[j] = __builtin_bswap32(block[j]);
        block = swapped;
#endif
        h = XXH3_64bits_withSeed(block, (size_t)bs * 4, h);
        PyObject *o = PyLong_FromUnsignedLongLong(h);
        if (o == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, b - first, o);
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    PyMem_Free(swapped);
#endif
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef prompt_ids_methods[] = {
    {"u32_fill", (PyCFunction)(void (*)(void))u32_fill, METH_FASTCALL, NULL},
    {"u32_equal", (PyCFunction)(void (*)(void))u32_equal, METH_FASTCALL, NULL},
    {"chain_hashes_u32", (PyCFunction)(void (*)(void))chain_hashes_u32, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static int add_prompt_ids(PyObject *mod) { return PyModule_AddFunctions(mod, prompt_ids_methods); }

/* ---- the kv-aware pick's one walk (helper pick7) --------------------------------------------------- */

/* walk_both(hashes, shared, holders, names, guessed, allowed) -> (result, confirmed)
 * walk(hashes, shared, holders, names, None, 0, guessed, allowed)'s result (per worker, the leading blocks it
 * holds counting the allowed guesses) and, from the same pass, the longest prefix of ``hashes`` that a worker
 * holds counting confirmed blocks only: max(walk(..., None, 0)[0].values(), default=0). A confirmed mask is a
 * subset of the same block's mask with guesses, so the confirmed walk ends no later than the other. */
static PyObject *walk_both(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "walk_both takes 6 arguments");
        return NULL;
    }
    PyObject *shared = args[1], *holders = args[2], *names = args[3], *guessed = args[4];
    if (!PyDict_Check(shared) || !(PyDict_Check(holders) || IS_MAP(holders)) || !PyList_Check(names) ||
        !PyDict_Check(guessed)) {
        PyErr_SetString(PyExc_TypeError, "walk_both: expected dicts and a list of names");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **hs = PySequence_Fast_ITEMS(seq);
    Walk w;
    digit *mem = walk_open(&w, names, 1);
    if (mem == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    digit *held = mem + 5 * w.nd;  /* the workers holding every block so far, confirmed blocks only */
    PyObject *result = PyDict_New(), *out = NULL;
    Py_ssize_t confirmed = 0, nd, k, top = w.nd, ctop = 0, i;
    const digit *md;
    if (result == NULL) goto done;
    if (walk_allow(&w, args[5]) < 0) goto done;
    /* the holders' slots WALK_AHEAD blocks ahead asked for: each probe is a cache miss live (the table holds every
     * block of the fleet), and one after another they were most of this walk at 2-3k-token prompts (helper pick15) */
    enum { WALK_AHEAD = 8 };
    const U64Map *hmap = IS_MAP(holders) ? (const U64Map *)holders : NULL;
    for (i = 0; hmap != NULL && i < n && i < WALK_AHEAD; i++) map_prefetch_obj(hmap, hs[i]);
    for (i = 0; i < n; i++) {
        if (hmap != NULL && i + WALK_AHEAD < n) map_prefetch_obj(hmap, hs[i + WALK_AHEAD]);
        if (hmap != NULL && i + WALK_AHEAD / 2 < n) {  /* halfway: the slot is in, its mask object asked for */
            uint64_t key;
            PyObject *k = hs[i + WALK_AHEAD / 2];
            Py_ssize_t at = PyLong_CheckExact(k) && map_key(k, &key) == 1 ? map_find(hmap, key) : -1;
#if defined(__GNUC__) || defined(__clang__)
            if (at >= 0) __builtin_prefetch((const void *)(uintptr_t)hmap->slots[at].val);
#endif
        }
        /* the confirmed mask, then the same with the allowed guesses ORed in. From ``holders`` alone: the index keeps
         * every mask there, ``shared``'s too (the same int), and on the C path holders is a U64Map, whose probe is
         * a slot while a dict's of an int key is its hash, its entry and the key object (~3 µs a prompt of the
         * kv_stages workload; helper pick11) */
        PyObject *m = IS_MAP(holders) ? NULL : PyDict_GetItemWithError(shared, hs[i]);
        if (m == NULL) {
            if (PyErr_Occurred()) goto done;
            m = tab_get(holders, hs[i]);
            if (m == NULL && PyErr_Occurred()) goto done;
        }
        if (digits_of(m, &w, &md, &nd) < 0) goto done;
        for (k = 0; k < w.nd; k++) w.mixed[k] = k < nd ? md[k] : 0;
        if (i == 0) {
            for (k = 0; k < w.nd; k++) held[k] = w.mixed[k];
            ctop = w.nd;
        } else {
            for (k = 0; k < ctop; k++) held[k] &= w.mixed[k];
        }
        while (ctop > 0 && !held[ctop - 1]) ctop--;
        if (ctop > 0) confirmed = i + 1;
        /* past the first block only the workers still walking count (walk_step reads active & mixed): when the
         * confirmed mask has them all, no guess can change the step, and the guesses' lookup (a dict's index, entry,
         * key and mask, cold live) is skipped (issue 15's fifteenth round, helper place17) */
        int covered = i > 0;
        for (k = 0; covered && k < top; k++) covered = !(w.active[k] & ~w.mixed[k]);
        PyObject *g = covered ? NULL : PyDict_GetItemWithError(guessed, hs[i]);
        if (g == NULL && PyErr_Occurred()) goto done;
        if (g != NULL) {
            const digit *gd;
            Py_ssize_t gn;
            if (digits_of(g, &w, &gd, &gn) < 0) goto done;
            for (k = 0; k < gn; k++) w.mixed[k] |= gd[k] & w.allowed[k];
        }
        if (i == 0) {
            int any = 0;
            for (k = 0; k < w.nd; k++) any |= (w.active[k] = w.mixed[k]) != 0;
            if (!any) goto finish;
            while (top > 0 && !w.active[top - 1]) top--;
            continue;
        }
        int still = walk_step(&w, w.mixed, w.nd, &top, i, result, names);
        if (still < 0) goto done;
        if (still == 0) goto finish;  /* no worker holds block i, guessed or not */
    }
    if (n > 0 && record(result, w.active, top, n, names) < 0) goto done;
finish:
    out = Py_BuildValue("(On)", result, confirmed);
done:
    Py_XDECREF(result);
    walk_close(&w, mem);
    Py_DECREF(seq);
    return out;
}

/* kv_terms(prompt_tokens, credit, size, queued, active, decoding, capacity, max_tokens, weight, horizon,
 *          eviction_weight, cached, occupancy) -> 8-tuple of floats
 * KvTtftPolicy.terms (infera/router/kv_ttft.py) for one candidate of the plain cost (no cold wait, no progress
 * credit, no stall, no duplication): (prefill, batch, memory, horizon, eviction, 0.0, occupancy, 0.0) in modelled
 * ms, each computed with the same double operations in the same order as the Python (so to the bit: no
 * contraction into fused multiply-adds; ints are exact in doubles here). The step model's constants are
 * kv_ttft.py's PREFILL, DECODE, STEP_TOKENS, DECODE_FLOOR_MS and UNKNOWN_USAGE. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#define NO_FMA
#elif defined(__GNUC__)
#define NO_FMA __attribute__((optimize("fp-contract=off")))
#else
#define NO_FMA
#endif

static const double PRE_A = 4.21e-7, PRE_B = 0.0152, PRE_C = 16.5;
static const double DEC_A = -25.74, DEC_B = 54.01, DEC_C = 5.74;
static const double STEP_TOKENS = 8192.0, DECODE_FLOOR_MS = 1.0, UNKNOWN_USAGE = 0.5;

/* Python's a // b for ints (b > 0) */
static inline long long floor_div(long long a, long long b) {
    long long q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

static NO_FMA double step_prefill_ms(double t) { return PRE_A * t * t + PRE_B * t + PRE_C; }

/* kv_ttft.prefill_ms: divmod(tokens, STEP_TOKENS) as Python's float divmod (exact for the ints it also takes) */
static NO_FMA double py_prefill_ms(double tokens) {
    if (tokens <= 0) return 0.0;
    double rest = fmod(tokens, STEP_TOKENS);
    double div = (tokens - rest) / STEP_TOKENS;
    double full = floor(div);
    if (div - full > 0.5) full += 1.0;
    return full * step_prefill_ms(STEP_TOKENS) + (rest != 0.0 ? step_prefill_ms(rest) : 0.0);
}

/* kv_ttft.decode_ms */
static NO_FMA double py_decode_ms(double tokens, long long decoding, long long active, long long capacity) {
    if (decoding <= 0) return 0.0;
    double usage = UNKNOWN_USAGE;
    if (capacity > 0) {
        double u = (double)active / (double)capacity;
        usage = u < 1.0 ? u : 1.0;
    }
    long long steps = -floor_div(-(long long)tokens, (long long)STEP_TOKENS);
    if (steps < 1) steps = 1;
    double per = DEC_A * usage * usage + DEC_B * usage + DEC_C;
    return (double)steps * (per > DECODE_FLOOR_MS ? per : DECODE_FLOOR_MS);
}

static NO_FMA double py_recompute_ms(double tokens) {
    return tokens > 0 ? PRE_A * tokens * tokens + PRE_B * tokens : 0.0;
}

static inline long long ll_min(long long a, long long b) { return a < b ? a : b; }
static inline long long ll_max(long long a, long long b) { return a > b ? a : b; }

/* kv_terms' arithmetic: the 8 terms in t[] (kv_score, helper pick11's block, computes its candidates' with it) */
static NO_FMA void terms_of(double t[8], long long prompt_tokens, double credit, long long size, long long queued,
                            long long active, long long decoding, long long capacity, long long max_tokens,
                            double weight, double horizon_w, double eviction_w, long long cached, double occupancy_w,
                            U64Map *shadow, double tau, double now) {
    double own = (double)prompt_tokens - credit * (double)size;
    if (!(own > 0.0)) own = 0.0;
    double tokens = (double)queued + own;
    double prefill = py_prefill_ms(tokens) * weight;
    double batch = py_decode_ms(tokens, decoding, active, capacity);
    long long need = -floor_div(-(long long)own, size) + -floor_div(-max_tokens, size);
    long long after = active + need;
    double memory = 0.0;
    if (capacity > 0 && after > capacity)
        memory = (double)(after - capacity) / (double)capacity * (double)max_tokens * (DEC_A + DEC_B + DEC_C);
    double horizon = horizon_w * py_decode_ms(1.0, 1, after, capacity);
    double eviction = 0.0;
    if (eviction_w != 0.0 && capacity > 0 && need > 0) {
        long long occupied = ll_min(capacity, ll_max(cached, active));
        long long evicted = ll_max(0, ll_min(need - (capacity - occupied), occupied - ll_min(active, occupied)));
        eviction = eviction_w * weight * py_recompute_ms((double)(evicted * size));
        if (shadow != NULL && eviction > 0.0) eviction *= recency_tail(shadow, evicted, tau, now);
    }
    double occupancy = occupancy_w != 0.0 ? occupancy_w * weight * py_recompute_ms(own) : 0.0;
    t[0] = prefill;
    t[1] = batch;
    t[2] = memory;
    t[3] = horizon;
    t[4] = eviction;
    t[5] = 0.0;
    t[6] = occupancy;
    t[7] = 0.0;
}

/* kv_terms(13 args[, shadow, tau, now]): with a recency shadow (a U64Map(False) kept by recency_touch; None: none)
 * the eviction term is weighted by recency_value(shadow, evicted, tau, now), as kv_evict.py's Python path does */
static NO_FMA PyObject *kv_terms(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13 && nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "kv_terms takes 13 or 16 arguments");
        return NULL;
    }
    U64Map *shadow = NULL;
    double tau = 0.0, now = 0.0;
    if (nargs == 16 && args[13] != Py_None) {
        if (!IS_MAP(args[13]) || ((U64Map *)args[13])->objvals) {
            PyErr_SetString(PyExc_TypeError, "kv_terms: the shadow is a U64Map(False) or None");
            return NULL;
        }
        shadow = (U64Map *)args[13];
        tau = PyFloat_AsDouble(args[14]);
        now = PyFloat_AsDouble(args[15]);
    }
    long long prompt_tokens = PyLong_AsLongLong(args[0]);
    double credit = PyFloat_AsDouble(args[1]);
    long long size = PyLong_AsLongLong(args[2]), queued = PyLong_AsLongLong(args[3]);
    long long active = PyLong_AsLongLong(args[4]), decoding = PyLong_AsLongLong(args[5]);
    long long capacity = PyLong_AsLongLong(args[6]), max_tokens = PyLong_AsLongLong(args[7]);
    double weight = PyFloat_AsDouble(args[8]), horizon_w = PyFloat_AsDouble(args[9]);
    double eviction_w = PyFloat_AsDouble(args[10]);
    long long cached = PyLong_AsLongLong(args[11]);
    double occupancy_w = PyFloat_AsDouble(args[12]);
    if (PyErr_Occurred()) return NULL;
    if (size <= 0) {
        PyErr_SetString(PyExc_ValueError, "kv_terms: the block size must be positive");
        return NULL;
    }
    double t[8];
    terms_of(t, prompt_tokens, credit, size, queued, active, decoding, capacity, max_tokens, weight, horizon_w,
             eviction_w, cached, occupancy_w, shadow, tau, now);
    return Py_BuildValue("(dddddddd)", t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
}

/* kv_terms_model() -> ((PREFILL a, b, c), (DECODE a, b, c), STEP_TOKENS, DECODE_FLOOR_MS, UNKNOWN_USAGE): the step
 * model kv_terms computes with; kv_ttft.py uses kv_terms only while its own constants are these */
static PyObject *kv_terms_model(PyObject *self, PyObject *unused) {
    return Py_BuildValue("((ddd)(ddd)idd)", PRE_A, PRE_B, PRE_C, DEC_A, DEC_B, DEC_C, (int)STEP_TOKENS,
                         DECODE_FLOOR_MS, UNKNOWN_USAGE);
}

/* kv_modelled(tokens, decoding, active, capacity) -> float: kv_ttft.modelled_ms(1.0, ...), a TTFT sample's
 * modelled ms (the speed scale's denominator), the same doubles as the Python */
static NO_FMA PyObject *kv_modelled(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "kv_modelled takes 4 arguments");
        return NULL;
    }
    double tokens = PyFloat_AsDouble(args[0]);
    long long decoding = PyLong_AsLongLong(args[1]), active = PyLong_AsLongLong(args[2]);
    long long capacity = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    return PyFloat_FromDouble(1.0 * py_prefill_ms(tokens) + py_decode_ms(tokens, decoding, active, capacity));
}

/* ==== kv-aware's recency shadow (infera/router/kv_evict.py) ========================================================
 *
 * Per worker, the router hashes of the prompts routed there in the order of their last use (a shadow of the engine's
 * LRU), each with that use's time: a U64Map(False) whose insertion order is the LRU order (oldest first) and whose
 * values are the times as the bits of a double. The pure path (INFERA_PURE_PYTHON, or no compiler) keeps an
 * OrderedDict with the same operations (kv_evict.py's _PyShadow); tests/router/test_kv_evict_native.py runs both. */

static inline double bits_double(uint64_t u) {
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static inline uint64_t double_bits(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

#define SLOT_DETACHED (-2) /* in the table, out of the order list while recency_touch moves it */

static inline void order_append(U64Map *m, Py_ssize_t i) {
    MapSlot *s = &m->slots[i];
    s->prev = m->tail;
    s->next = SLOT_NONE;
    if (m->tail == SLOT_NONE) m->head = (int32_t)i;
    else m->slots[m->tail].next = (int32_t)i;
    m->tail = (int32_t)i;
}

static inline void order_detach(U64Map *m, Py_ssize_t i) {
    MapSlot *s = &m->slots[i];
    if (s->prev == SLOT_NONE) m->head = s->next;
    else m->slots[s->prev].next = s->next;
    if (s->next == SLOT_NONE) m->tail = s->prev;
    else m->slots[s->next].prev = s->prev;
    s->prev = SLOT_DETACHED;
}

static int shadow_arg(PyObject *o, const char *name, U64Map **out) {
    if (!IS_MAP(o) || ((U64Map *)o)->objvals) {
        PyErr_Format(PyExc_TypeError, "%s: the shadow is a U64Map(False)", name);
        return -1;
    }
    *out = (U64Map *)o;
    return 0;
}

/* recency_touch(shadow, hashes, when, limit) -> float: the Python
 *     oldest = min(map(lru.pop, hashes, repeat(inf)), default=inf); lru.update(zip(hashes, repeat(when)))
 *     then popitem(last=False) while len(lru) > limit
 * i.e. the hashes move (in their order) to the young end with last use ``when``; returns the oldest last use they
 * had (inf if none was there). Hashes that are no u64 are an error (router hashes always are). */
static PyObject *recency_touch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "recency_touch takes 4 arguments");
        return NULL;
    }
    U64Map *m;
    if (shadow_arg(args[0], "recency_touch", &m) < 0) return NULL;
    PyObject *seq = PySequence_Fast(args[1], "recency_touch: hashes must be a sequence");
    if (seq == NULL) return NULL;
    double when = PyFloat_AsDouble(args[2]);
    long long limit = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    /* room for every hash first: no resize between detaching and appending (a resize follows the order list) */
    if ((m->used + n) * 10 > m->cap * 7 && map_resize(m, 2 * (m->used + n)) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    m->version++;  /* the order changes below, on every path */
    /* each hash's slot from the pops, for the update (helper pick15: one conversion and one probe a hash, not two;
     * no slot moves in between: nothing is removed, and room was made), and the probes' cache lines asked for
     * TOUCH_AHEAD hashes ahead (the shadow's table is mostly cold live) */
    enum { TOUCH_STACK = 256, TOUCH_AHEAD = 8 };
    Py_ssize_t stack_slots[TOUCH_STACK], *where = n <= TOUCH_STACK ? stack_slots : PyMem_Malloc((size_t)n * sizeof *where);
    if (where == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < n && k < TOUCH_AHEAD; k++) map_prefetch_obj(m, items[k]);
    double oldest = Py_HUGE_VAL;
    for (Py_ssize_t k = 0; k < n; k++) {  /* the pops: take each out of the order, note its last use */
        uint64_t key;
        if (k + TOUCH_AHEAD < n) map_prefetch_obj(m, items[k + TOUCH_AHEAD]);
        if (map_key_strict(items[k], &key) < 0) goto fail;
        Py_ssize_t i = where[k] = map_find(m, key);
        if (i < 0 || m->slots[i].prev == SLOT_DETACHED) continue;  /* absent, or popped already (pop gives inf) */
        double last = bits_double(m->slots[i].val);
        if (last < oldest) oldest = last;
        order_detach(m, i);
    }
    uint64_t stamp = double_bits(when);
    for (Py_ssize_t k = 0; k < n; k++) {  /* the update: back in at the young end, in the prompt's order */
        Py_ssize_t i = where[k];
        if (i >= 0) {
            if (m->slots[i].prev == SLOT_DETACHED) order_append(m, i);
        } else {  /* absent at the pops (or added since by an earlier copy of the same hash: map_slot finds it) */
            uint64_t key;
            int added;
            if (map_key_strict(items[k], &key) < 0) goto fail;
            i = map_slot(m, key, &added);  /* no resize: room was made above */
            if (i < 0) goto fail;
        }
        m->slots[i].val = stamp;
    }
    if (where != stack_slots) PyMem_Free(where);
    m->version++;
    Py_DECREF(seq);
    while (m->used > limit && m->head != SLOT_NONE) map_unlink(m, m->head);  /* the LRU's oldest go */
    return PyFloat_FromDouble(oldest);
fail:
    if (where != stack_slots) PyMem_Free(where);
    /* put back anything still detached (at the young end), so the table stays consistent */
    for (Py_ssize_t k = 0; k < n; k++) {
        uint64_t key;
        if (map_key(items[k], &key) != 1) continue;
        Py_ssize_t i = map_find(m, key);
        if (i >= 0 && m->slots[i].prev == SLOT_DETACHED) order_append(m, i);
    }
    Py_DECREF(seq);
    return NULL;
}

/* the value (0..1) of the ``blocks`` least recently used blocks (kv_evict.py's _PyShadow.value): tau / (tau + age) of
 * the middle one of those it knows, blocks it does not know counting 1; the same doubles in the same order */
static NO_FMA double recency_tail(U64Map *m, long long blocks, double tau, double now) {
    if (blocks <= 0 || m->used == 0) return 1.0;
    long long known = blocks < (long long)m->used ? blocks : (long long)m->used;
    /* the (known / 2)-th slot from the head: each step a dependent load, most of them cache misses live (~60 ns:
     * the order list runs over the whole table). The last answer's place, kept while the order is unchanged
     * (three of four workers' shadows between two decisions), starts the walk when nearer (helper pick15) */
    Py_ssize_t want = (Py_ssize_t)(known / 2), at = 0;
    int32_t j = m->head;
    if (m->cur_slot >= 0 && m->cur_version == m->version) {
        Py_ssize_t d = want - m->cur_rank;
        if ((d < 0 ? -d : d) < want) {
            j = m->cur_slot;
            at = m->cur_rank;
        }
    }
    for (; at < want; at++) j = m->slots[j].next;
    for (; at > want; at--) j = m->slots[j].prev;
    m->cur_slot = j;
    m->cur_rank = want;
    m->cur_version = m->version;
    double age = now - bits_double(m->slots[j].val);
    if (!(age > 0.0)) age = 0.0;  /* max(0.0, age) */
    return ((double)known * tau / (tau + age) + (double)(blocks - known)) / (double)blocks;
}

/* recency_value(shadow, blocks, tau, now) -> float */
static PyObject *recency_value(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "recency_value takes 4 arguments");
        return NULL;
    }
    U64Map *m;
    if (shadow_arg(args[0], "recency_value", &m) < 0) return NULL;
    long long blocks = PyLong_AsLongLong(args[1]);
    double tau = PyFloat_AsDouble(args[2]), now = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred()) return NULL;
    return PyFloat_FromDouble(recency_tail(m, blocks, tau, now));
}

/* recency_items(shadow) -> [(hash, last use), ...], oldest first */
static PyObject *recency_items(PyObject *self, PyObject *arg) {
    U64Map *m;
    if (shadow_arg(arg, "recency_items", &m) < 0) return NULL;
    PyObject *out = PyList_New(m->used);
    if (out == NULL) return NULL;
    Py_ssize_t k = 0;
    for (int32_t j = m->head; j != SLOT_NONE; j = m->slots[j].next, k++) {
        PyObject *pair = Py_BuildValue("(Kd)", (unsigned long long)m->slots[j].key, bits_double(m->slots[j].val));
        if (pair == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, k, pair);
    }
    return out;
}

static PyMethodDef recency_methods[] = {
    {"recency_touch", (PyCFunction)(void (*)(void))recency_touch, METH_FASTCALL, NULL},
    {"recency_value", (PyCFunction)(void (*)(void))recency_value, METH_FASTCALL, NULL},
    {"recency_items", recency_items, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static int add_recency(PyObject *mod) { return PyModule_AddFunctions(mod, recency_methods); }

/* ==== kv-aware's speed scale (infera/router/kv_ttft.py, KvTtftPolicy._relative_scales) =============================
 *
 * kv_scales(sums, min_samples, dead_band, max_relative) -> [float]: each candidate's speed relative to the fleet's
 * median from its _Scale (attributes n, observed, modelled, floor), the same doubles in the same order as the
 * Python (tests/router/test_kv_evict_native.py compares them to the bit). */

static PyObject *STR_N, *STR_OBSERVED, *STR_MODELLED, *STR_FLOOR;

static int scale_attr(PyObject *o, PyObject *name, double *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    *out = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

static NO_FMA PyObject *kv_scales(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "kv_scales takes 4 arguments");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "kv_scales: sums must be a sequence");
    if (seq == NULL) return NULL;
    long long min_samples = PyLong_AsLongLong(args[1]);
    double band = PyFloat_AsDouble(args[2]), most = PyFloat_AsDouble(args[3]);
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    double *mem = PyMem_Malloc(sizeof(double) * (size_t)(2 * len + 1));
    char *has = PyMem_Malloc((size_t)len + 1);
    PyObject *out = NULL;
    if (PyErr_Occurred() || mem == NULL || has == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    double *raw = mem, *known = mem + len;
    long long *ns = (long long *)PyMem_Malloc(sizeof(long long) * (size_t)(len + 1));
    double *observed = PyMem_Malloc(sizeof(double) * (size_t)(2 * len + 1));
    if (ns == NULL || observed == NULL) {
        PyMem_Free(ns);
        PyMem_Free(observed);
        PyErr_NoMemory();
        goto done;
    }
    double *modelled = observed + len;
    int any = 0;
    double fixed = 0.0;
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *nv = PyObject_GetAttr(items[i], STR_N);
        if (nv == NULL) goto fail;
        ns[i] = PyLong_AsLongLong(nv);
        Py_DECREF(nv);
        if (ns[i] == -1 && PyErr_Occurred()) goto fail;
        if (ns[i] < min_samples) continue;
        double floor_;
        if (scale_attr(items[i], STR_FLOOR, &floor_) < 0 || scale_attr(items[i], STR_OBSERVED, &observed[i]) < 0
            || scale_attr(items[i], STR_MODELLED, &modelled[i]) < 0)
            goto fail;
        if (!any || floor_ < fixed) fixed = floor_;  /* min(floors): the first of the smallest */
        any = 1;
    }
    Py_ssize_t nk = 0;
    for (Py_ssize_t i = 0; i < len && any; i++) {
        has[i] = 0;
        if (ns[i] < min_samples) continue;
        double den = modelled[i] + (double)ns[i] * fixed;
        if (!(den > 0)) continue;
        raw[i] = observed[i] / den;
        has[i] = 1;
        if (raw[i] > 0.0) {  /* insertion sort: a fleet's candidates */
            Py_ssize_t j = nk++;
            while (j > 0 && known[j - 1] > raw[i]) {
                known[j] = known[j - 1];
                j--;
            }
            known[j] = raw[i];
        }
    }
    out = PyList_New(len);
    if (out == NULL) goto fail;
    double mid = nk ? known[nk / 2] : 0.0;
    for (Py_ssize_t i = 0; i < len; i++) {
        double rel = 1.0;
        if (nk) {
            if (has[i] && raw[i] > 0.0) rel = raw[i] / mid;
            if (1.0 / band <= rel && rel <= band) rel = 1.0;
            double lo = 1.0 / most;
            rel = rel > lo ? rel : lo;      /* max(1/most, rel) */
            rel = rel < most ? rel : most;  /* min(most, ...) */
        }
        PyObject *f = PyFloat_FromDouble(rel);
        if (f == NULL) {
            Py_CLEAR(out);
            goto fail;
        }
        PyList_SET_ITEM(out, i, f);
    }
fail:
    PyMem_Free(ns);
    PyMem_Free(observed);
done:
    PyMem_Free(mem);
    PyMem_Free(has);
    Py_DECREF(seq);
    return out;
}

/* kv_window(parts, samples, keep, capacity, seconds) -> (observed, modelled) | None: KvTtftPolicy._sums' refresh of one
 * worker's window. ``parts`` (a list of the samples' modelled ms, oldest first) keeps its last ``keep`` (Python's
 * ``del parts[:len(parts) - keep]``), then gets kv_modelled of ``samples[keep:]`` (TtftSample: queued_tokens +
 * prefill_tokens, decoding, active_blocks) appended; returns ``sum(seconds) * 1000.0`` and ``sum(parts)``, summed
 * in order from 0.0 as Python 3.11's sum() adds floats, so the doubles are the same to the bit. None (parts already
 * updated) when an item of either sum is not a float: the caller sums those itself. */
static PyObject *STR_QUEUED, *STR_PREFILL, *STR_DECODING, *STR_ACTIVE;

static int window_attr(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* the in-order sum of a sequence of exact floats: 1 done, 0 an item is not a float, -1 error */
static int float_sum(PyObject *seq, double *out) {
    double total = 0.0;
    if (PyList_CheckExact(seq) || PyTuple_CheckExact(seq)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        PyObject **items = PySequence_Fast_ITEMS(seq);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!PyFloat_CheckExact(items[i])) return 0;
            total += PyFloat_AS_DOUBLE(items[i]);
        }
        *out = total;
        return 1;
    }
    PyObject *it = PyObject_GetIter(seq);
    if (it == NULL) return -1;
    PyObject *x;
    int ok = 1;
    while ((x = PyIter_Next(it)) != NULL) {
        if (!PyFloat_CheckExact(x)) ok = 0;
        else total += PyFloat_AS_DOUBLE(x);
        Py_DECREF(x);
        if (!ok) break;
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) return -1;
    *out = total;
    return ok;
}

static NO_FMA PyObject *kv_window(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "kv_window takes 5 arguments");
        return NULL;
    }
    PyObject *parts = args[0], *samples = args[1], *seconds = args[4];
    if (!PyList_Check(parts)) {
        PyErr_SetString(PyExc_TypeError, "kv_window: parts must be a list");
        return NULL;
    }
    Py_ssize_t keep = PyLong_AsSsize_t(args[2]);
    long long capacity = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t n = PySequence_Size(samples);
    if (n < 0) return NULL;
    /* del parts[:len(parts) - keep], with a slice's clamping */
    Py_ssize_t len = PyList_GET_SIZE(parts), stop = len - keep;
    if (stop < 0) stop += len;
    if (stop < 0) stop = 0;
    if (stop > len) stop = len;
    if (stop > 0 && PyList_SetSlice(parts, 0, stop, NULL) < 0) return NULL;
    /* samples[keep:], as a slice clamps its start */
    Py_ssize_t first = keep < 0 ? (keep + n > 0 ? keep + n : 0) : (keep < n ? keep : n);
    for (Py_ssize_t i = first; i < n; i++) {
        PyObject *x = PySequence_GetItem(samples, i);
        if (x == NULL) return NULL;
        /* as kv_modelled(x.queued_tokens + x.prefill_tokens, x.decoding, x.active_blocks, capacity) converts them */
        long long decoding, active;
        double tokens = -1.0;
        PyObject *q = PyObject_GetAttr(x, STR_QUEUED), *p = q ? PyObject_GetAttr(x, STR_PREFILL) : NULL;
        PyObject *sum = p ? PyNumber_Add(q, p) : NULL;
        Py_XDECREF(q);
        Py_XDECREF(p);
        if (sum != NULL) {
            tokens = PyFloat_AsDouble(sum);
            Py_DECREF(sum);
        }
        int bad = sum == NULL || (tokens == -1.0 && PyErr_Occurred()) || window_attr(x, STR_DECODING, &decoding) < 0
                  || window_attr(x, STR_ACTIVE, &active) < 0;
        Py_DECREF(x);
        if (bad) return NULL;
        PyObject *f = PyFloat_FromDouble(1.0 * py_prefill_ms(tokens) + py_decode_ms(tokens, decoding, active,
                                                                                   capacity));
        if (f == NULL) return NULL;
        int r = PyList_Append(parts, f);
        Py_DECREF(f);
        if (r < 0) return NULL;
    }
    double observed, modelled;
    int a = float_sum(seconds, &observed);
    if (a < 0) return NULL;
    int b = a ? float_sum(parts, &modelled) : 0;
    if (b < 0) return NULL;
    if (!a || !b) Py_RETURN_NONE;
    return Py_BuildValue("(dd)", observed * 1000.0, modelled);
}

static PyMethodDef scale_methods[] = {
    {"kv_scales", (PyCFunction)(void (*)(void))kv_scales, METH_FASTCALL, NULL},
    {"kv_window", (PyCFunction)(void (*)(void))kv_window, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static int add_scales(PyObject *mod) {
    STR_N = PyUnicode_InternFromString("n");
    STR_OBSERVED = PyUnicode_InternFromString("observed");
    STR_MODELLED = PyUnicode_InternFromString("modelled");
    STR_FLOOR = PyUnicode_InternFromString("floor");
    STR_QUEUED = PyUnicode_InternFromString("queued_tokens");
    STR_PREFILL = PyUnicode_InternFromString("prefill_tokens");
    STR_DECODING = PyUnicode_InternFromString("decoding");
    STR_ACTIVE = PyUnicode_InternFromString("active_blocks");
    if (STR_N == NULL || STR_OBSERVED == NULL || STR_MODELLED == NULL || STR_FLOOR == NULL || STR_QUEUED == NULL
        || STR_PREFILL == NULL || STR_DECODING == NULL || STR_ACTIVE == NULL)
        return -1;
    return PyModule_AddFunctions(mod, scale_methods);
}

/* ==== The load tracker's block references in a U64Map(False) (infera/kv/load.py, helper pick11) ====================
 *
 * load_refs_add(refs, hashes) / load_refs_release(refs, hashes) -> None: refs_add / refs_release on a U64Map(False)
 * whose values are the counts, inline (no int object, no dict probe of a hashed int per block: a routed prompt's
 * ~64 blocks cost ~2.4 µs each way in a dict). The same counts as the dict's: a count that reaches 0 leaves the map;
 * a hash missing on release is a KeyError; a hash that is no u64 is an error (router hashes always are). */

static int load_refs_step(PyObject *const *args, Py_ssize_t nargs, int up) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "load_refs_add/load_refs_release take 2 arguments");
        return -1;
    }
    if (!IS_MAP(args[0]) || ((U64Map *)args[0])->objvals) {
        PyErr_SetString(PyExc_TypeError, "load_refs: refs must be a U64Map(False)");
        return -1;
    }
    U64Map *m = (U64Map *)args[0];
    PyObject *seq = PySequence_Fast(args[1], "hashes must be a sequence");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t j = 0; j < n; j++) {
        uint64_t key;
        if (map_key_strict(items[j], &key) < 0) goto fail;
        if (up) {
            int added;
            Py_ssize_t i = map_slot(m, key, &added);
            if (i < 0) goto fail;
            m->slots[i].val = added ? 1 : m->slots[i].val + 1;
            continue;
        }
        Py_ssize_t i = map_find(m, key);
        if (i < 0) {
            PyErr_SetObject(PyExc_KeyError, items[j]);
            goto fail;
        }
        if (--m->slots[i].val == 0) map_unlink(m, i);
    }
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    return -1;
}

static PyObject *load_refs_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (load_refs_step(args, nargs, 1) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *load_refs_release(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (load_refs_step(args, nargs, 0) < 0) return NULL;
    Py_RETURN_NONE;
}

/* ==== kv-aware's score after the walk and the scales, in one call (infera/router/kv_ttft.py, helper pick11) =========
 *
 * kv_score(candidates, overlaps, held, decoding, prompt_tokens, max_tokens, weight, horizon, eviction, occupancy,
 *          shadows, tau, now, best, margin, floor_mode, scales) -> (costs, stay_added) | None
 * KvTtftPolicy.score's plain C path from the overlaps and the speed scales on: per candidate the kv_terms call of
 * _c_all_terms (its worker's ``held(wid)`` and ``decoding(wid)`` asked through the two callables, its recency shadow
 * ``shadows.get(wid)`` when ``shadows`` is a dict), their sum as sum() adds them, the stay floor of _floor
 * (``floor_mode`` 0: off, 1: the batch's share and the horizon, 2: the horizon; ``best``: the longest confirmed prefix
 * per block size; no fairness gate) and the costs (scale * sum). None, before anything is computed, when a candidate
 * with an overlap holds blocks below the device (its credit is cached_credit's: the Python path). The same doubles in
 * the same order as the Python (tests/router/test_kv_native_pick.py, every decision on both paths). */

static PyObject *STR_WORKER, *STR_INSTANCE_ID, *STR_BLOCK_SIZE, *STR_CAPACITY, *STR_KV_BLOCKS, *STR_CAND_PREFILL,
    *STR_CAND_ACTIVE;

static int attr_ll(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

typedef struct {
    long long size, decoding;
    int short_;  /* short of the longest confirmed prefix at its block size (the stay floor's) */
    PyObject *size_obj;  /* the worker's kv_block_size (a new reference): the key of ``best`` */
    double t[8], sum;
} ScoreCand;

static NO_FMA PyObject *kv_score(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 17) {
        PyErr_SetString(PyExc_TypeError, "kv_score takes 17 arguments");
        return NULL;
    }
    PyObject *cands = args[0], *overlaps = args[1], *held = args[2], *decoding = args[3], *shadows = args[10];
    PyObject *best = args[13], *scales = args[16];
    if (!PyList_Check(cands) || !PyList_Check(overlaps) || !PyList_Check(scales) || !PyDict_Check(best) ||
        (shadows != Py_None && !PyDict_Check(shadows))) {
        PyErr_SetString(PyExc_TypeError, "kv_score: candidates, overlaps and scales are lists, best and shadows dicts");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(cands);
    if (PyList_GET_SIZE(overlaps) != n || PyList_GET_SIZE(scales) != n) {
        PyErr_SetString(PyExc_ValueError, "kv_score: one overlap and one scale per candidate");
        return NULL;
    }
    long long prompt_tokens = PyLong_AsLongLong(args[4]), max_tokens = PyLong_AsLongLong(args[5]);
    double weight = PyFloat_AsDouble(args[6]), horizon_w = PyFloat_AsDouble(args[7]);
    double eviction_w = PyFloat_AsDouble(args[8]), occupancy_w = PyFloat_AsDouble(args[9]);
    double tau = PyFloat_AsDouble(args[11]), now = PyFloat_AsDouble(args[12]);
    long long margin = PyLong_AsLongLong(args[14]), floor_mode = PyLong_AsLongLong(args[15]);
    if (PyErr_Occurred()) return NULL;
    ScoreCand *cs = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(ScoreCand));
    if (cs == NULL) return PyErr_NoMemory();
    PyObject *out = NULL, *costs = NULL, *added = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        ScoreCand *c = &cs[i];
        PyObject *cand = PyList_GET_ITEM(cands, i), *worker = NULL, *wid = NULL, *cap = NULL, *h = NULL;
        long long overlap = PyLong_AsLongLong(PyList_GET_ITEM(overlaps, i));
        long long capacity = 0, queued = 0, active = 0, cached = 0;
        int ok = 0;
        if (overlap == -1 && PyErr_Occurred()) goto done;
        worker = PyObject_GetAttr(cand, STR_WORKER);
        if (worker == NULL) goto cand_done;
        wid = PyObject_GetAttr(worker, STR_INSTANCE_ID);
        c->size_obj = wid ? PyObject_GetAttr(worker, STR_BLOCK_SIZE) : NULL;
        cap = c->size_obj ? PyObject_GetAttr(worker, STR_CAPACITY) : NULL;
        if (cap == NULL) goto cand_done;
        c->size = PyLong_AsLongLong(c->size_obj);
        if ((c->size == -1 && PyErr_Occurred()) || attr_ll(cap, STR_KV_BLOCKS, &capacity) < 0 ||
            attr_ll(cand, STR_CAND_PREFILL, &queued) < 0 || attr_ll(cand, STR_CAND_ACTIVE, &active) < 0)
            goto cand_done;
        if (c->size <= 0) {
            PyErr_SetString(PyExc_ValueError, "kv_score: the block size must be positive");
            goto cand_done;
        }
        h = PyObject_CallOneArg(held, wid);  /* (cached blocks, any held only below the device) */
        if (h == NULL) goto cand_done;
        if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) != 2) {
            PyErr_SetString(PyExc_TypeError, "kv_score: held() answers (count, lower)");
            goto cand_done;
        }
        cached = PyLong_AsLongLong(PyTuple_GET_ITEM(h, 0));
        if (cached == -1 && PyErr_Occurred()) goto cand_done;
        int lower = PyObject_IsTrue(PyTuple_GET_ITEM(h, 1));
        if (lower < 0) goto cand_done;
        if (lower && overlap) {  /* a fractional credit: cached_credit's, on the Python path */
            ok = 2;
            goto cand_done;
        }
        PyObject *d = PyObject_CallOneArg(decoding, wid);
        if (d == NULL) goto cand_done;
        c->decoding = PyLong_AsLongLong(d);
        Py_DECREF(d);
        if (c->decoding == -1 && PyErr_Occurred()) goto cand_done;
        U64Map *shadow = NULL;
        if (shadows != Py_None) {
            PyObject *sh = PyDict_GetItemWithError(shadows, wid);
            if (sh == NULL && PyErr_Occurred()) goto cand_done;
            if (sh != NULL && sh != Py_None) {
                if (!IS_MAP(sh) || ((U64Map *)sh)->objvals) {
                    PyErr_SetString(PyExc_TypeError, "kv_score: a shadow is a U64Map(False)");
                    goto cand_done;
                }
                shadow = (U64Map *)sh;
            }
        }
        terms_of(c->t, prompt_tokens, (double)overlap, c->size, queued, active, c->decoding, capacity, max_tokens,
                 weight, horizon_w, eviction_w, cached, occupancy_w, shadow, tau, now);
        double sum = 0.0;  /* sum(t): 0 + t[0] is t[0], then in order */
        for (int k = 0; k < 8; k++) sum += c->t[k];
        c->sum = sum;
        ok = 1;
    cand_done:
        Py_XDECREF(worker);
        Py_XDECREF(wid);
        Py_XDECREF(cap);
        Py_XDECREF(h);
        if (ok == 2) {
            out = Py_None;
            Py_INCREF(out);
            goto done;
        }
        if (!ok) goto done;
    }
    added = PyList_New(n);
    costs = added ? PyList_New(n) : NULL;
    if (costs == NULL) goto done;
    double *stay = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(double));
    if (stay == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (floor_mode && PyDict_GET_SIZE(best) > 0) {  /* _floor: the holders' least decode terms and batch */
        long long holders = 0, held_dec = 0;
        double floor = 0.0;
        int fail = 0;
        for (Py_ssize_t i = 0; i < n && !fail; i++) {
            PyObject *w = PyDict_GetItemWithError(best, cs[i].size_obj);
            long long wanted = 0, overlap = PyLong_AsLongLong(PyList_GET_ITEM(overlaps, i));
            if (w == NULL ? PyErr_Occurred() != NULL : ((wanted = PyLong_AsLongLong(w)) == -1 && PyErr_Occurred())) {
                fail = 1;
                break;
            }
            cs[i].short_ = overlap < wanted;
            if (overlap < wanted || wanted <= 0) continue;
            double part = floor_mode == 2 ? cs[i].t[3] : cs[i].t[1] + cs[i].t[3];
            if (!holders || part < floor) floor = part;
            if (!holders || cs[i].decoding < held_dec) held_dec = cs[i].decoding;
            holders++;
        }
        if (fail) {
            PyMem_Free(stay);
            goto done;
        }
        for (Py_ssize_t i = 0; holders && i < n; i++) {
            if (!cs[i].short_) continue;
            if (margin && held_dec - cs[i].decoding >= margin) continue;
            double mine = floor_mode == 2 ? cs[i].t[3] : cs[i].t[1] + cs[i].t[3];
            if (mine < floor) {
                cs[i].sum += floor - mine;
                stay[i] = floor - mine;
            }
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        double scale = PyFloat_AsDouble(PyList_GET_ITEM(scales, i));
        if (scale == -1.0 && PyErr_Occurred()) {
            PyMem_Free(stay);
            goto done;
        }
        PyObject *cost = PyFloat_FromDouble(scale * cs[i].sum), *a = PyFloat_FromDouble(stay[i]);
        if (cost == NULL || a == NULL) {
            Py_XDECREF(cost);
            Py_XDECREF(a);
            PyMem_Free(stay);
            goto done;
        }
        PyList_SET_ITEM(costs, i, cost);
        PyList_SET_ITEM(added, i, a);
    }
    PyMem_Free(stay);
    out = PyTuple_Pack(2, costs, added);
done:
    for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(cs[i].size_obj);
    PyMem_Free(cs);
    Py_XDECREF(costs);
    Py_XDECREF(added);
    return out;
}

/* predict_map_add(predicted, masks, bit, hashes, expiry) -> list: predict_add with the worker's expiries in a
 * U64Map(True) (the expiry floats as its values, as the dict's) instead of a dict: a slot's probe per block instead
 * of a dict's (the int key's hash, its entry, the key object); ``masks`` stays the index's dict */
static PyObject *predict_map_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "predict_map_add takes 5 arguments");
        return NULL;
    }
    PyObject *masks = args[1], *bit = args[2], *expiry = args[4];
    if (!IS_MAP(args[0]) || !((U64Map *)args[0])->objvals || !PyDict_CheckExact(masks)) {
        PyErr_SetString(PyExc_TypeError, "predict_map_add: predicted is a U64Map(True), masks a dict");
        return NULL;
    }
    U64Map *m = (U64Map *)args[0];
    double until = PyFloat_AsDouble(expiry);
    if (until == -1.0 && PyErr_Occurred()) return NULL;
    PyObject *seq = PySequence_Fast(args[3], "predict_map_add: hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL) goto fail;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *h = items[k];
        uint64_t key;
        if (map_key_strict(h, &key) < 0) goto fail;
        Py_ssize_t i = map_find(m, key);
        if (i < 0) {
            PyObject *mask = PyDict_GetItemWithError(masks, h);
            if (mask == NULL && PyErr_Occurred()) goto fail;
            PyObject *joined = PyNumber_Or(mask != NULL ? mask : ZERO, bit);
            if (joined == NULL) goto fail;
            int rc = PyDict_SetItem(masks, h, joined);
            Py_DECREF(joined);
            if (rc < 0) goto fail;
            int added;
            i = map_slot(m, key, &added);
            if (i < 0) goto fail;
            Py_INCREF(expiry);
            m->slots[i].val = (uint64_t)(uintptr_t)expiry;
        } else {
            PyObject *old = (PyObject *)(uintptr_t)m->slots[i].val;
            double was = PyFloat_AsDouble(old);
            if (was == -1.0 && PyErr_Occurred()) goto fail;
            if (was >= until) continue;
            Py_INCREF(expiry);
            m->slots[i].val = (uint64_t)(uintptr_t)expiry;
            Py_DECREF(old);
        }
        if (PyList_Append(fresh, h) < 0) goto fail;
    }
    Py_DECREF(seq);
    return fresh;
fail:
    Py_XDECREF(fresh);
    Py_DECREF(seq);
    return NULL;
}

/* kv_refresh(sums, samples, count, capacity, seconds, fastest) -> (observed, modelled) | None
 * KvTtftPolicy._refresh's update of a worker's _Scale ``sums`` from the tracker's answers (``count`` samples ever,
 * the window ``samples``, their ``seconds``, the ``fastest`` of them), once its count moved: which samples are new
 * (all of them when the window is another sequence, the capacity changed or the count went back), kv_window's trim,
 * modelling and sums, then the fields. None, as kv_window's: an item was not a float, the sums are the caller's
 * (sum(), as the Python); every other field is set. */
static PyObject *STR_SOURCE, *STR_COUNT, *STR_CAP, *STR_PARTS, *STR_SUM_N, *STR_SUM_OBSERVED, *STR_SUM_MODELLED,
    *STR_SUM_FLOOR;

static PyObject *kv_refresh(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "kv_refresh takes 6 arguments");
        return NULL;
    }
    PyObject *sums = args[0], *samples = args[1], *seconds = args[4];
    long long count = PyLong_AsLongLong(args[2]), capacity = PyLong_AsLongLong(args[3]), had_cap, had_count;
    double fastest = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred()) return NULL;
    PyObject *source = PyObject_GetAttr(sums, STR_SOURCE);
    if (source == NULL) return NULL;
    Py_DECREF(source);  /* only its identity is compared */
    if (attr_ll(sums, STR_CAP, &had_cap) < 0 || attr_ll(sums, STR_COUNT, &had_count) < 0) return NULL;
    Py_ssize_t n = PyObject_Size(samples);
    if (n < 0) return NULL;
    int fresh = source != samples || had_cap != capacity || !(0 <= had_count && had_count <= count);
    long long new = fresh ? n : (n < count - had_count ? n : count - had_count);
    PyObject *parts = PyObject_GetAttr(sums, STR_PARTS);
    if (parts == NULL) return NULL;
    PyObject *keep = PyLong_FromLongLong((long long)n - new), *cap = keep ? PyLong_FromLongLong(capacity) : NULL;
    PyObject *got = NULL;
    if (cap != NULL) {
        PyObject *wargs[5] = {parts, samples, keep, cap, seconds};
        got = kv_window(NULL, wargs, 5);
    }
    Py_DECREF(parts);
    Py_XDECREF(keep);
    if (got == NULL) {
        Py_XDECREF(cap);
        return NULL;
    }
    int r = 0;
    if (got != Py_None)
        r = PyObject_SetAttr(sums, STR_SUM_OBSERVED, PyTuple_GET_ITEM(got, 0)) < 0 ||
            PyObject_SetAttr(sums, STR_SUM_MODELLED, PyTuple_GET_ITEM(got, 1)) < 0;
    PyObject *cnt = r ? NULL : PyLong_FromLongLong(count), *nn = cnt ? PyLong_FromSsize_t(n) : NULL;
    PyObject *fl = nn ? PyFloat_FromDouble(fastest * 1000.0) : NULL;
    r = fl == NULL || PyObject_SetAttr(sums, STR_CAP, cap) < 0 || PyObject_SetAttr(sums, STR_SOURCE, samples) < 0 ||
        PyObject_SetAttr(sums, STR_COUNT, cnt) < 0 || PyObject_SetAttr(sums, STR_SUM_N, nn) < 0 ||
        PyObject_SetAttr(sums, STR_SUM_FLOOR, fl) < 0;
    Py_DECREF(cap);
    Py_XDECREF(cnt);
    Py_XDECREF(nn);
    Py_XDECREF(fl);
    if (r) {
        Py_DECREF(got);
        return NULL;
    }
    return got;
}

static PyMethodDef pick11_methods[] = {
    {"kv_refresh", (PyCFunction)(void (*)(void))kv_refresh, METH_FASTCALL, NULL},
    {"predict_map_add", (PyCFunction)(void (*)(void))predict_map_add, METH_FASTCALL, NULL},
    {"load_refs_add", (PyCFunction)(void (*)(void))load_refs_add, METH_FASTCALL, NULL},
    {"load_refs_release", (PyCFunction)(void (*)(void))load_refs_release, METH_FASTCALL, NULL},
    {"kv_score", (PyCFunction)(void (*)(void))kv_score, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static int add_pick11(PyObject *mod) {
    STR_WORKER = PyUnicode_InternFromString("worker");
    STR_INSTANCE_ID = PyUnicode_InternFromString("instance_id");
    STR_BLOCK_SIZE = PyUnicode_InternFromString("kv_block_size");
    STR_CAPACITY = PyUnicode_InternFromString("capacity");
    STR_KV_BLOCKS = PyUnicode_InternFromString("kv_blocks");
    STR_CAND_PREFILL = PyUnicode_InternFromString("prefill_tokens");
    STR_CAND_ACTIVE = PyUnicode_InternFromString("active_blocks");
    STR_SOURCE = PyUnicode_InternFromString("source");
    STR_COUNT = PyUnicode_InternFromString("count");
    STR_CAP = PyUnicode_InternFromString("capacity");
    STR_PARTS = PyUnicode_InternFromString("parts");
    STR_SUM_N = PyUnicode_InternFromString("n");
    STR_SUM_OBSERVED = PyUnicode_InternFromString("observed");
    STR_SUM_MODELLED = PyUnicode_InternFromString("modelled");
    STR_SUM_FLOOR = PyUnicode_InternFromString("floor");
    if (STR_WORKER == NULL || STR_INSTANCE_ID == NULL || STR_BLOCK_SIZE == NULL || STR_CAPACITY == NULL ||
        STR_KV_BLOCKS == NULL || STR_CAND_PREFILL == NULL || STR_CAND_ACTIVE == NULL || STR_SOURCE == NULL ||
        STR_COUNT == NULL || STR_CAP == NULL || STR_PARTS == NULL || STR_SUM_N == NULL || STR_SUM_OBSERVED == NULL ||
        STR_SUM_MODELLED == NULL || STR_SUM_FLOOR == NULL)
        return -1;
    return PyModule_AddFunctions(mod, pick11_methods);
}

/* ==== kv-aware's whole decision in one call (infera/router/kv_evict.py, KvEvictPolicy.score_workers; helper pick14) ==
 *
 * kv_decide(policy, ctx, workers, cfg) -> (costs, overlaps, reason) | None
 * KvEvictPolicy.score followed by KvTtftPolicy.score's plain C path (kv_score) for the default kv-aware policy, from the
 * worker records instead of Candidate objects: per worker its load (``prefill_tokens``, ``active_blocks``) and cache
 * (``held``) read first, then the policy clock, the decision count and the shadows' prune, the previous decision's
 * recency touch (_place_previous, _touch: the workers ``holding`` its last block, per block size of the candidates'
 * set in its iteration order), the recency arguments, the overlap walk per block size (a clock reading each), the
 * speed scales (``ttft_samples``, the kept sums, ``refresh`` for a worker with new samples, kv_scales), the terms,
 * the stay floor and the costs, the reason (_scores) and the pending decision: the same calls in the same order,
 * the same doubles (terms_of, recency_touch, kv_scales are the functions the old path calls).
 * ``cfg`` (built once by the policy, see KvEvictPolicy._decide_cfg): (clock, held, holding, block_count,
 * overlaps_and_confirmed, ttft_samples, prefill_tokens, active_blocks, decoding, refresh, recency, new_shadow, scales,
 * confirmed_best, prune, weight, horizon, eviction, occupancy, margin, floor_mode, min_samples, dead_band,
 * max_relative, reuse_ema, prune_every, cells, tables, sums_fallback): the last three None, or the tracker's cells,
 * the index's worker tables and KvTtftPolicy._sum_window, read in C (csrc/decide16.c) instead of calling the
 * tracker's and the index's methods and _refresh for a worker with kept sums (helper pick16); then parts, None or
 * the index's tables (PrefixIndex.decide_parts), from which holding() and overlaps_and_confirmed()'s one walk are
 * done in C (csrc/decide17.c, helper place17); then RoutingContext, whose instances' hashes() it reads from their
 * ``_hashes`` where they are kept (decide17.c); then facts, None or the policy's list in which the workers' record
 * values are kept per candidates' list (csrc/decide20.c, helper pick20). The policy's attributes _now, _decisions,
 * _pending, _log_tau, _recency_args and stay_added are read and set as the Python sets them. None, before anything else is read or
 * changed, when there is no worker or a worker holds blocks below the device (cached_credit's fractional credit):
 * the caller takes the candidates' path. */

enum { DC_CLOCK, DC_HELD, DC_HOLDING, DC_BLOCK_COUNT, DC_OVERLAPS, DC_TTFT_SAMPLES, DC_PREFILL, DC_ACTIVE, DC_DECODING,
       DC_REFRESH, DC_RECENCY, DC_NEW_SHADOW, DC_SCALES, DC_BEST, DC_PRUNE, DC_WEIGHT, DC_HORIZON, DC_EVICTION,
       DC_OCCUPANCY, DC_MARGIN, DC_FLOOR_MODE, DC_MIN_SAMPLES, DC_DEAD_BAND, DC_MAX_RELATIVE, DC_REUSE_EMA,
       DC_PRUNE_EVERY, DC_CELLS, DC_TABLES, DC_SUMS_FALLBACK, DC_PARTS, DC_CTX_TYPE, DC_FACTS, DC_N };

/* the tracker's and the index's reads from their cells and tables (csrc/decide16.c, helper pick16) */
static int d16_load(PyObject *cells, PyObject *wid, long long *queued, long long *active);
static int d16_decoding(PyObject *cells, PyObject *wid, long long *out);
static PyObject *d16_samples(PyObject *cells, PyObject *wid);
static int d16_held(PyObject *tables, PyObject *wid, long long *cached, int *lower);
static int d16_refresh(PyObject *cells, PyObject *fallback, PyObject *sums, PyObject *wid, PyObject *samples,
                       PyObject *count, long long capacity);
static int add_decide16(void);
/* the index's holding() and overlaps_and_confirmed() from its tables (csrc/decide17.c, helper place17) */
static PyObject **d17_parts(PyObject *parts);
static PyObject *d17_holding(PyObject **ip, PyObject *block, PyObject *now);
static PyObject *d17_overlaps(PyObject **ip, PyObject *hashes, PyObject *t);
static PyObject *d17_hashes(PyObject *ctx, PyObject *size, PyObject *ctx_type);
static int add_decide17(void);
/* the workers' record values kept per candidates' list (csrc/decide20.c, helper pick20) */
typedef struct {
    PyObject *worker, *wid, *size_obj;  /* borrowed: the kept ``refs`` hold them */
    long long size, capacity;
} D20Fact;
static const D20Fact *d20_facts(PyObject *facts, PyObject *workers);
static int add_decide20(void);

static PyObject *STR_D_NOW, *STR_D_DECISIONS, *STR_D_PENDING, *STR_D_LOG_TAU, *STR_D_RECENCY_ARGS, *STR_D_STAY_ADDED,
    *STR_D_HASHES, *STR_D_COUNT, *STR_D_NO_HIT, *STR_D_CACHE_HIT, *STR_D_LOAD, *STR_D_PROMPT_TOKENS, *STR_D_MAX_TOKENS;

typedef struct {
    PyObject *wid, *size_obj;  /* new references */
    long long size, capacity, queued, active, cached, decoding, overlap;
    double t[8], sum;
    int short_;
} DecideCand;

static PyObject *call1(PyObject *f, PyObject *a) { return PyObject_CallOneArg(f, a); }

static PyObject *call2(PyObject *f, PyObject *a, PyObject *b) {
    PyObject *args[2] = {a, b};
    return PyObject_Vectorcall(f, args, 2, NULL);
}

static int ll_of(PyObject *o, long long *out) {  /* steals o */
    if (o == NULL) return -1;
    *out = PyLong_AsLongLong(o);
    Py_DECREF(o);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* _place_previous + _touch for one block size: the workers holding ``hashes``' last block touch their shadow */
static NO_FMA int decide_touch(PyObject *policy, PyObject **cfg, PyObject *hashes, PyObject *when_obj, PyObject *now) {
    Py_ssize_t n = PyObject_Size(hashes);
    if (n <= 0) return n < 0 ? -1 : 0;  /* a prompt without a full block touches nothing */
    PyObject *last = PySequence_GetItem(hashes, n - 1);
    if (last == NULL) return -1;
    PyObject **ip = cfg[DC_PARTS] != Py_None ? d17_parts(cfg[DC_PARTS]) : NULL;
    PyObject *wids = ip != NULL ? d17_holding(ip, last, now)
                     : PyErr_Occurred() ? NULL : call2(cfg[DC_HOLDING], last, now);
    Py_DECREF(last);
    if (wids == NULL) return -1;
    if (!PyList_Check(wids)) {
        Py_DECREF(wids);
        PyErr_SetString(PyExc_TypeError, "kv_decide: holding() answers a list");
        return -1;
    }
    double when = PyFloat_AsDouble(when_obj);
    if (when == -1.0 && PyErr_Occurred()) {
        Py_DECREF(wids);
        return -1;
    }
    int rc = -1;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(wids); k++) {
        PyObject *wid = PyList_GET_ITEM(wids, k);
        PyObject *shadow = PyDict_GetItemWithError(cfg[DC_RECENCY], wid);
        if (shadow == NULL) {
            if (PyErr_Occurred()) goto done;
            shadow = PyObject_CallNoArgs(cfg[DC_NEW_SHADOW]);
            if (shadow == NULL) goto done;
            int r = PyDict_SetItem(cfg[DC_RECENCY], wid, shadow);
            Py_DECREF(shadow);  /* the dict holds it */
            if (r < 0) goto done;
        }
        long long count;
        if (cfg[DC_TABLES] != Py_None ? d16_held(cfg[DC_TABLES], wid, &count, NULL) < 0
                                      : ll_of(call1(cfg[DC_BLOCK_COUNT], wid), &count) < 0)
            goto done;
        PyObject *limit = PyLong_FromLongLong(count > (long long)n ? count : (long long)n);
        if (limit == NULL) goto done;
        PyObject *targs[4] = {shadow, hashes, when_obj, limit};
        PyObject *got = recency_touch(NULL, targs, 4);
        Py_DECREF(limit);
        if (got == NULL) goto done;
        double oldest = PyFloat_AsDouble(got);
        Py_DECREF(got);
        if (oldest < when) {  /* one sample per request: the age of its prefix's last use here */
            double x = log(when - oldest);
            PyObject *had = PyObject_GetAttr(policy, STR_D_LOG_TAU);
            if (had == NULL) goto done;
            double tau = x;
            if (had != Py_None) {
                double prev = PyFloat_AsDouble(had);
                if (prev == -1.0 && PyErr_Occurred()) {
                    Py_DECREF(had);
                    goto done;
                }
                double ema = PyFloat_AsDouble(cfg[DC_REUSE_EMA]);
                tau = prev + ema * (x - prev);
            }
            Py_DECREF(had);
            PyObject *f = PyFloat_FromDouble(tau);
            if (f == NULL) goto done;
            int r = PyObject_SetAttr(policy, STR_D_LOG_TAU, f);
            Py_DECREF(f);
            if (r < 0) goto done;
        }
    }
    rc = 0;
done:
    Py_DECREF(wids);
    return rc;
}

static NO_FMA PyObject *kv_decide(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "kv_decide takes 4 arguments");
        return NULL;
    }
    PyObject *policy = args[0], *ctx = args[1], *workers = args[2];
    if (!PyList_Check(workers) || !PyTuple_Check(args[3]) || PyTuple_GET_SIZE(args[3]) != DC_N) {
        PyErr_SetString(PyExc_TypeError, "kv_decide: workers is a list, cfg the policy's tuple");
        return NULL;
    }
    PyObject **cfg = &PyTuple_GET_ITEM(args[3], 0);
    if (!PyDict_Check(cfg[DC_RECENCY]) || !PyDict_Check(cfg[DC_SCALES]) || !PyDict_Check(cfg[DC_BEST])) {
        PyErr_SetString(PyExc_TypeError, "kv_decide: recency, scales and best are dicts");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(workers);
    if (n == 0) Py_RETURN_NONE;
    long long margin = PyLong_AsLongLong(cfg[DC_MARGIN]), floor_mode = PyLong_AsLongLong(cfg[DC_FLOOR_MODE]);
    long long prune_every = PyLong_AsLongLong(cfg[DC_PRUNE_EVERY]);
    double weight = PyFloat_AsDouble(cfg[DC_WEIGHT]), horizon_w = PyFloat_AsDouble(cfg[DC_HORIZON]);
    double eviction_w = PyFloat_AsDouble(cfg[DC_EVICTION]), occupancy_w = PyFloat_AsDouble(cfg[DC_OCCUPANCY]);
    if (PyErr_Occurred()) return NULL;
    if (prune_every <= 0) {
        PyErr_SetString(PyExc_ValueError, "kv_decide: prune_every must be positive");
        return NULL;
    }
    DecideCand *cs = PyMem_Calloc((size_t)n, sizeof(DecideCand));
    double *stay = PyMem_Calloc((size_t)n, sizeof(double));
    if (cs == NULL || stay == NULL) {
        PyMem_Free(cs);
        PyMem_Free(stay);
        return PyErr_NoMemory();
    }
    PyObject *out = NULL, *now = NULL, *by_size = NULL, *overlaps = NULL, *sums = NULL, *scales = NULL;
    PyObject *costs = NULL, *added = NULL, *log_tau = NULL;
    /* the records' values, kept per candidates' list (csrc/decide20.c) or read now */
    const D20Fact *facts = cfg[DC_FACTS] != Py_None ? d20_facts(cfg[DC_FACTS], workers) : NULL;
    if (facts == NULL && PyErr_Occurred()) goto done;
    /* the candidates' reads (Picker._candidates' and the terms' held): nothing here changes them */
    for (Py_ssize_t i = 0; i < n; i++) {
        DecideCand *c = &cs[i];
        if (facts != NULL) {
            c->wid = Py_NewRef(facts[i].wid);
            c->size_obj = Py_NewRef(facts[i].size_obj);
            c->size = facts[i].size;
            c->capacity = facts[i].capacity;
        } else {
            PyObject *worker = PyList_GET_ITEM(workers, i), *cap;
            c->wid = PyObject_GetAttr(worker, STR_INSTANCE_ID);
            c->size_obj = c->wid ? PyObject_GetAttr(worker, STR_BLOCK_SIZE) : NULL;
            cap = c->size_obj ? PyObject_GetAttr(worker, STR_CAPACITY) : NULL;
            if (cap == NULL) goto done;
            int bad = attr_ll(cap, STR_KV_BLOCKS, &c->capacity) < 0;
            Py_DECREF(cap);
            c->size = bad ? 0 : PyLong_AsLongLong(c->size_obj);
            if (bad || (c->size == -1 && PyErr_Occurred())) goto done;
            if (c->size <= 0) {
                PyErr_SetString(PyExc_ValueError, "kv_decide: the block size must be positive");
                goto done;
            }
        }
        if (cfg[DC_CELLS] != Py_None) {
            if (d16_load(cfg[DC_CELLS], c->wid, &c->queued, &c->active) < 0) goto done;
        } else if (ll_of(call1(cfg[DC_PREFILL], c->wid), &c->queued) < 0 ||
                   ll_of(call1(cfg[DC_ACTIVE], c->wid), &c->active) < 0) {
            goto done;
        }
        if (cfg[DC_TABLES] != Py_None) {
            int lower;
            if (d16_held(cfg[DC_TABLES], c->wid, &c->cached, &lower) < 0) goto done;
            if (lower) {  /* a credit may be fractional: the candidates' path, nothing done yet */
                out = Py_None;
                Py_INCREF(out);
                goto done;
            }
            continue;
        }
        PyObject *h = call1(cfg[DC_HELD], c->wid);  /* (cached blocks, any held only below the device) */
        if (h == NULL) goto done;
        if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) != 2) {
            Py_DECREF(h);
            PyErr_SetString(PyExc_TypeError, "kv_decide: held() answers (count, lower)");
            goto done;
        }
        c->cached = PyLong_AsLongLong(PyTuple_GET_ITEM(h, 0));
        int lower = c->cached == -1 && PyErr_Occurred() ? -1 : PyObject_IsTrue(PyTuple_GET_ITEM(h, 1));
        Py_DECREF(h);
        if (lower < 0) goto done;
        if (lower) {  /* a credit may be fractional: the candidates' path, nothing done yet */
            out = Py_None;
            Py_INCREF(out);
            goto done;
        }
    }
    /* KvEvictPolicy.score: the clock, the decision count, the prune */
    now = PyObject_CallNoArgs(cfg[DC_CLOCK]);
    if (now == NULL || PyObject_SetAttr(policy, STR_D_NOW, now) < 0) goto done;
    long long decisions;
    if (ll_of(PyObject_GetAttr(policy, STR_D_DECISIONS), &decisions) < 0) goto done;
    decisions++;
    {
        PyObject *d = PyLong_FromLongLong(decisions);
        if (d == NULL) goto done;
        int r = PyObject_SetAttr(policy, STR_D_DECISIONS, d);
        Py_DECREF(d);
        if (r < 0) goto done;
    }
    if (decisions % prune_every == 0) {
        PyObject *r = PyObject_CallNoArgs(cfg[DC_PRUNE]);
        if (r == NULL) goto done;
        Py_DECREF(r);
    }
    {  /* _place_previous */
        PyObject *pending = PyObject_GetAttr(policy, STR_D_PENDING);
        if (pending == NULL) goto done;
        if (pending != Py_None) {
            if (!PyTuple_Check(pending) || PyTuple_GET_SIZE(pending) != 2 ||
                PyObject_SetAttr(policy, STR_D_PENDING, Py_None) < 0) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "kv_decide: _pending is (ctx, when)");
                Py_DECREF(pending);
                goto done;
            }
            PyObject *sizes = PySet_New(NULL), *it = NULL, *size;
            int fail = sizes == NULL;
            for (Py_ssize_t i = 0; i < n && !fail; i++) fail = PySet_Add(sizes, cs[i].size_obj) < 0;
            it = fail ? NULL : PyObject_GetIter(sizes);
            fail = it == NULL;
            while (!fail && (size = PyIter_Next(it)) != NULL) {
                PyObject *hashes = d17_hashes(PyTuple_GET_ITEM(pending, 0), size, cfg[DC_CTX_TYPE]);
                Py_DECREF(size);
                if (hashes == NULL) {
                    fail = 1;
                    break;
                }
                fail = decide_touch(policy, cfg, hashes, PyTuple_GET_ITEM(pending, 1), now) < 0;
                Py_DECREF(hashes);
            }
            fail = fail || PyErr_Occurred();
            Py_XDECREF(it);
            Py_XDECREF(sizes);
            Py_DECREF(pending);
            if (fail) goto done;
        } else {
            Py_DECREF(pending);
        }
    }
    /* the recency arguments: (shadows, tau, now) once a reuse was seen */
    log_tau = PyObject_GetAttr(policy, STR_D_LOG_TAU);
    if (log_tau == NULL) goto done;
    PyObject *shadows = NULL;
    double tau = 0.0, now_d = 0.0;
    {
        PyObject *recency_args = Py_None;
        Py_INCREF(recency_args);
        if (log_tau != Py_None) {
            double lt = PyFloat_AsDouble(log_tau);
            if (lt == -1.0 && PyErr_Occurred()) {
                Py_DECREF(recency_args);
                goto done;
            }
            tau = exp(lt);
            now_d = PyFloat_AsDouble(now);
            if (now_d == -1.0 && PyErr_Occurred()) {
                Py_DECREF(recency_args);
                goto done;
            }
            shadows = cfg[DC_RECENCY];
            Py_DECREF(recency_args);
            recency_args = Py_BuildValue("(OdO)", shadows, tau, now);
            if (recency_args == NULL) goto done;
        }
        int r = PyObject_SetAttr(policy, STR_D_RECENCY_ARGS, recency_args);
        Py_DECREF(recency_args);
        if (r < 0) goto done;
    }
    /* KvTtftPolicy.score: the overlaps, one walk per block size (a clock reading each) */
    PyDict_Clear(cfg[DC_BEST]);
    by_size = PyDict_New();
    overlaps = by_size ? PyList_New(n) : NULL;
    if (overlaps == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *found = PyDict_GetItemWithError(by_size, cs[i].size_obj);
        if (found == NULL) {
            if (PyErr_Occurred()) goto done;
            PyObject *t = PyObject_CallNoArgs(cfg[DC_CLOCK]);
            PyObject *hashes = t ? d17_hashes(ctx, cs[i].size_obj, cfg[DC_CTX_TYPE]) : NULL;
            PyObject **ip = hashes && cfg[DC_PARTS] != Py_None ? d17_parts(cfg[DC_PARTS]) : NULL;
            PyObject *both = ip != NULL ? d17_overlaps(ip, hashes, t) : NULL;
            if (both == NULL && hashes != NULL && !PyErr_Occurred()) both = call2(cfg[DC_OVERLAPS], hashes, t);
            Py_XDECREF(t);
            Py_XDECREF(hashes);
            if (both == NULL) goto done;
            if (!PyTuple_Check(both) || PyTuple_GET_SIZE(both) != 2 || !PyDict_Check(PyTuple_GET_ITEM(both, 0))) {
                Py_DECREF(both);
                PyErr_SetString(PyExc_TypeError, "kv_decide: overlaps_and_confirmed answers (dict, int)");
                goto done;
            }
            found = PyTuple_GET_ITEM(both, 0);
            int r = PyDict_GET_SIZE(found) ? PyDict_SetItem(cfg[DC_BEST], cs[i].size_obj, PyTuple_GET_ITEM(both, 1))
                                           : 0;
            if (r == 0) r = PyDict_SetItem(by_size, cs[i].size_obj, found);
            Py_DECREF(both);  /* by_size holds found */
            if (r < 0) goto done;
        }
        PyObject *o = PyDict_GetItemWithError(found, cs[i].wid);
        if (o == NULL && PyErr_Occurred()) goto done;
        if (o == NULL) o = ZERO;
        cs[i].overlap = PyLong_AsLongLong(o);
        if (cs[i].overlap == -1 && PyErr_Occurred()) goto done;
        Py_INCREF(o);
        PyList_SET_ITEM(overlaps, i, o);
    }
    /* _relative_scales: the kept sums, refreshed for a worker with new samples, then kv_scales */
    sums = PyList_New(n);
    if (sums == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *got = cfg[DC_CELLS] != Py_None ? d16_samples(cfg[DC_CELLS], cs[i].wid)
                                                 : call1(cfg[DC_TTFT_SAMPLES], cs[i].wid);
        if (got == NULL) goto done;
        if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 2) {
            Py_DECREF(got);
            PyErr_SetString(PyExc_TypeError, "kv_decide: ttft_samples() answers (count, samples)");
            goto done;
        }
        PyObject *count = PyTuple_GET_ITEM(got, 0), *x = PyDict_GetItemWithError(cfg[DC_SCALES], cs[i].wid);
        int same = 0;
        if (x == NULL && PyErr_Occurred()) {
            Py_DECREF(got);
            goto done;
        }
        if (x != NULL) {
            PyObject *kept = PyObject_GetAttr(x, STR_D_COUNT);
            same = kept == NULL ? -1 : PyObject_RichCompareBool(kept, count, Py_EQ);
            Py_XDECREF(kept);
            if (same < 0) {
                Py_DECREF(got);
                goto done;
            }
        }
        if (same) {
            Py_INCREF(x);
        } else if (x != NULL && cfg[DC_CELLS] != Py_None && cfg[DC_SUMS_FALLBACK] != Py_None) {  /* _refresh of kept sums, its C branch */
            Py_INCREF(x);
            if (d16_refresh(cfg[DC_CELLS], cfg[DC_SUMS_FALLBACK], x, cs[i].wid, PyTuple_GET_ITEM(got, 1), count,
                            cs[i].capacity) < 0)
                Py_CLEAR(x);
        } else {
            PyObject *rargs[4] = {PyList_GET_ITEM(workers, i), cs[i].wid, count, PyTuple_GET_ITEM(got, 1)};
            x = PyObject_Vectorcall(cfg[DC_REFRESH], rargs, 4, NULL);
        }
        Py_DECREF(got);
        if (x == NULL) goto done;
        PyList_SET_ITEM(sums, i, x);
    }
    {
        PyObject *sargs[4] = {sums, cfg[DC_MIN_SAMPLES], cfg[DC_DEAD_BAND], cfg[DC_MAX_RELATIVE]};
        scales = kv_scales(NULL, sargs, 4);
        if (scales == NULL) goto done;
    }
    /* kv_score: the terms, their sums, the stay floor, the costs */
    long long prompt_tokens, max_tokens;
    if (attr_ll(ctx, STR_D_PROMPT_TOKENS, &prompt_tokens) < 0 || attr_ll(ctx, STR_D_MAX_TOKENS, &max_tokens) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        DecideCand *c = &cs[i];
        if (cfg[DC_CELLS] != Py_None ? d16_decoding(cfg[DC_CELLS], c->wid, &c->decoding) < 0
                                     : ll_of(call1(cfg[DC_DECODING], c->wid), &c->decoding) < 0)
            goto done;
        U64Map *shadow = NULL;
        if (shadows != NULL) {
            PyObject *sh = PyDict_GetItemWithError(shadows, c->wid);
            if (sh == NULL && PyErr_Occurred()) goto done;
            if (sh != NULL && sh != Py_None) {
                if (!IS_MAP(sh) || ((U64Map *)sh)->objvals) {
                    PyErr_SetString(PyExc_TypeError, "kv_decide: a shadow is a U64Map(False)");
                    goto done;
                }
                shadow = (U64Map *)sh;
            }
        }
        /* no block below the device (checked above): the credit is the overlap itself */
        terms_of(c->t, prompt_tokens, (double)c->overlap, c->size, c->queued, c->active, c->decoding, c->capacity,
                 max_tokens, weight, horizon_w, eviction_w, c->cached, occupancy_w, shadow, tau, now_d);
        double sum = 0.0;  /* sum(t): 0 + t[0] is t[0], then in order */
        for (int k = 0; k < 8; k++) sum += c->t[k];
        c->sum = sum;
    }
    if (floor_mode && PyDict_GET_SIZE(cfg[DC_BEST]) > 0) {  /* _floor: the holders' least decode terms and batch */
        long long holders = 0, held_dec = 0;
        double floor = 0.0;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *w = PyDict_GetItemWithError(cfg[DC_BEST], cs[i].size_obj);
            long long wanted = 0;
            if (w == NULL ? PyErr_Occurred() != NULL : ((wanted = PyLong_AsLongLong(w)) == -1 && PyErr_Occurred()))
                goto done;
            cs[i].short_ = cs[i].overlap < wanted;
            if (cs[i].overlap < wanted || wanted <= 0) continue;
            double part = floor_mode == 2 ? cs[i].t[3] : cs[i].t[1] + cs[i].t[3];
            if (!holders || part < floor) floor = part;
            if (!holders || cs[i].decoding < held_dec) held_dec = cs[i].decoding;
            holders++;
        }
        for (Py_ssize_t i = 0; holders && i < n; i++) {
            if (!cs[i].short_) continue;
            if (margin && held_dec - cs[i].decoding >= margin) continue;
            double mine = floor_mode == 2 ? cs[i].t[3] : cs[i].t[1] + cs[i].t[3];
            if (mine < floor) {
                cs[i].sum += floor - mine;
                stay[i] = floor - mine;
            }
        }
    }
    added = PyList_New(n);
    costs = added ? PyList_New(n) : NULL;
    if (costs == NULL) goto done;
    long long best_overlap = 0;
    Py_ssize_t low = 0;
    double low_cost = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double scale = PyFloat_AsDouble(PyList_GET_ITEM(scales, i));
        if (scale == -1.0 && PyErr_Occurred()) goto done;
        double cost = scale * cs[i].sum;
        PyObject *f = PyFloat_FromDouble(cost), *a = f ? PyFloat_FromDouble(stay[i]) : NULL;
        if (a == NULL) {
            Py_XDECREF(f);
            goto done;
        }
        PyList_SET_ITEM(costs, i, f);
        PyList_SET_ITEM(added, i, a);
        if (cs[i].overlap > best_overlap) best_overlap = cs[i].overlap;  /* max(overlaps, default=0): all >= 0 */
        if (i == 0 || cost < low_cost) {  /* min(costs): the first of the least, by < */
            low = i;
            low_cost = cost;
        }
    }
    /* _scores: costs.index(min(costs)) is the first cost equal to the least (or the least itself: a NaN) */
    Py_ssize_t cheapest = low;
    for (Py_ssize_t i = 0; i < low; i++) {
        if (PyFloat_AS_DOUBLE(PyList_GET_ITEM(costs, i)) == low_cost) {
            cheapest = i;
            break;
        }
    }
    PyObject *reason = best_overlap <= 0 ? STR_D_NO_HIT
                       : cs[cheapest].overlap == best_overlap ? STR_D_CACHE_HIT : STR_D_LOAD;
    if (PyObject_SetAttr(policy, STR_D_STAY_ADDED, added) < 0) goto done;
    {
        PyObject *pending = PyTuple_Pack(2, ctx, now);
        if (pending == NULL) goto done;
        int r = PyObject_SetAttr(policy, STR_D_PENDING, pending);
        Py_DECREF(pending);
        if (r < 0) goto done;
    }
    out = PyTuple_Pack(3, costs, overlaps, reason);
done:
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(cs[i].wid);
        Py_XDECREF(cs[i].size_obj);
    }
    PyMem_Free(cs);
    PyMem_Free(stay);
    Py_XDECREF(now);
    Py_XDECREF(by_size);
    Py_XDECREF(overlaps);
    Py_XDECREF(sums);
    Py_XDECREF(scales);
    Py_XDECREF(costs);
    Py_XDECREF(added);
    Py_XDECREF(log_tau);
    return out;
}

static PyMethodDef pick14_methods[] = {
    {"kv_decide", (PyCFunction)(void (*)(void))kv_decide, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static int add_pick14(PyObject *mod) {
    PyObject **names[] = {&STR_D_NOW, &STR_D_DECISIONS, &STR_D_PENDING, &STR_D_LOG_TAU, &STR_D_RECENCY_ARGS,
                          &STR_D_STAY_ADDED, &STR_D_HASHES, &STR_D_COUNT, &STR_D_NO_HIT, &STR_D_CACHE_HIT, &STR_D_LOAD,
                          &STR_D_PROMPT_TOKENS, &STR_D_MAX_TOKENS};
    const char *text[] = {"_now", "_decisions", "_pending", "_log_tau", "_recency_args", "stay_added", "hashes",
                          "count", "no-hit", "cache-hit", "load", "prompt_tokens", "max_tokens"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        *names[k] = PyUnicode_InternFromString(text[k]);
        if (*names[k] == NULL) return -1;
    }
    if (add_decide16() < 0 || add_decide17() < 0 || add_decide20() < 0) return -1;
    return PyModule_AddFunctions(mod, pick14_methods);
}

#include "prompt_cache.c"
#include "store_u64.c"
#include "index_payload.c"
#include "load.c"
#include "index_clear.c"
#include "decide16.c"
#include "decide17.c"
#include "decide20.c"
#include "hold18.c"
#include "zmq_drain.c"
#include "zmtp_drain.c"
#include "ready_bound.c"
#include "splice.c"
#include "headers.c"
