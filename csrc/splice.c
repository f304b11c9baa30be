/* A streamed chunk from the engine's socket to the client's transport in one call (infera.server.splice).
 *
 * Included from index.c (one extension, infera.kv._native). ChunkSink.take(chunk) does what the relay's Python
 * sink did per chunk, in the same order and with the same results: the inter-chunk gap (counted into the
 * histogram's buckets, given its bounds, which the Python side adds to the histogram at the end; else kept in an
 * array), StreamTally.feed (the [DONE] marker and the last non-null
 * usage event, across chunk seams; tests/server/test_splice_native.py holds it to tally.py's), Observe's look at
 * the body (the "data: " count; a chunk naming "_tokens" goes to Observation.body itself), then uvicorn's chunked
 * write to the client's transport and its back-pressure answer. The chunk that ends the stream goes to `finish`
 * (Python: the cycle's completion); nothing after it is written. */

#include <time.h>

#define SPLICE_SEAM 12   /* tally.py's _SEAM: max(len(DONE), len(USAGE) + 5) - 1 */
#define SPLICE_KEEP 4096 /* tally.py's _KEEP */

static const char splice_done[] = "\ndata: [DONE]"; /* 13 bytes */
static const char splice_usage[] = "\"usage\":";     /* 8 bytes */
#define SPLICE_DONE_LEN 13
#define SPLICE_USAGE_LEN 8

typedef struct {
    PyObject_HEAD
    PyObject *write;    /* the client transport's write */
    PyObject *cycle;    /* uvicorn's request cycle: .disconnected, .response_complete */
    PyObject *flow;     /* its flow control: .write_paused */
    PyObject *finish;   /* called with the chunk that ends the stream; its truth is the answer */
    PyObject *observed; /* Observation.body (a chunk naming "_tokens"), or None: no observation */
    PyObject *usage;    /* bytes: tally's _usage */
    unsigned char seam[SPLICE_SEAM];
    Py_ssize_t seam_len;
    int open, done, ended;
    Py_ssize_t events; /* "data: " counted in chunks not handed to `observed` */
    double last;       /* perf_counter() of the last chunk (or of the start) */
    double *gaps;
    Py_ssize_t ngaps, cap;
    double *bounds; /* the histogram's upper bounds, ascending (nbounds 0: keep the gaps instead) */
    Py_ssize_t *counts, nbounds;
    double sum;
} ChunkSink;

static PyObject *splice_str_disconnected, *splice_str_complete, *splice_str_paused;

static double splice_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.perf_counter()'s clock on Linux */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int splice_has(const char *hay, Py_ssize_t n, const char *needle, Py_ssize_t m) {
    return n >= m && memmem(hay, (size_t)n, needle, (size_t)m) != NULL;
}

/* the byte at `i` of seam + chunk */
static inline unsigned char splice_at(ChunkSink *s, const char *chunk, Py_ssize_t i) {
    return i < s->seam_len ? s->seam[i] : (unsigned char)chunk[i - s->seam_len];
}

static int splice_space(unsigned char c) { /* bytes.lstrip()'s whitespace */
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\x0b' || c == '\x0c';
}

/* tally.py's _keep(data, at) with data = seam + chunk */
static int splice_keep(ChunkSink *s, const char *chunk, Py_ssize_t n, Py_ssize_t at) {
    Py_ssize_t total = s->seam_len + n, v = at + SPLICE_USAGE_LEN, end = v + 5 < total ? v + 5 : total;
    for (Py_ssize_t i = v; i < end; i++) {
        unsigned char c = splice_at(s, chunk, i);
        if (splice_space(c)) continue;
        if (c == 'n') return 0; /* "usage": null */
        break;
    }
    Py_ssize_t stop = at + SPLICE_KEEP < total ? at + SPLICE_KEEP : total;
    PyObject *usage = PyBytes_FromStringAndSize(NULL, stop - at);
    if (usage == NULL) return -1;
    char *out = PyBytes_AS_STRING(usage);
    for (Py_ssize_t i = at; i < stop && i < s->seam_len; i++) *out++ = (char)s->seam[i];
    Py_ssize_t from = at > s->seam_len ? at - s->seam_len : 0;
    if (stop > s->seam_len) memcpy(out, chunk + from, (size_t)(stop - s->seam_len - from));
    Py_SETREF(s->usage, usage);
    s->open = !splice_has(PyBytes_AS_STRING(usage), stop - at, "\n\n", 2) && stop - at < SPLICE_KEEP;
    return 0;
}

/* StreamTally.feed(chunk) */
static int splice_tally(ChunkSink *s, const char *chunk, Py_ssize_t n) {
    if (s->open) {
        Py_ssize_t have = PyBytes_GET_SIZE(s->usage), add = SPLICE_KEEP - have;
        if (add > n) add = n;
        if (add > 0) {
            PyObject *usage = PyBytes_FromStringAndSize(NULL, have + add);
            if (usage == NULL) return -1;
            memcpy(PyBytes_AS_STRING(usage), PyBytes_AS_STRING(s->usage), (size_t)have);
            memcpy(PyBytes_AS_STRING(usage) + have, chunk, (size_t)add);
            Py_SETREF(s->usage, usage);
            have += add;
        }
        s->open = !splice_has(PyBytes_AS_STRING(s->usage), have, "\n\n", 2) && have < SPLICE_KEEP;
    }
    /* the seam and the chunk's first bytes: a marker that starts in the seam ends within them */
    char joint[2 * SPLICE_SEAM];
    Py_ssize_t head = n < SPLICE_SEAM ? n : SPLICE_SEAM, jlen = s->seam_len + head;
    memcpy(joint, s->seam, (size_t)s->seam_len);
    memcpy(joint + s->seam_len, chunk, (size_t)head);
    if (!s->done && (splice_has(joint, jlen, splice_done, SPLICE_DONE_LEN) ||
                     splice_has(chunk, n, splice_done, SPLICE_DONE_LEN)))
        s->done = 1;
    /* the last "usage": key of seam + chunk, unless it lies within the seam */
    Py_ssize_t at = -1;
    const char *p = chunk, *end = chunk + n;
    while ((p = memmem(p, (size_t)(end - p), splice_usage, SPLICE_USAGE_LEN)) != NULL) {
        at = s->seam_len + (p - chunk);
        p += 1;
    }
    if (at < 0) {
        for (Py_ssize_t i = jlen - SPLICE_USAGE_LEN; i >= 0; i--) {
            if (memcmp(joint + i, splice_usage, SPLICE_USAGE_LEN) == 0) {
                if (i + SPLICE_USAGE_LEN > s->seam_len) at = i;
                break;
            }
        }
    }
    if (at >= 0 && splice_keep(s, chunk, n, at) < 0) return -1;
    /* the new seam: (seam + chunk)[-SEAM:] */
    if (n >= SPLICE_SEAM) {
        memcpy(s->seam, chunk + n - SPLICE_SEAM, SPLICE_SEAM);
        s->seam_len = SPLICE_SEAM;
    } else {
        Py_ssize_t keep = s->seam_len + n > SPLICE_SEAM ? SPLICE_SEAM - n : s->seam_len;
        memmove(s->seam, s->seam + s->seam_len - keep, (size_t)keep);
        memcpy(s->seam + keep, chunk, (size_t)n);
        s->seam_len = keep + n;
    }
    return 0;
}

static Py_ssize_t splice_count(const char *p, Py_ssize_t n, const char *needle, Py_ssize_t m) {
    Py_ssize_t count = 0;
    const char *end = p + n;
    while (end - p >= m && (p = memmem(p, (size_t)(end - p), needle, (size_t)m)) != NULL) {
        count++;
        p += m;
    }
    return count;
}

static int splice_truth(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

static PyObject *ChunkSink_take(ChunkSink *s, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "take() wants bytes");
        return NULL;
    }
    if (s->ended) Py_RETURN_TRUE; /* nothing follows [DONE]; the body is only read to its end */
    const char *chunk = PyBytes_AS_STRING(arg);
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    double now = splice_now(), gap = now - s->last;
    s->last = now;
    if (s->nbounds) { /* fast_observe's bucket: the first bound >= the gap */
        s->sum += gap;
        Py_ssize_t lo = 0, hi = s->nbounds;
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (s->bounds[mid] < gap) lo = mid + 1;
            else hi = mid;
        }
        if (lo < s->nbounds) s->counts[lo]++;
    } else if (s->ngaps == s->cap) {
        Py_ssize_t cap = s->cap ? s->cap * 2 : 64;
        double *gaps = PyMem_Realloc(s->gaps, (size_t)cap * sizeof(double));
        if (gaps == NULL) return PyErr_NoMemory();
        s->gaps = gaps;
        s->cap = cap;
    }
    if (!s->nbounds) s->gaps[s->ngaps++] = gap;
    if (splice_tally(s, chunk, n) < 0) return NULL;
    if (s->done) {
        s->ended = 1;
        PyObject *r = PyObject_CallOneArg(s->finish, arg);
        if (r == NULL) return NULL;
        int t = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (t < 0) return NULL;
        return PyBool_FromLong(t);
    }
    if (s->observed != Py_None && n) {
        if (splice_has(chunk, n, "_tokens", 7)) {
            PyObject *r = PyObject_CallOneArg(s->observed, arg);
            if (r == NULL) return NULL;
            Py_DECREF(r);
        } else {
            s->events += splice_count(chunk, n, "data: ", 6);
        }
    }
    int t = splice_truth(s->cycle, splice_str_disconnected);
    if (t < 0) return NULL;
    if (t) Py_RETURN_TRUE;
    t = splice_truth(s->cycle, splice_str_complete);
    if (t < 0) return NULL;
    if (t) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Unexpected ASGI message 'http.response.body' sent, after response already completed.");
        return NULL;
    }
    if (n) {
        char hex[2 * sizeof(Py_ssize_t) + 1];
        int hlen = snprintf(hex, sizeof hex, "%zx", (size_t)n);
        PyObject *framed = PyBytes_FromStringAndSize(NULL, hlen + 2 + n + 2);
        if (framed == NULL) return NULL;
        char *out = PyBytes_AS_STRING(framed);
        memcpy(out, hex, (size_t)hlen);
        out += hlen;
        *out++ = '\r';
        *out++ = '\n';
        memcpy(out, chunk, (size_t)n);
        out += n;
        *out++ = '\r';
        *out = '\n';
        PyObject *r = PyObject_CallOneArg(s->write, framed);
        Py_DECREF(framed);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    t = splice_truth(s->flow, splice_str_paused);
    if (t < 0) return NULL;
    return PyBool_FromLong(!t);
}

/* ChunkSink(write, cycle, flow, finish, observed, seam, usage, open, last, bounds) */
static int ChunkSink_init(ChunkSink *s, PyObject *args, PyObject *kwds) {
    PyObject *write, *cycle, *flow, *finish, *observed, *usage, *bounds;
    const char *seam;
    Py_ssize_t seam_len;
    int open;
    double last;
    if (!PyArg_ParseTuple(args, "OOOOOy#SpdO:ChunkSink", &write, &cycle, &flow, &finish, &observed, &seam,
                          &seam_len, &usage, &open, &last, &bounds))
        return -1;
    Py_ssize_t nbounds = 0;
    if (bounds != Py_None) {
        if (!PyList_Check(bounds)) {
            PyErr_SetString(PyExc_TypeError, "bounds must be a list of floats or None");
            return -1;
        }
        nbounds = PyList_GET_SIZE(bounds);
        double *b = PyMem_Realloc(s->bounds, (size_t)(nbounds ? nbounds : 1) * sizeof(double));
        if (b == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->bounds = b;
        Py_ssize_t *c = PyMem_Realloc(s->counts, (size_t)(nbounds ? nbounds : 1) * sizeof(Py_ssize_t));
        if (c == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->counts = c;
        for (Py_ssize_t i = 0; i < nbounds; i++) {
            b[i] = PyFloat_AsDouble(PyList_GET_ITEM(bounds, i));
            if (b[i] == -1.0 && PyErr_Occurred()) return -1;
            c[i] = 0;
        }
    }
    if (!PyBytes_Check(usage)) {
        PyErr_SetString(PyExc_TypeError, "usage must be bytes");
        return -1;
    }
    if (seam_len > SPLICE_SEAM) { /* the tally keeps at most this many */
        seam += seam_len - SPLICE_SEAM;
        seam_len = SPLICE_SEAM;
    }
    Py_INCREF(write);
    Py_XSETREF(s->write, write);
    Py_INCREF(cycle);
    Py_XSETREF(s->cycle, cycle);
    Py_INCREF(flow);
    Py_XSETREF(s->flow, flow);
    Py_INCREF(finish);
    Py_XSETREF(s->finish, finish);
    Py_INCREF(observed);
    Py_XSETREF(s->observed, observed);
    Py_INCREF(usage);
    Py_XSETREF(s->usage, usage);
    memcpy(s->seam, seam, (size_t)seam_len);
    s->seam_len = seam_len;
    s->open = open;
    s->done = s->ended = 0;
    s->events = 0;
    s->last = last;
    s->ngaps = 0;
    s->nbounds = nbounds;
    s->sum = 0.0;
    return 0;
}

static PyObject *ChunkSink_gaps(ChunkSink *s, PyObject *unused) {
    PyObject *out = PyList_New(s->ngaps);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < s->ngaps; i++) {
        PyObject *v = PyFloat_FromDouble(s->gaps[i]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    s->ngaps = 0;
    return out;
}

static PyObject *ChunkSink_buckets(ChunkSink *s, PyObject *unused) {
    PyObject *counts = PyList_New(s->nbounds);
    if (counts == NULL) return NULL;
    for (Py_ssize_t i = 0; i < s->nbounds; i++) {
        PyObject *v = PyLong_FromSsize_t(s->counts[i]);
        if (v == NULL) {
            Py_DECREF(counts);
            return NULL;
        }
        PyList_SET_ITEM(counts, i, v);
        s->counts[i] = 0;
    }
    PyObject *out = Py_BuildValue("(Nd)", counts, s->sum);
    s->sum = 0.0;
    return out;
}

static PyObject *ChunkSink_tally(ChunkSink *s, PyObject *unused) {
    return Py_BuildValue("(y#Oii)", (const char *)s->seam, s->seam_len, s->usage, s->open, s->done);
}

static PyObject *ChunkSink_events(ChunkSink *s, PyObject *unused) {
    Py_ssize_t events = s->events;
    s->events = 0;
    return PyLong_FromSsize_t(events);
}

static int ChunkSink_traverse(ChunkSink *s, visitproc visit, void *arg) {
    Py_VISIT(s->write);
    Py_VISIT(s->cycle);
    Py_VISIT(s->flow);
    Py_VISIT(s->finish);
    Py_VISIT(s->observed);
    return 0;
}

static int ChunkSink_clear(ChunkSink *s) {
    Py_CLEAR(s->write);
    Py_CLEAR(s->cycle);
    Py_CLEAR(s->flow);
    Py_CLEAR(s->finish);
    Py_CLEAR(s->observed);
    Py_CLEAR(s->usage);
    return 0;
}

static void ChunkSink_dealloc(ChunkSink *s) {
    PyObject_GC_UnTrack(s);
    ChunkSink_clear(s);
    PyMem_Free(s->gaps);
    PyMem_Free(s->bounds);
    PyMem_Free(s->counts);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef chunk_sink_methods[] = {
    {"take", (PyCFunction)ChunkSink_take, METH_O,
     "One chunk of the stream's body: gap, tally, observation, chunked write. False: the client cannot take more now."},
    {"gaps", (PyCFunction)ChunkSink_gaps, METH_NOARGS, "The inter-chunk gaps (s) since the last call, in order."},
    {"buckets", (PyCFunction)ChunkSink_buckets, METH_NOARGS,
     "The gaps since the last call by bucket of the bounds given: (counts, sum of the gaps)."},
    {"tally", (PyCFunction)ChunkSink_tally, METH_NOARGS, "The tally's state: (seam, usage, open, done)."},
    {"events", (PyCFunction)ChunkSink_events, METH_NOARGS, "The 'data: ' count since the last call."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ChunkSinkType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "infera.kv._native.ChunkSink",
    .tp_basicsize = sizeof(ChunkSink),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A streamed body's per-chunk work in one call (csrc/splice.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ChunkSink_init,
    .tp_traverse = (traverseproc)ChunkSink_traverse,
    .tp_clear = (inquiry)ChunkSink_clear,
    .tp_dealloc = (destructor)ChunkSink_dealloc,
    .tp_methods = chunk_sink_methods,
};

static int splice_register(PyObject *mod) {
    splice_str_disconnected = PyUnicode_InternFromString("disconnected");
    splice_str_complete = PyUnicode_InternFromString("response_complete");
    splice_str_paused = PyUnicode_InternFromString("write_paused");
    if (!splice_str_disconnected || !splice_str_complete || !splice_str_paused) return -1;
    if (PyType_Ready(&ChunkSinkType) < 0) return -1;
    Py_INCREF(&ChunkSinkType);
    if (PyModule_AddObject(mod, "ChunkSink", (PyObject *)&ChunkSinkType) < 0) {
        Py_DECREF(&ChunkSinkType);
        return -1;
    }
    return 0;
}
