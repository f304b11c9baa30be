/* ==== One KV-event batch from its msgpack payload into the index (infera/kv/index.py PrefixIndex.apply_payload) ====
 *
 * Included by index.c (it uses its tables and loops). ``decode_batch`` + ``PrefixIndex.apply`` cost ~10 µs a batch,
 * half of it msgspec's walk and the event objects; this reads the payload in place and applies it in one call.
 *
 * It takes only a strict subset of what ``decode_batch`` takes: vLLM 0.32's form as its fast decoder reads it (the
 * batch an array of 2 or 3, each event a map with "type" first), BlockStored on "GPU" and BlockRemoved only, every
 * field known, once, of the type the fast decoder checks (strings ASCII, no maps or ext inside ``extra_keys`` or the
 * dp rank), token ids all ints in [0, 2**32), nothing after the batch; and only for a worker with no block in other
 * tiers (``media`` empty: the store and removal loops then never stop for Python's tier logic). Anything else is
 * declined (None) before any table changes, and the caller decodes and applies the batch the general way. So the
 * whole payload is read and checked first (phase 1), then applied (phase 2), which cannot meet malformed data. */

typedef struct {
    const unsigned char *p, *end;
} Rd;

/* Any msgpack int: 1 with *u its bits and *neg set for a negative value; 0: not an int (nothing read). */
static inline int rd_int(Rd *r, uint64_t *u, int *neg) { return msgpack_int(&r->p, r->end, u, neg); }

/* A non-negative int (an unsigned 64-bit hash): 1, or 0 for anything else. */
static inline int rd_u64(Rd *r, uint64_t *u) {
    const unsigned char *q = r->p;
    int neg;
    if (!rd_int(r, u, &neg)) return 0;
    if (neg) {
        r->p = q;
        return 0;
    }
    return 1;
}

static inline int rd_nil(Rd *r) {
    if (r->p < r->end && *r->p == 0xc0) {
        r->p++;
        return 1;
    }
    return 0;
}

/* A length of ``w`` big-endian bytes after the head byte: 1, or 0 if cut short. */
static inline int rd_len(Rd *r, size_t w, size_t *n) {
    if ((size_t)(r->end - r->p) < w) return 0;
    size_t v = 0;
    for (size_t k = 0; k < w; k++) v = (v << 8) | r->p[k];
    r->p += w;
    *n = v;
    return 1;
}

static int rd_array(Rd *r, size_t *n) {
    if (r->p >= r->end) return 0;
    unsigned char c = *r->p;
    if ((c & 0xf0) == 0x90) {
        r->p++;
        *n = c & 0x0f;
        return 1;
    }
    if (c != 0xdc && c != 0xdd) return 0;
    r->p++;
    return rd_len(r, c == 0xdc ? 2 : 4, n) && *n <= (size_t)(r->end - r->p);
}

static int rd_map(Rd *r, size_t *n) {
    if (r->p >= r->end) return 0;
    unsigned char c = *r->p;
    if ((c & 0xf0) == 0x80) {
        r->p++;
        *n = c & 0x0f;
        return 1;
    }
    if (c != 0xde && c != 0xdf) return 0;
    r->p++;
    return rd_len(r, c == 0xde ? 2 : 4, n) && *n <= (size_t)(r->end - r->p);
}

/* An ASCII str (valid UTF-8 whatever the decoder): 1 with *s, *n; 0 for anything else. */
static int rd_str(Rd *r, const unsigned char **s, size_t *n) {
    const unsigned char *q = r->p;
    if (q >= r->end) return 0;
    unsigned char c = *q;
    r->p++;
    if ((c & 0xe0) == 0xa0) *n = c & 0x1f;
    else if (c < 0xd9 || c > 0xdb || !rd_len(r, c == 0xd9 ? 1 : c == 0xda ? 2 : 4, n)) goto no;
    if (*n > (size_t)(r->end - r->p)) goto no;
    for (size_t k = 0; k < *n; k++)
        if (r->p[k] & 0x80) goto no;
    *s = r->p;
    r->p += *n;
    return 1;
no:
    r->p = q;
    return 0;
}

static inline int rd_opt_str(Rd *r) {
    const unsigned char *s;
    size_t n;
    return rd_nil(r) || rd_str(r, &s, &n);
}

static inline int rd_opt_int(Rd *r) {
    uint64_t u;
    int neg;
    return rd_nil(r) || rd_int(r, &u, &neg);
}

/* One value as msgspec decodes ``Any``, of the kinds taken here: nil, bool, int, float, ASCII str, bin, arrays of
 * these (``depth`` levels at most). 0: anything else (maps, ext, other text), or cut short. */
static int rd_any(Rd *r, int depth) {
    if (r->p >= r->end) return 0;
    unsigned char c = *r->p;
    uint64_t u;
    int neg;
    size_t n;
    if (c == 0xc0 || c == 0xc2 || c == 0xc3) {
        r->p++;
        return 1;
    }
    if (rd_int(r, &u, &neg)) return 1;
    if (c == 0xca || c == 0xcb) {
        size_t w = c == 0xca ? 4 : 8;
        if ((size_t)(r->end - r->p) < w + 1) return 0;
        r->p += w + 1;
        return 1;
    }
    if (c == 0xc4 || c == 0xc5 || c == 0xc6) {
        r->p++;
        if (!rd_len(r, c == 0xc4 ? 1 : c == 0xc5 ? 2 : 4, &n) || n > (size_t)(r->end - r->p)) return 0;
        r->p += n;
        return 1;
    }
    const unsigned char *s;
    if (rd_str(r, &s, &n)) return 1;
    if (depth > 0 && rd_array(r, &n)) {
        for (size_t k = 0; k < n; k++)
            if (!rd_any(r, depth - 1)) return 0;
        return 1;
    }
    return 0;
}

/* A growable array of fixed-size items, on the stack until it outgrows it. */
typedef struct {
    void *items;
    size_t len, cap, size;
    void *stack;
} Grow;

static void *grow(Grow *g, size_t more) {
    if (g->len + more > g->cap) {
        size_t cap = g->cap * 2 > g->len + more ? g->cap * 2 : g->len + more;
        void *mem = PyMem_Malloc(cap * g->size);
        if (mem == NULL) return NULL;
        memcpy(mem, g->items, g->len * g->size);
        if (g->items != g->stack) PyMem_Free(g->items);
        g->items = mem;
        g->cap = cap;
    }
    void *at = (char *)g->items + g->len * g->size;
    g->len += more;
    return at;
}

static void grow_free(Grow *g) {
    if (g->items != g->stack) PyMem_Free(g->items);
}

typedef struct {
    int stored;            /* 1: BlockStored, 0: BlockRemoved */
    size_t hashes, nh;     /* its engine hashes: [hashes, hashes + nh) of the batch's hash array */
    size_t toks, ntok;     /* a stored event's token ids in the batch's token array */
    int has_parent;
    uint64_t parent;
    Py_ssize_t bs;
} PEvent;

/* ``n`` token ids (msgpack ints in [0, 2**32)) into ``t``: 1, or 0 for anything else. The widths a tokenizer's ids
 * take inline (vLLM writes the smallest), the rest through packed_u32. */
static inline int rd_tokens(Rd *r, uint32_t *t, size_t n) {
    const unsigned char *p = r->p, *end = r->end;
    for (size_t j = 0; j < n; j++) {
        if (p >= end) return 0;
        unsigned c = *p;
        if (c <= 0x7f) {
            t[j] = c;
            p++;
        } else if (c == 0xcd && end - p >= 3) {
            t[j] = ((uint32_t)p[1] << 8) | p[2];
            p += 3;
        } else if (c == 0xce && end - p >= 5) {
            t[j] = ((uint32_t)p[1] << 24) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 8) | p[4];
            p += 5;
        } else if (c == 0xcc && end - p >= 2) {
            t[j] = p[1];
            p += 2;
        } else if (!packed_u32(&p, end, &t[j])) {
            return 0;
        }
    }
    r->p = p;
    return 1;
}

enum { F_TYPE, F_HASHES, F_PARENT, F_TOKENS, F_BS, F_LORA, F_MEDIUM, F_LORA_NAME, F_EXTRA, F_GROUP, F_KIND, F_OTHER };

static inline int field_of(const unsigned char *s, size_t n) {
    static const char *names[] = {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                                  "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"};
    static const unsigned char lens[] = {4, 12, 17, 9, 10, 7, 6, 9, 10, 9, 18};
    for (int f = 0; f < F_OTHER; f++)
        if (lens[f] == n && memcmp(names[f], s, n) == 0) return f;
    return F_OTHER;
}

#define STR_IS(s, n, lit) ((n) == sizeof(lit) - 1 && memcmp((s), (lit), (n)) == 0)

/* One event map into *ev, its hashes and token ids appended to ``hs`` and ``toks``: 1, or 0 to decline. */
static int read_event(Rd *r, PEvent *ev, Grow *hs, Grow *toks) {
    size_t nf, n;
    const unsigned char *s;
    if (!rd_map(r, &nf) || nf == 0 || !rd_str(r, &s, &n) || field_of(s, n) != F_TYPE || !rd_str(r, &s, &n)) return 0;
    if (STR_IS(s, n, "BlockStored")) ev->stored = 1;
    else if (STR_IS(s, n, "BlockRemoved")) ev->stored = 0;
    else return 0;  /* AllBlocksCleared, or a type the decoder skips: the general path */
    unsigned seen = 1u << F_TYPE;
    ev->has_parent = 0;
    for (size_t k = 1; k < nf; k++) {
        if (!rd_str(r, &s, &n)) return 0;
        int f = field_of(s, n);
        if (f == F_OTHER || seen & (1u << f)) return 0;
        if (!ev->stored && f != F_HASHES && f != F_MEDIUM && f != F_GROUP) return 0;
        seen |= 1u << f;
        uint64_t u;
        switch (f) {
            case F_HASHES:
                if (!rd_array(r, &n)) return 0;
                ev->hashes = hs->len;
                ev->nh = n;
                uint64_t *h = grow(hs, n);
                if (h == NULL) return -1;
                for (size_t j = 0; j < n; j++)
                    if (!rd_u64(r, &h[j])) return 0;
                break;
            case F_PARENT:
                if (rd_nil(r)) break;
                if (!rd_u64(r, &ev->parent)) return 0;
                ev->has_parent = 1;
                break;
            case F_TOKENS:
                if (!rd_array(r, &n)) return 0;
                ev->toks = toks->len;
                ev->ntok = n;
                uint32_t *t = grow(toks, n);
                if (t == NULL) return -1;
                if (!rd_tokens(r, t, n)) return 0;
                break;
            case F_BS: {
                int neg;
                if (!rd_int(r, &u, &neg) || neg || u == 0 || u > (1u << 30)) return 0;
                ev->bs = (Py_ssize_t)u;
                break;
            }
            case F_MEDIUM:
                if (ev->stored) {  /* the store loops' case: on the device */
                    if (!rd_str(r, &s, &n) || !STR_IS(s, n, "GPU")) return 0;
                } else if (!rd_opt_str(r)) {
                    return 0;
                }
                break;
            case F_LORA:
            case F_GROUP:
                if (!rd_opt_int(r)) return 0;
                break;
            case F_LORA_NAME:
            case F_KIND:
                if (!rd_opt_str(r)) return 0;
                break;
            case F_EXTRA:
                if (rd_nil(r)) break;
                if (!rd_array(r, &n)) return 0;
                for (size_t j = 0; j < n; j++)
                    if (!rd_any(r, 16)) return 0;
                break;
        }
    }
    unsigned need = ev->stored ? (1u << F_HASHES) | (1u << F_PARENT) | (1u << F_TOKENS) | (1u << F_BS) | (1u << F_MEDIUM)
                               : 1u << F_HASHES;
    return (seen & need) == need;
}

/* ``local``'s router hash (the worker's engine hash -> router hash table) as a new int; NULL without an error when
 * the worker does not hold ``eh``. */
static PyObject *local_of(PyObject *blocks, uint64_t eh) {
    if (IS_MAP(blocks)) {
        Py_ssize_t i = map_find((U64Map *)blocks, eh);
        return i < 0 ? NULL : map_value((U64Map *)blocks, i);
    }
    PyObject *k = PyLong_FromUnsignedLongLong(eh);
    if (k == NULL) return NULL;
    PyObject *v = tab_get_new(blocks, k);
    Py_DECREF(k);
    return v;
}

static PyObject *u64_list(const uint64_t *v, size_t n) {
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out != NULL && i < n; i++) {
        PyObject *o = PyLong_FromUnsignedLongLong(v[i]);
        if (o == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, (Py_ssize_t)i, o);
    }
    return out;
}

/* A stored event (phase 2): PrefixIndex._store's block-size check, then store_packed's work. -1 on error. */
static int apply_stored(Tables *t, const PEvent *ev, const uint64_t *hs, const uint32_t *toks, Py_ssize_t size,
                        Py_ssize_t *counts, PyObject *touched) {
    Py_ssize_t nh = (Py_ssize_t)ev->nh;
    if (size > 0 && ev->bs != size) {
        counts[4] += nh;  /* block_size_mismatch */
        return 0;
    }
    uint64_t h = 0;
    if (ev->has_parent) {
        PyObject *found = local_of(t->blocks, ev->parent);
        if (found == NULL) {
            if (PyErr_Occurred()) return -1;
            counts[2] += nh;  /* orphans: missed the parent's event */
            return 0;
        }
        h = PyLong_AsUnsignedLongLong(found);
        Py_DECREF(found);
        if (h == (uint64_t)-1 && PyErr_Occurred()) return -1;
    }
    Py_ssize_t bs = ev->bs, n = (Py_ssize_t)(ev->ntok / (size_t)bs);
    if (n > nh) n = nh;
    counts[2] += nh - n;  /* too few token ids: the tail blocks cannot be hashed */
    uint64_t stack[128];
    uint64_t *locals = n <= 128 ? stack : PyMem_Malloc(sizeof(uint64_t) * (size_t)n);
    if (locals == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    const uint32_t *tok = toks + ev->toks;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    uint32_t *buf = PyMem_Malloc(sizeof(uint32_t) * (size_t)bs);
    if (buf == NULL) {
        if (locals != stack) PyMem_Free(locals);
        PyErr_NoMemory();
        return -1;
    }
#endif
    for (Py_ssize_t b = 0; b < n; b++) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        for (Py_ssize_t j = 0; j < bs; j++) buf[j] = __builtin_bswap32(tok[b * bs + j]);
        locals[b] = h = XXH3_64bits_withSeed(buf, (size_t)bs * 4, h);
#else
        locals[b] = h = XXH3_64bits_withSeed(tok + b * bs, (size_t)bs * 4, h);
#endif
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    PyMem_Free(buf);
#endif
    if (su_takes(t)) { /* the common tables: on the u64s, no lists (csrc/store_u64.c) */
        int r = store_u64(t, hs + ev->hashes, locals, n, touched);
        if (locals != stack) PyMem_Free(locals);
        return r;
    }
    PyObject *ehs = u64_list(hs + ev->hashes, (size_t)n);
    PyObject *lo = ehs == NULL ? NULL : u64_list(locals, (size_t)n);
    if (locals != stack) PyMem_Free(locals);
    int forget = 0, r = -1;
    if (lo != NULL && store_loop(t, ehs, lo, 0, &forget) >= 0) {
        r = 0;
        if (forget) {  /* the masks of remembered walks' blocks changed: the caller's _touch(locals) */
            for (Py_ssize_t i = 0; r == 0 && i < n; i++) r = PyList_Append(touched, PyList_GET_ITEM(lo, i));
        }
    }
    Py_XDECREF(ehs);
    Py_XDECREF(lo);
    return r;
}

/* A run of removed events (phase 2, ``media`` empty): PrefixIndex._remove_run. -1 on error. */
static int apply_removed(Tables *t, const PEvent *ev, size_t nev, const uint64_t *hs, Py_ssize_t *counts,
                         PyObject *touched) {
    int alone = IS_MAP(t->blocks) && !((U64Map *)t->blocks)->objvals && IS_MAP(t->holders) &&
                ((U64Map *)t->holders)->objvals;
    int watched = PySet_GET_SIZE(t->watched) > 0, forget = 0;
    PyObject *run = watched ? PyList_New(0) : NULL;  /* the run's router hashes, for _touch */
    if (watched && run == NULL) return -1;
    counts[1] += (Py_ssize_t)nev;
    int r = 0;
    for (size_t e = 0; r == 0 && e < nev; e++) {
        for (size_t j = 0; r == 0 && j < ev[e].nh; j++) {
            uint64_t key = hs[ev[e].hashes + j];
            if (watched) {
                PyObject *local = local_of(t->blocks, key);
                if (local != NULL) {
                    r = PyList_Append(run, local);
                    Py_DECREF(local);
                } else if (PyErr_Occurred()) {
                    r = -1;
                }
                if (r < 0) break;
            }
            PyObject *eh = PyLong_FromUnsignedLongLong(key);
            if (eh == NULL) {
                r = -1;
                break;
            }
            int one = remove_one(t, eh, alone, &counts[3], &forget);
            Py_DECREF(eh);
            if (one < 0) r = -1;
            else if (one == 0) {  /* a block in other tiers: cannot happen with media empty */
                PyErr_SetString(PyExc_RuntimeError, "apply_payload: a block in other tiers");
                r = -1;
            }
        }
    }
    if (r == 0 && forget) {
        Py_ssize_t m = PyList_GET_SIZE(run);
        for (Py_ssize_t i = 0; r == 0 && i < m; i++) r = PyList_Append(touched, PyList_GET_ITEM(run, i));
    }
    Py_XDECREF(run);
    return r;
}

/* apply_payload(blocks, media, extra, lower, predicted, holders, shared, watched, guess_masks, bit, payload,
 *               block_size) -> (ts, stored, removed, orphans, unknown, mismatched, touched) | None
 * PrefixIndex.apply(worker, decode_batch(payload))'s table changes for the payloads this takes (see the top of this
 * block): ``block_size`` the index's (0: any). Returns the batch's ts, the counts to add to IndexCounters'
 * block_stored (events), block_removed (events), orphan_blocks (also the worker's), unknown_removed and
 * block_size_mismatch (blocks), and the router hashes to pass to _touch (the concatenation of every event's that
 * changed a remembered walk's mask; empty when none). None: declined, no table changed. */
/* One payload into ``t``'s tables (the worker has no block in other tiers): 1 applied, its ts in *ts, its counts
 * added to ``counts`` (stored, removed, orphans, unknown, mismatched) and its touched router hashes appended to
 * ``touched``; 0 declined, nothing changed; -1 an error set (the tables may be changed; counts and touched too). */
static int payload_apply(Tables *tp, const unsigned char *buf, Py_ssize_t len, Py_ssize_t size,
                         Py_ssize_t counts[5], PyObject *touched, double *ts_out) {
    Tables t = *tp;
    PEvent ev_stack[16];
    uint64_t hs_stack[256];
    uint32_t tok_stack[2048];
    Grow evs = {ev_stack, 0, 16, sizeof(PEvent), ev_stack};
    Grow hs = {hs_stack, 0, 256, sizeof(uint64_t), hs_stack};
    Grow toks = {tok_stack, 0, 2048, sizeof(uint32_t), tok_stack};
    int rc = -1;
    Rd r = {buf, buf + len};
    size_t nb, ne;
    double ts = 0.0;
    int ok = rd_array(&r, &nb) && (nb == 2 || nb == 3);
    if (ok) {  /* ts: a float, or an int the decoder widens to one */
        uint64_t u;
        int neg;
        const unsigned char *q = r.p;
        if (q < r.end && (*q == 0xca || *q == 0xcb)) {
            size_t w = *q == 0xca ? 4 : 8;
            if ((ok = (size_t)(r.end - q) > w)) {
                uint64_t v = 0;
                for (size_t k = 1; k <= w; k++) v = (v << 8) | q[k];
                if (w == 4) {
                    uint32_t v32 = (uint32_t)v;
                    float f;
                    memcpy(&f, &v32, 4);
                    ts = f;
                } else {
                    memcpy(&ts, &v, 8);
                }
                r.p = q + w + 1;
            }
        } else if ((ok = rd_int(&r, &u, &neg))) {
            if (neg) ts = (double)(int64_t)u;
            else if ((ok = u <= (uint64_t)INT64_MAX)) ts = (double)(int64_t)u;
        }
    }
    ok = ok && rd_array(&r, &ne);
    for (size_t i = 0; ok && i < ne; i++) {
        PEvent *ev = grow(&evs, 1);
        int got = ev == NULL ? -1 : read_event(&r, ev, &hs, &toks);
        if (got < 0) {
            if (!PyErr_Occurred()) PyErr_NoMemory();
            goto done;
        }
        ok = got;
    }
    ok = ok && (nb == 2 || rd_any(&r, 16)) && r.p == r.end;  /* the dp rank (any), then nothing */
    if (!ok) {
        rc = 0;
        goto done;
    }
    /* phase 2: apply, as PrefixIndex.apply does, event by event (a run of removals as one) */
    PEvent *e = evs.items;
    for (size_t i = 0; i < evs.len;) {
        if (e[i].stored) {
            counts[0]++;
            if (apply_stored(&t, &e[i], hs.items, toks.items, size, counts, touched) < 0) goto done;
            i++;
            continue;
        }
        size_t j = i;
        while (j < evs.len && !e[j].stored) j++;
        if (apply_removed(&t, &e[i], j - i, hs.items, counts, touched) < 0) goto done;
        i = j;
    }
    *ts_out = ts;
    rc = 1;
done:
    grow_free(&evs);
    grow_free(&hs);
    grow_free(&toks);
    return rc;
}

static PyObject *apply_payload(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Tables t;
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "apply_payload takes 12 arguments");
        return NULL;
    }
    if (tables(args, &t) < 0) return NULL;
    Py_ssize_t size = PyLong_AsSsize_t(args[11]);
    if (size == -1 && PyErr_Occurred()) return NULL;
    if (PyDict_GET_SIZE(t.media)) Py_RETURN_NONE;  /* blocks in other tiers: Python's tier logic */
    Py_buffer view;
    if (PyObject_GetBuffer(args[10], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out = NULL, *touched = PyList_New(0);
    Py_ssize_t counts[5] = {0, 0, 0, 0, 0};  /* stored, removed, orphans, unknown, mismatched */
    double ts;
    int got = touched == NULL ? -1 : payload_apply(&t, view.buf, view.len, size, counts, touched, &ts);
    if (got > 0) {
        out = Py_BuildValue("(dnnnnnO)", ts, counts[0], counts[1], counts[2], counts[3], counts[4], touched);
    } else if (got == 0) {
        out = Py_None;
        Py_INCREF(out);
    }
    Py_XDECREF(touched);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef payload_methods[] = {
    {"apply_payload", (PyCFunction)(void (*)(void))apply_payload, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static int add_payload(PyObject *mod) { return PyModule_AddFunctions(mod, payload_methods); }
