/* infera.kv._bpe: tiktoken's ``encode_ordinary`` for ASCII text, in C, for the pre-tokenizer pattern family of
 * cl100k / Llama 3 / Qwen2 (the pattern strings infera/kv/bpe.py lists; nothing else comes here).
 *
 * ``Bpe(ranks, digits, fallback).encode(text)``: ASCII text is split by a hand-written equivalent of the pattern
 * (below), each piece looked up whole in a hash table of the ranks, and a piece not in it merged by tiktoken's own
 * rule (the adjacent pair whose concatenation has the lowest rank, leftmost on ties). The stretch around a non-ASCII
 * character goes to ``fallback`` (tiktoken's ``encode_ordinary``; see encode_mixed), and all the text when the
 * vocabulary lacks a byte.
 * tests/kv/test_bpe.py checks the ids against tiktoken's on random text.
 *
 * The pattern, with ``\p{N}`` (Qwen2) or ``\p{N}{1,3}`` (cl100k, Llama 3) as its third alternative:
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * On ASCII, \p{L} is [A-Za-z], \p{N} [0-9], \s [\t\n\v\f\r ] (Unicode White_Space; not 0x1c-0x1f), and every other
 * byte is "punctuation" ([^\s\p{L}\p{N}]).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include "xxhash.h"

#define GIL_FREE_BYTES 16384 /* longer text is encoded without the GIL (tiktoken releases it too) */
#define STACK_PARTS 128      /* pieces up to this long merge in stack arrays */
#define NO_RANK UINT32_MAX

enum { K_P = 0, K_L = 1, K_N = 2, K_W = 3 };
static unsigned char kind[128];

/* ---- the ranks: an open-addressing table of byte strings --------------------------------------------- */

typedef struct {
    uint32_t off;  /* into the blob */
    uint32_t rank;
    uint32_t tag;  /* the hash's high half, compared before the bytes */
    uint32_t len;  /* 0: empty (no token is empty) */
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;  /* and the blob after them: one mapping of ``mapped`` bytes (see table_alloc) */
    uint64_t mask;
    unsigned char *blob;
    size_t mapped;
    int digits;          /* the longest run of digits one piece takes: 1 or 3 */
    PyObject *fallback;  /* str -> list[int] */
    PyObject **ints;     /* rank -> its int, made on first use (a list then holds a new reference, no allocation) */
    uint32_t n_ints;
    Py_ssize_t fallbacks;
} Bpe;

static inline uint32_t lookup_hashed(const Bpe *t, const unsigned char *p, size_t n, uint64_t h) {
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint64_t i = h & t->mask;; i = (i + 1) & t->mask) {
        const Slot *s = &t->slots[i];
        if (s->len == 0) return NO_RANK;
        if (s->tag == tag && s->len == n && memcmp(t->blob + s->off, p, n) == 0) return s->rank;
    }
}

static inline uint32_t lookup(const Bpe *t, const unsigned char *p, size_t n) {
    return lookup_hashed(t, p, n, XXH3_64bits(p, n));
}

/* ---- the pre-tokenizer: where the piece that starts at i ends ----------------------------------------- */

static inline int crlf(unsigned char c) { return c == '\r' || c == '\n'; }

static Py_ssize_t piece_end(const unsigned char *s, Py_ssize_t i, Py_ssize_t n, int digits) {
    unsigned char c = s[i];
    int k = kind[c];
    Py_ssize_t j;
    if (c == '\'' && i + 1 < n) {  /* (?i:'s|'t|'re|'ve|'m|'ll|'d); x|0x20 maps only 'S' and 's' to 's', etc. */
        unsigned char a = s[i + 1] | 0x20;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < n) {
            unsigned char b = s[i + 2] | 0x20;
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
    }
    if (k == K_L || (k != K_N && !crlf(c) && i + 1 < n && kind[s[i + 1]] == K_L)) {  /* [^\r\n\p{L}\p{N}]?\p{L}+ */
        for (j = i + 1; j < n && kind[s[j]] == K_L; j++) {}
        return j;
    }
    if (k == K_N) {  /* \p{N}{1,digits} */
        Py_ssize_t end = i + digits < n ? i + digits : n;
        for (j = i + 1; j < end && kind[s[j]] == K_N; j++) {}
        return j;
    }
    Py_ssize_t p = (c == ' ' && i + 1 < n && kind[s[i + 1]] == K_P) ? i + 1 : i;
    if (kind[s[p]] == K_P) {  /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
        for (j = p + 1; j < n && kind[s[j]] == K_P; j++) {}
        while (j < n && crlf(s[j])) j++;
        return j;
    }
    for (j = i + 1; j < n && kind[s[j]] == K_W; j++) {}  /* c is whitespace; the run is [i, j) */
    for (Py_ssize_t q = j - 1; q >= i; q--)  /* \s*[\r\n]+: up to the run's last CR or LF */
        if (crlf(s[q])) return q + 1;
    if (j == n || j - 1 == i) return j;  /* \s+(?!\S) at the end, or \s+ for one whitespace before a non-space */
    return j - 1;                        /* \s+(?!\S): all but the last */
}

/* ---- tiktoken's byte_pair_merge, then the parts' ranks ------------------------------------------------ */

static inline uint32_t pair_rank(const Bpe *t, const unsigned char *p, const size_t *start, size_t n_parts,
                                 size_t i) {
    return i + 3 < n_parts ? lookup(t, p + start[i], start[i + 3] - start[i]) : NO_RANK;
}

/* Appends the piece's ids to out; returns how many, or -1 when a part is not a token (a byte missing). */
static Py_ssize_t merge(const Bpe *t, const unsigned char *p, size_t m, uint32_t *out) {
    size_t start_stack[STACK_PARTS + 1];
    uint32_t rank_stack[STACK_PARTS + 1];
    size_t *start = start_stack;
    uint32_t *rank = rank_stack;
    if (m > STACK_PARTS) {
        start = (size_t *)malloc((m + 1) * sizeof(size_t));
        rank = (uint32_t *)malloc((m + 1) * sizeof(uint32_t));
        if (start == NULL || rank == NULL) {
            free(start);
            free(rank);
            return -2;
        }
    }
    uint32_t min_rank = NO_RANK;
    size_t min_i = 0;
    for (size_t i = 0; i + 1 < m; i++) {
        start[i] = i;
        rank[i] = lookup(t, p + i, 2);
        if (rank[i] < min_rank) {
            min_rank = rank[i];
            min_i = i;
        }
    }
    start[m - 1] = m - 1;
    rank[m - 1] = NO_RANK;
    start[m] = m;
    rank[m] = NO_RANK;
    size_t n_parts = m + 1;
    while (min_rank != NO_RANK) {
        size_t i = min_i;
        if (i > 0) rank[i - 1] = pair_rank(t, p, start, n_parts, i - 1);
        rank[i] = pair_rank(t, p, start, n_parts, i);
        memmove(start + i + 1, start + i + 2, (n_parts - i - 2) * sizeof(size_t));
        memmove(rank + i + 1, rank + i + 2, (n_parts - i - 2) * sizeof(uint32_t));
        n_parts--;
        min_rank = NO_RANK;
        for (size_t k = 0; k + 1 < n_parts; k++) {
            if (rank[k] < min_rank) {
                min_rank = rank[k];
                min_i = k;
            }
        }
    }
    Py_ssize_t n_out = 0;
    for (size_t k = 0; k + 1 < n_parts; k++) {
        uint32_t r = lookup(t, p + start[k], start[k + 1] - start[k]);
        if (r == NO_RANK) {
            n_out = -1;
            break;
        }
        out[n_out++] = r;
    }
    if (start != start_stack) {
        free(start);
        free(rank);
    }
    return n_out;
}

/* The ids of s[0:n] into out (room for n); their number, -1 to fall back, -2 out of memory.
 *
 * Pieces go in groups of PIPE: each one's slot is prefetched as it is cut, then each found slot's bytes in the
 * blob, then they are looked up. A request's fresh turn meets a cold table (~5 MB of slots and bytes, other work
 * between two requests): one after another, every piece waited for its slot's line and then its bytes' line; in
 * groups the misses overlap (bench/README.md, "Issue 15, thirteenth round ... ctx15"). The same ids. */
#define PIPE 16
static Py_ssize_t encode_ascii(const Bpe *t, const unsigned char *s, Py_ssize_t n, uint32_t *out) {
    Py_ssize_t n_out = 0;
    Py_ssize_t at[PIPE + 1];
    uint64_t hs[PIPE];
    for (Py_ssize_t i = 0; i < n;) {
        int m = 0;
        at[0] = i;
        for (; m < PIPE && i < n; m++) {
            Py_ssize_t j = piece_end(s, i, n, t->digits);
            hs[m] = XXH3_64bits(s + i, (size_t)(j - i));
            __builtin_prefetch(&t->slots[hs[m] & t->mask]);
            at[m + 1] = i = j;
        }
        for (int q = 0; q < m; q++) {
            const Slot *slot = &t->slots[hs[q] & t->mask];
            if (slot->len != 0) __builtin_prefetch(t->blob + slot->off);
        }
        for (int q = 0; q < m; q++) {
            size_t len = (size_t)(at[q + 1] - at[q]);
            uint32_t r = lookup_hashed(t, s + at[q], len, hs[q]);
            if (r != NO_RANK) {
                out[n_out++] = r;
            } else {
                Py_ssize_t got = merge(t, s + at[q], len, out + n_out);
                if (got < 0) return got;
                n_out += got;
            }
        }
    }
    return n_out;
}

/* ---- the type ----------------------------------------------------------------------------------------- */

#define HUGE_PAGE ((size_t)2 << 20)

/* The slots (zeroed) and the blob after them in one anonymous mapping of *mapped bytes, advised as huge pages (the
 * kernel's transparent huge pages, "madvise" mode): NULL when out of memory. A request's tail meets the ~5 MB table
 * cold, and on 4 KB pages each piece's slot and bytes cost a TLB miss besides the cache miss: a page walk that the
 * slot's prefetch waits for (perf: ~45 % of encode_ascii's samples on the prefetch, cold), dearer still under a
 * hypervisor's nested paging. On 2 MB pages the whole table is three TLB entries (bench/README.md, "Issue 15,
 * sixteenth round ... ctx18"). Without huge pages (the advice refused or THP off) it is an ordinary mapping. */
static void *table_alloc(size_t bytes, size_t *mapped) {
    size_t size = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    /* a huge page needs a 2 MB-aligned start: map one more and unmap the ends */
    unsigned char *raw = (unsigned char *)mmap(NULL, size + HUGE_PAGE, PROT_READ | PROT_WRITE,
                                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uintptr_t at = ((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    size_t head = at - (uintptr_t)raw;
    if (head > 0) munmap(raw, head);
    if (HUGE_PAGE - head > 0) munmap((unsigned char *)at + size, HUGE_PAGE - head);
#ifdef MADV_HUGEPAGE
    (void)madvise((void *)at, size, MADV_HUGEPAGE);  /* advice: refused, the table is as fast as before */
#endif
    *mapped = size;
    return (void *)at;
}

static void Bpe_dealloc(Bpe *self) {
    if (self->slots != NULL) munmap(self->slots, self->mapped);
    for (uint32_t i = 0; i < self->n_ints; i++) Py_XDECREF(self->ints[i]);
    PyMem_Free(self->ints);
    Py_XDECREF(self->fallback);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Bpe_init(Bpe *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"ranks", "digits", "fallback", NULL};
    PyObject *ranks, *fallback;
    int digits;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!iO:Bpe", names, &PyDict_Type, &ranks, &digits, &fallback))
        return -1;
    if (self->slots != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Bpe is initialised once");
        return -1;
    }
    if (digits < 1) {
        PyErr_SetString(PyExc_ValueError, "digits must be at least 1");
        return -1;
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "fallback must be callable");
        return -1;
    }
    Py_ssize_t n = PyDict_Size(ranks), pos = 0, total = 0;
    PyObject *key, *value;
    while (PyDict_Next(ranks, &pos, &key, &value)) {
        if (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) == 0 || PyBytes_GET_SIZE(key) > UINT32_MAX / 2) {
            PyErr_SetString(PyExc_ValueError, "ranks' keys must be non-empty bytes");
            return -1;
        }
        total += PyBytes_GET_SIZE(key);
    }
    if (total > (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "ranks too large");
        return -1;
    }
    uint64_t cap = 16;
    while (cap < (uint64_t)n + (uint64_t)n / 2) cap <<= 1; /* load factor <= 2/3: 4 MB of slots for 150k tokens */
    size_t mapped = 0;
    Slot *slots = (Slot *)table_alloc(cap * sizeof(Slot) + (size_t)total, &mapped);
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    unsigned char *blob = (unsigned char *)(slots + cap);
    uint32_t off = 0, top = 0;
    pos = 0;
    while (PyDict_Next(ranks, &pos, &key, &value)) {
        unsigned long r = PyLong_Check(value) ? PyLong_AsUnsignedLong(value) : (unsigned long)-1;
        if (r >= NO_RANK) {
            munmap(slots, mapped);
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError, "ranks' values must be ints in [0, 2**32 - 1)");
            }
            return -1;
        }
        size_t len = (size_t)PyBytes_GET_SIZE(key);
        memcpy(blob + off, PyBytes_AS_STRING(key), len);
        uint64_t h = XXH3_64bits(blob + off, len);
        uint64_t i = h & (cap - 1);
        while (slots[i].len != 0) i = (i + 1) & (cap - 1);
        slots[i] = (Slot){off, (uint32_t)r, (uint32_t)(h >> 32), (uint32_t)len};
        if ((uint32_t)r >= top) top = (uint32_t)r + 1;
        off += (uint32_t)len;
    }
    PyObject **ints = (PyObject **)PyMem_Calloc(top > 0 ? top : 1, sizeof(PyObject *));
    if (ints == NULL) {
        munmap(slots, mapped);
        PyErr_NoMemory();
        return -1;
    }
    self->slots = slots;
    self->ints = ints;
    self->n_ints = top;
    self->mask = cap - 1;
    self->blob = blob;
    self->mapped = mapped;
    self->digits = digits;
    Py_INCREF(fallback);
    Py_XSETREF(self->fallback, fallback);
    return 0;
}

/* ---- encode: ASCII runs in C, the stretches around other characters by the fallback ----------------------
 *
 * A text with non-ASCII characters is cut where a piece always ends whatever follows and whatever came before:
 * before a space that follows an ASCII letter (the letter's piece, a \p{L}+ run or a contraction, stops at the
 * space; the pattern has no look-behind, so the pieces from the space on depend only on the text from there).
 * The stretch from the last such cut before a non-ASCII character to the first one after it goes to the
 * fallback; the ASCII text between stretches is encoded here. */

typedef struct {
    uint32_t *p;
    Py_ssize_t n, cap;
    uint32_t stack[512];
} Ids;

static int ids_reserve(Ids *b, Py_ssize_t more) {
    if (b->n + more <= b->cap) return 0;
    Py_ssize_t cap = b->cap * 2 > b->n + more ? b->cap * 2 : b->n + more;
    uint32_t *p = (uint32_t *)PyMem_RawMalloc((size_t)cap * sizeof(uint32_t));
    if (p == NULL) return -1;
    memcpy(p, b->p, (size_t)b->n * sizeof(uint32_t));
    if (b->p != b->stack) PyMem_RawFree(b->p);
    b->p = p;
    b->cap = cap;
    return 0;
}

/* s[0:n] (ASCII) encoded onto b: 0, -1 to fall back whole, -2 out of memory */
static int run_c(Bpe *self, const unsigned char *s, Py_ssize_t n, Ids *b) {
    if (ids_reserve(b, n) < 0) return -2;
    Py_ssize_t got;
    if (n >= GIL_FREE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        got = encode_ascii(self, s, n, b->p + b->n);
        Py_END_ALLOW_THREADS
    } else {
        got = encode_ascii(self, s, n, b->p + b->n);
    }
    if (got < 0) return (int)got;
    b->n += got;
    return 0;
}

/* text[a:b] by the fallback, onto ids: 0, or -3 with an exception set */
static int run_fallback(Bpe *self, PyObject *text, Py_ssize_t a, Py_ssize_t z, Ids *b) {
    PyObject *sub = PyUnicode_Substring(text, a, z);
    if (sub == NULL) return -3;
    PyObject *got = PyObject_CallOneArg(self->fallback, sub);
    Py_DECREF(sub);
    self->fallbacks++;
    if (got == NULL) return -3;
    PyObject *seq = PySequence_Fast(got, "the fallback must return a list of ints");
    Py_DECREF(got);
    if (seq == NULL) return -3;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    int rc = 0;
    if (ids_reserve(b, m) < 0) {
        PyErr_NoMemory();
        rc = -3;
    }
    for (Py_ssize_t k = 0; rc == 0 && k < m; k++) {
        unsigned long v = PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(seq, k));
        if (v == (unsigned long)-1 && PyErr_Occurred()) rc = -3;
        else if (v > UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "the fallback returned an id above 2**32 - 1");
            rc = -3;
        } else b->p[b->n++] = (uint32_t)v;
    }
    Py_DECREF(seq);
    return rc;
}

static inline int ascii_letter(Py_UCS4 c) { return c < 128 && kind[c] == K_L; }

/* text (not ASCII) onto b, ASCII stretches in C: 0, -1 to fall back whole, -2 out of memory, -3 raised */
static int encode_mixed(Bpe *self, PyObject *text, Ids *b) {
    int k = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    unsigned char *conv = NULL;  /* the ASCII stretch as bytes, for 2- and 4-byte strings */
    if (k != PyUnicode_1BYTE_KIND && (conv = (unsigned char *)PyMem_RawMalloc((size_t)n)) == NULL) return -2;
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < n;) {
        Py_ssize_t q = i;
        while (q < n && PyUnicode_READ(k, data, q) < 128) q++;
        Py_ssize_t cut = q, next = n;  /* [i, cut) here, [cut, next) by the fallback */
        if (q < n) {
            for (cut = q - 1; cut > i; cut--)
                if (PyUnicode_READ(k, data, cut) == ' ' && ascii_letter(PyUnicode_READ(k, data, cut - 1))) break;
            if (cut < i) cut = i;
            for (Py_ssize_t p = q + 2; p < n; p++)
                if (PyUnicode_READ(k, data, p) == ' ' && ascii_letter(PyUnicode_READ(k, data, p - 1))) {
                    next = p;
                    break;
                }
        }
        if (cut > i) {
            const unsigned char *s;
            if (conv == NULL) {
                s = (const unsigned char *)data + i;
            } else {
                for (Py_ssize_t j = i; j < cut; j++) conv[j - i] = (unsigned char)PyUnicode_READ(k, data, j);
                s = conv;
            }
            rc = run_c(self, s, cut - i, b);
        }
        if (rc == 0 && q < n) rc = run_fallback(self, text, cut, next, b);
        i = next;
    }
    PyMem_RawFree(conv);
    return rc;
}

static PyObject *Bpe_encode(Bpe *self, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "encode() takes a str");
        return NULL;
    }
    if (self->slots == NULL) {
        PyErr_SetString(PyExc_ValueError, "Bpe not initialised");
        return NULL;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(text) < 0) return NULL;
#endif
    Ids b;
    b.p = b.stack;
    b.n = 0;
    b.cap = 512;
    int rc = PyUnicode_IS_ASCII(text)
                 ? run_c(self, (const unsigned char *)PyUnicode_DATA(text), PyUnicode_GET_LENGTH(text), &b)
                 : encode_mixed(self, text, &b);
    PyObject *out = NULL;
    if (rc == -2) {
        PyErr_NoMemory();
    } else if (rc == 0 && (out = PyList_New(b.n)) != NULL) {
        for (Py_ssize_t j = 0; j < b.n; j++) {
            uint32_t id = b.p[j];
            PyObject *v = id < self->n_ints ? self->ints[id] : NULL;
            if (v == NULL) {
                if ((v = PyLong_FromUnsignedLong(id)) == NULL) {
                    Py_CLEAR(out);
                    break;
                }
                if (id < self->n_ints) self->ints[id] = v;  /* the table's reference */
                else {
                    PyList_SET_ITEM(out, j, v);
                    continue;
                }
            }
            Py_INCREF(v);
            PyList_SET_ITEM(out, j, v);
        }
    }
    if (b.p != b.stack) PyMem_RawFree(b.p);
    if (rc != -1) return out;
    self->fallbacks++;  /* a vocabulary without some byte: all by the fallback */
    return PyObject_CallOneArg(self->fallback, text);
}

/* ---- a chat prompt's fresh text: split on its special tokens and encoded, as packed uint32 ids --------------
 *
 * What infera.kv.codecs.TiktokenCodec.encode_fresh returns, as the bytes of a uint32 array (the prompt cache's
 * entries are array('I'): no list of ints made and read back, no int object touched per id). The text is split
 * on the specials exactly as TiktokenCodec._split_delimited splits it (specials that all start with ``first`` and
 * end with ``last``, found nowhere else in them: a special starting at i can only end at the first ``last`` after
 * i), each special becomes its id and each non-empty piece between them what ``encode`` gives it (the C path,
 * the fallback for what it cannot do). */

/* text[a:z] onto b as Bpe_encode(text[a:z]) gives it: 0, or -3 with an exception set */
static int encode_piece(Bpe *self, PyObject *text, Py_ssize_t a, Py_ssize_t z, Ids *b) {
    if (z <= a) return 0;
    Py_ssize_t n0 = b->n; /* a fallback takes the piece whole: what a stretch of it appended goes */
    int rc;
    if (PyUnicode_IS_ASCII(text)) {
        rc = run_c(self, (const unsigned char *)PyUnicode_DATA(text) + a, z - a, b);
    } else {
        PyObject *sub = PyUnicode_Substring(text, a, z);
        if (sub == NULL) return -3;
        rc = PyUnicode_IS_ASCII(sub) ? run_c(self, (const unsigned char *)PyUnicode_DATA(sub), z - a, b)
                                     : encode_mixed(self, sub, b);
        Py_DECREF(sub);
    }
    if (rc == -2) {
        PyErr_NoMemory();
        return -3;
    }
    if (rc == -1) { /* as Bpe_encode: the piece whole by the fallback */
        b->n = n0;
        rc = run_fallback(self, text, a, z, b);
    }
    return rc;
}

static PyObject *Bpe_encode_chat(Bpe *self, PyObject *args) {
    PyObject *text, *specials;
    int first, last;
    if (!PyArg_ParseTuple(args, "UCCO!:encode_chat", &text, &first, &last, &PyDict_Type, &specials)) return NULL;
    if (self->slots == NULL) {
        PyErr_SetString(PyExc_ValueError, "Bpe not initialised");
        return NULL;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(text) < 0) return NULL;
#endif
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Ids b;
    b.p = b.stack;
    b.n = 0;
    b.cap = 512;
    int rc = 0;
    Py_ssize_t pos = 0; /* where the current text piece starts */
    Py_ssize_t i = PyUnicode_FindChar(text, first, 0, n, 1);
    while (rc == 0 && i >= 0) {
        Py_ssize_t j = PyUnicode_FindChar(text, last, i + 1, n, 1);
        if (j < 0) {
            if (j == -2) rc = -3;
            break;
        }
        PyObject *token = PyUnicode_Substring(text, i, j + 1);
        PyObject *id = token != NULL ? PyDict_GetItemWithError(specials, token) : NULL;
        Py_XDECREF(token);
        if (id == NULL) {
            if (PyErr_Occurred()) {
                rc = -3;
                break;
            }
            i = PyUnicode_FindChar(text, first, i + 1, n, 1);
            continue;
        }
        unsigned long v = PyLong_AsUnsignedLong(id);
        if (v == (unsigned long)-1 && PyErr_Occurred()) {
            rc = -3;
            break;
        }
        if (v > UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "a special token's id is above 2**32 - 1");
            rc = -3;
            break;
        }
        rc = encode_piece(self, text, pos, i, &b);
        if (rc == 0 && ids_reserve(&b, 1) < 0) {
            PyErr_NoMemory();
            rc = -3;
        }
        if (rc != 0) break;
        b.p[b.n++] = (uint32_t)v;
        pos = j + 1;
        i = PyUnicode_FindChar(text, first, pos, n, 1);
    }
    if (rc == 0 && i == -2) rc = -3;
    if (rc == 0) rc = encode_piece(self, text, pos, n, &b);
    PyObject *out = rc == 0 ? PyBytes_FromStringAndSize((const char *)b.p, b.n * (Py_ssize_t)sizeof(uint32_t)) : NULL;
    if (b.p != b.stack) PyMem_RawFree(b.p);
    return out;
}

static PyMethodDef Bpe_methods[] = {
    {"encode", (PyCFunction)Bpe_encode, METH_O,
     "encode(text) -> list[int]: the ids of text; its ASCII stretches in C, the rest by the fallback"},
    {"encode_chat", (PyCFunction)Bpe_encode_chat, METH_VARARGS,
     "encode_chat(text, first, last, specials) -> bytes: the uint32 ids of text split on its specials (see above)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Bpe_members[] = {
    {"fallbacks", T_PYSSIZET, offsetof(Bpe, fallbacks), READONLY, "how many times the fallback was called"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject BpeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "infera.kv._bpe.Bpe",
    .tp_basicsize = sizeof(Bpe),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Bpe(ranks, digits, fallback): tiktoken's encode_ordinary for ASCII text (see csrc/bpe.c)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Bpe_init,
    .tp_dealloc = (destructor)Bpe_dealloc,
    .tp_methods = Bpe_methods,
    .tp_members = Bpe_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "infera.kv._bpe", "tiktoken's encode_ordinary for ASCII text, in C (csrc/bpe.c)", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__bpe(void) {
    for (int c = 0; c < 128; c++)
        kind[c] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ? K_L
                  : (c >= '0' && c <= '9')                         ? K_N
                  : (c == ' ' || (c >= '\t' && c <= '\r'))         ? K_W
                                                                   : K_P;
    if (PyType_Ready(&BpeType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&BpeType);
    if (PyModule_AddObject(m, "Bpe", (PyObject *)&BpeType) < 0) {
        Py_DECREF(&BpeType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
