/* infera.telemetry._otlp: a request's spans written as OTLP protobuf in C.
 *
 * records() writes exactly the bytes infera/telemetry/otlp.py's Encoder._records writes for a request's ended
 * span records (a root Span, its ended children: Spans and stage tuples), field by field in the same order;
 * the Python path keeps encodings of repeated pieces, this one writes every piece, which in C is cheaper than
 * a dict lookup in Python. It covers the values infera's spans carry (str, bool, int, float, bytes, lists and
 * tuples of them); for anything else (a mapping value, an int beyond 64 bits, a kind it was not given) it
 * returns None and Python encodes the request. tests/telemetry/test_native_otlp.py checks both paths give
 * the same bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if PY_VERSION_HEX >= 0x030D0000
#define AS_BYTES(v, b, n) _PyLong_AsByteArray((PyLongObject *)(v), (b), (n), 0, 0, 1)
#else
#define AS_BYTES(v, b, n) _PyLong_AsByteArray((PyLongObject *)(v), (b), (n), 0, 0)
#endif

/* the SpanKind members in OTLP's order (INTERNAL = 1 ... CONSUMER = 5), from setup() */
static PyObject *KINDS[5];
static PyObject *S_TRACE_ID, *S_SPAN_ID, *S_PARENT_ID, *S_NAME, *S_KIND, *S_START, *S_END, *S_ATTRIBUTES,
    *S_EVENTS, *S_DESCRIPTION, *S_REMOTE, *S_KEYS;

typedef struct {
    unsigned char *p;
    Py_ssize_t n, cap;
    unsigned char stack[2048];
} Buf;

/* an encoding this module does not cover: like a failed read, records() then returns None (error cleared) */
#define UNSUPPORTED (-1)

static int grow(Buf *b, Py_ssize_t more) {
    if (b->n + more <= b->cap) return 0;
    Py_ssize_t cap = b->cap * 2;
    while (cap < b->n + more) cap *= 2;
    unsigned char *p;
    if (b->p == b->stack) {
        p = PyMem_Malloc((size_t)cap);
        if (p != NULL) memcpy(p, b->stack, (size_t)b->n);
    } else {
        p = PyMem_Realloc(b->p, (size_t)cap);
    }
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int put(Buf *b, const void *data, Py_ssize_t n) {
    if (grow(b, n) < 0) return -1;
    memcpy(b->p + b->n, data, (size_t)n);
    b->n += n;
    return 0;
}

static inline int byte(Buf *b, unsigned char c) {
    if (grow(b, 1) < 0) return -1;
    b->p[b->n++] = c;
    return 0;
}

static inline int varint_size(uint64_t v) {
    int n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline int varint(Buf *b, uint64_t v) {
    if (grow(b, 10) < 0) return -1;
    while (v >= 0x80) {
        b->p[b->n++] = (unsigned char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    b->p[b->n++] = (unsigned char)v;
    return 0;
}

static inline int fixed64(Buf *b, uint64_t v) {
    if (grow(b, 8) < 0) return -1;
    for (int i = 0; i < 8; i++) b->p[b->n++] = (unsigned char)(v >> (8 * i));
    return 0;
}

static inline int id64(Buf *b, unsigned char tag, uint64_t v) { /* tag, length 8, big-endian */
    if (grow(b, 10) < 0) return -1;
    b->p[b->n++] = tag;
    b->p[b->n++] = 8;
    for (int i = 7; i >= 0; i--) b->p[b->n++] = (unsigned char)(v >> (8 * i));
    return 0;
}

/* A length-delimited field whose length is known only after its content: the tag and a one-byte length
 * now (open), the content, then close moves the content on if the length needs more bytes. */
static inline Py_ssize_t open_field(Buf *b, unsigned char tag) {
    if (grow(b, 2) < 0) return -1;
    b->p[b->n++] = tag;
    b->p[b->n++] = 0;
    return b->n;
}

static int close_field(Buf *b, Py_ssize_t start) {
    uint64_t len = (uint64_t)(b->n - start);
    if (len < 0x80) {
        b->p[start - 1] = (unsigned char)len;
        return 0;
    }
    int extra = varint_size(len) - 1;
    if (grow(b, extra) < 0) return -1;
    memmove(b->p + start + extra, b->p + start, (size_t)len);
    unsigned char *q = b->p + start - 1;
    while (len >= 0x80) {
        *q++ = (unsigned char)((len & 0x7F) | 0x80);
        len >>= 7;
    }
    *q = (unsigned char)len;
    b->n += extra;
    return 0;
}

static int bytes_field(Buf *b, unsigned char tag, const char *data, Py_ssize_t n) {
    if (byte(b, tag) < 0 || varint(b, (uint64_t)n) < 0) return -1;
    return put(b, data, n);
}

static int str_field(Buf *b, unsigned char tag, PyObject *s) {
    if (!PyUnicode_Check(s)) return UNSUPPORTED;
    Py_ssize_t n;
    const char *data = PyUnicode_AsUTF8AndSize(s, &n);
    if (data == NULL) return -1;
    return bytes_field(b, tag, data, n);
}

static int u64_of(PyObject *v, uint64_t *out) { /* an int in 0 .. 2**64-1 (struct's "Q") */
    if (!PyLong_Check(v)) return UNSUPPORTED;
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (uint64_t)x;
    return 0;
}

/* an AnyValue's content, as otlp._value writes it */
static int any_value(Buf *b, PyObject *v, int depth) {
    if (PyBool_Check(v)) {
        if (grow(b, 2) < 0) return -1;
        b->p[b->n++] = 0x10;
        b->p[b->n++] = v == Py_True ? 1 : 0;
        return 0;
    }
    if (PyUnicode_Check(v)) return str_field(b, 0x0A, v);
    if (PyLong_Check(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow) return UNSUPPORTED; /* Python masks it to 64 bits: rare, left to Python */
        if (x == -1 && PyErr_Occurred()) return -1;
        if (byte(b, 0x18) < 0) return -1;
        return varint(b, (uint64_t)x); /* two's complement, as `value & 0xFFFFFFFFFFFFFFFF` */
    }
    if (PyFloat_Check(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        if (byte(b, 0x21) < 0) return -1;
        return fixed64(b, bits);
    }
    if (PyBytes_Check(v)) return bytes_field(b, 0x3A, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v));
    if ((PyList_Check(v) || PyTuple_Check(v)) && depth < 8) {
        Py_ssize_t array = open_field(b, 0x2A);
        if (array < 0) return -1;
        PyObject *seq = v;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t item = open_field(b, 0x0A);
            if (item < 0) return -1;
            int rc = any_value(b, PySequence_Fast_GET_ITEM(seq, i), depth + 1);
            if (rc < 0) return rc;
            if (close_field(b, item) < 0) return -1;
            if (PySequence_Fast_GET_SIZE(seq) != n) return UNSUPPORTED; /* changed under us */
        }
        return close_field(b, array);
    }
    return UNSUPPORTED;
}

static int key_value(Buf *b, PyObject *key, PyObject *value) { /* a span attribute (field 9) */
    Py_ssize_t kv = open_field(b, 0x4A);
    if (kv < 0) return -1;
    int rc = str_field(b, 0x0A, key);
    if (rc < 0) return rc;
    Py_ssize_t any = open_field(b, 0x12);
    if (any < 0) return -1;
    if ((rc = any_value(b, value, 0)) < 0) return rc;
    if (close_field(b, any) < 0) return -1;
    return close_field(b, kv);
}

static int kind_byte(PyObject *kind) {
    for (int i = 0; i < 5; i++)
        if (kind == KINDS[i]) return i + 1;
    return UNSUPPORTED;
}

static const unsigned char LOCAL_FLAGS[6] = {0x85, 0x01, 0x00, 0x01, 0x00, 0x00};
static const unsigned char REMOTE_FLAGS[6] = {0x85, 0x01, 0x00, 0x03, 0x00, 0x00};

/* one Span record's message (Encoder._record); -1 where not covered or a read failed */
static int span_body(Buf *b, const unsigned char *trace, const char *state, Py_ssize_t state_n, PyObject *span) {
    PyObject *v = NULL, *attributes = NULL, *events = NULL;
    int ok = 0;
    uint64_t x;
    if (put(b, trace, 18) < 0) return -1;
#define READ(attr)                                    \
    do {                                              \
        Py_XDECREF(v);                                \
        v = PyObject_GetAttr(span, attr);             \
        if (v == NULL) goto done;                     \
    } while (0)
    READ(S_SPAN_ID);
    if (u64_of(v, &x) < 0 || id64(b, 0x12, x) < 0) goto done;
    if (state_n && put(b, state, state_n) < 0) goto done;
    READ(S_PARENT_ID);
    if (u64_of(v, &x) < 0) goto done;
    if (x && id64(b, 0x22, x) < 0) goto done;
    READ(S_NAME);
    if (str_field(b, 0x2A, v) < 0) goto done;
    READ(S_KIND);
    int kind = kind_byte(v);
    if (kind < 0 || byte(b, 0x30) < 0 || byte(b, (unsigned char)kind) < 0) goto done;
    READ(S_START);
    if (u64_of(v, &x) < 0 || byte(b, 0x39) < 0 || fixed64(b, x) < 0) goto done;
    READ(S_END);
    if (u64_of(v, &x) < 0 || byte(b, 0x41) < 0 || fixed64(b, x) < 0) goto done;
    attributes = PyObject_GetAttr(span, S_ATTRIBUTES);
    if (attributes == NULL || !PyDict_CheckExact(attributes)) goto done;
    {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(attributes, &pos, &key, &value))
            if (key_value(b, key, value) < 0) goto done;
    }
    events = PyObject_GetAttr(span, S_EVENTS);
    if (events == NULL || !PyList_CheckExact(events)) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *event = PyList_GET_ITEM(events, i);
        if (!PyTuple_CheckExact(event) || PyTuple_GET_SIZE(event) != 2) goto done;
        Py_ssize_t e = open_field(b, 0x5A);
        if (e < 0 || u64_of(PyTuple_GET_ITEM(event, 1), &x) < 0 || byte(b, 0x09) < 0 || fixed64(b, x) < 0 ||
            str_field(b, 0x12, PyTuple_GET_ITEM(event, 0)) < 0 || close_field(b, e) < 0)
            goto done;
    }
    READ(S_DESCRIPTION);
    if (v == Py_None) {
        if (byte(b, 0x7A) < 0 || byte(b, 0) < 0) goto done;
    } else {
        if (!PyUnicode_Check(v)) goto done;
        Py_ssize_t status = open_field(b, 0x7A);
        if (status < 0) goto done;
        if (PyUnicode_GET_LENGTH(v) && str_field(b, 0x12, v) < 0) goto done;
        if (byte(b, 0x18) < 0 || byte(b, 0x02) < 0 || close_field(b, status) < 0) goto done;
    }
    READ(S_REMOTE);
    int remote = PyObject_IsTrue(v);
    if (remote < 0 || put(b, remote ? REMOTE_FLAGS : LOCAL_FLAGS, 6) < 0) goto done;
    ok = 1;
done:
#undef READ
    Py_XDECREF(v);
    Py_XDECREF(attributes);
    Py_XDECREF(events);
    return ok ? 0 : -1;
}

/* one stage's message (the stage branch of Encoder._records) */
static int stage_body(Buf *b, const unsigned char *trace, const char *state, Py_ssize_t state_n, uint64_t parent,
                      PyObject *stage, PyObject *bits, PyObject *sixty_four) {
    static const unsigned char TAIL[8] = {0x7A, 0x00, 0x85, 0x01, 0x00, 0x01, 0x00, 0x00};
    if (PyTuple_GET_SIZE(stage) != 5) return -1;
    PyObject *name = PyTuple_GET_ITEM(stage, 0), *values = PyTuple_GET_ITEM(stage, 4);
    uint64_t start, end, id;
    if (u64_of(PyTuple_GET_ITEM(stage, 1), &start) < 0 || u64_of(PyTuple_GET_ITEM(stage, 2), &end) < 0) return -1;
    if (!PyTuple_Check(values)) return -1;
    PyObject *keys = NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(values);
    if (n) {
        keys = PyObject_GetAttr(PyTuple_GET_ITEM(stage, 3), S_KEYS);
        if (keys == NULL) return -1;
        if (!PyTuple_Check(keys) || PyTuple_GET_SIZE(keys) != n) { /* Python's zip(strict=True) raises */
            Py_DECREF(keys);
            return -1;
        }
    }
    PyObject *drawn = PyObject_CallOneArg(bits, sixty_four);
    int rc = -1;
    if (drawn == NULL || u64_of(drawn, &id) < 0) goto done;
    if (!id) id = 1;
    if (put(b, trace, 18) < 0 || id64(b, 0x12, id) < 0 || id64(b, 0x22, parent) < 0) goto done;
    if (state_n && put(b, state, state_n) < 0) goto done;
    if (str_field(b, 0x2A, name) < 0 || byte(b, 0x30) < 0 || byte(b, 1) < 0) goto done;
    if (byte(b, 0x39) < 0 || fixed64(b, start) < 0 || byte(b, 0x41) < 0 || fixed64(b, end) < 0) goto done;
    for (Py_ssize_t i = 0; i < n; i++)
        if (key_value(b, PyTuple_GET_ITEM(keys, i), PyTuple_GET_ITEM(values, i)) < 0) goto done;
    rc = put(b, TAIL, 8);
done:
    Py_XDECREF(drawn);
    Py_XDECREF(keys);
    return rc;
}

/* records(root, children, bits, state) -> bytes | None: the ScopeSpans.spans fields of a request's ended
 * records (children first, root last), or None where Python must write them */
static PyObject *records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "records(root, children, bits, state)");
        return NULL;
    }
    PyObject *root = args[0], *children = args[1], *bits = args[2];
    const char *state = PyBytes_AS_STRING(args[3]);
    Py_ssize_t state_n = PyBytes_GET_SIZE(args[3]);
    if (!PyList_Check(children) && !PyTuple_Check(children)) Py_RETURN_NONE;
    Buf b;
    b.p = b.stack;
    b.n = 0;
    b.cap = (Py_ssize_t)sizeof(b.stack);
    unsigned char trace[18] = {0x0A, 0x10};
    uint64_t parent;
    PyObject *sixty_four = NULL, *result = NULL, *v = PyObject_GetAttr(root, S_TRACE_ID);
    if (v == NULL || !PyLong_Check(v) || AS_BYTES(v, trace + 2, 16) < 0) goto none;
    Py_CLEAR(v);
    v = PyObject_GetAttr(root, S_SPAN_ID);
    if (v == NULL || u64_of(v, &parent) < 0) goto none;
    sixty_four = PyLong_FromLong(64);
    if (sixty_four == NULL) goto none;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(children);
    for (Py_ssize_t i = 0; i <= n; i++) {
        if (i < n && PySequence_Fast_GET_SIZE(children) != n) goto none;
        PyObject *child = i < n ? PySequence_Fast_GET_ITEM(children, i) : root;
        Py_ssize_t at = open_field(&b, 0x12);
        if (at < 0) goto none;
        int rc = i < n && PyTuple_Check(child)
                     ? stage_body(&b, trace, state, state_n, parent, child, bits, sixty_four)
                     : span_body(&b, trace, state, state_n, child);
        if (rc < 0 || close_field(&b, at) < 0) goto none;
    }
    result = PyBytes_FromStringAndSize((const char *)b.p, b.n);
    goto out;
none: /* not covered here (or a read failed): Python writes it, and raises what it raises */
    PyErr_Clear();
    result = Py_NewRef(Py_None);
out:
    Py_XDECREF(v);
    Py_XDECREF(sixty_four);
    if (b.p != b.stack) PyMem_Free(b.p);
    return result;
}

static PyObject *setup(PyObject *self, PyObject *kinds) {
    if (!PyTuple_Check(kinds) || PyTuple_GET_SIZE(kinds) != 5) {
        PyErr_SetString(PyExc_TypeError, "setup(kinds): the five SpanKind members, INTERNAL .. CONSUMER");
        return NULL;
    }
    for (int i = 0; i < 5; i++) {
        Py_XDECREF(KINDS[i]);
        KINDS[i] = Py_NewRef(PyTuple_GET_ITEM(kinds, i));
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"records", (PyCFunction)(void (*)(void))records, METH_FASTCALL, NULL},
    {"setup", setup, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_otlp", "A request's spans as OTLP protobuf, in C (see csrc/otlp.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__otlp(void) {
#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(S_TRACE_ID, "trace_id");
    INTERN(S_SPAN_ID, "span_id");
    INTERN(S_PARENT_ID, "parent_id");
    INTERN(S_NAME, "name");
    INTERN(S_KIND, "kind");
    INTERN(S_START, "start");
    INTERN(S_END, "end");
    INTERN(S_ATTRIBUTES, "attributes");
    INTERN(S_EVENTS, "events");
    INTERN(S_DESCRIPTION, "description");
    INTERN(S_REMOTE, "remote");
    INTERN(S_KEYS, "keys");
#undef INTERN
    return PyModule_Create(&module);
}
