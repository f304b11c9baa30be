/* An incoming request's header fields, from httptools' parser to the ASGI scope's list, without a Python frame per
 * field (infera.server.arrival).
 *
 * Included from index.c (one extension, infera.kv._native). httptools calls its protocol's `on_header(name, value)`
 * once per field, and reads that attribute once, when the parser is made: a HeaderSink set there does what uvicorn's
 * HttpToolsProtocol.on_header does, with the same results (tests/server/test_arrival.py holds it to uvicorn's):
 * the name lowered (bytes.lower(): ASCII only), the value without its trailing spaces and tabs (rstrip(b" \t")),
 * the pair appended to `headers` (the current request's scope["headers"], set at each message's begin), and
 * `expect` set when the field is "expect: 100-continue" (the value compared lowered). */

typedef struct {
    PyObject_HEAD
    PyObject *headers; /* list: the current request's header pairs */
    char expect;       /* an "expect: 100-continue" field was seen */
} HeaderSink;

static int HeaderSink_traverse(HeaderSink *self, visitproc visit, void *arg) {
    Py_VISIT(self->headers);
    return 0;
}

static int HeaderSink_clear(HeaderSink *self) {
    Py_CLEAR(self->headers);
    return 0;
}

static void HeaderSink_dealloc(HeaderSink *self) {
    PyObject_GC_UnTrack(self);
    HeaderSink_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int HeaderSink_init(HeaderSink *self, PyObject *args, PyObject *kwargs) {
    if (!PyArg_ParseTuple(args, "")) return -1;
    PyObject *headers = PyList_New(0);
    if (headers == NULL) return -1;
    Py_XSETREF(self->headers, headers);
    self->expect = 0;
    return 0;
}

static PyObject *HeaderSink_call(HeaderSink *self, PyObject *args, PyObject *kwargs) {
    PyObject *name, *value;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "HeaderSink takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "SS:HeaderSink", &name, &value)) return NULL;
    if (self->headers == NULL || !PyList_Check(self->headers)) {
        PyErr_SetString(PyExc_TypeError, "HeaderSink.headers must be a list");
        return NULL;
    }
    const char *n = PyBytes_AS_STRING(name), *v = PyBytes_AS_STRING(value);
    Py_ssize_t nlen = PyBytes_GET_SIZE(name), vlen = PyBytes_GET_SIZE(value), i, end = vlen;
    PyObject *lowered;
    for (i = 0; i < nlen && !(n[i] >= 'A' && n[i] <= 'Z'); i++) {
    }
    if (i == nlen && PyBytes_CheckExact(name)) {
        lowered = Py_NewRef(name);
    } else {
        /* a new object to write into: PyBytes_FromStringAndSize(n, 1) would hand back CPython's shared one-byte
         * bytes object (b"D" of every b"D" in the process), lowered in place for all (a one-letter name) */
        lowered = PyBytes_FromStringAndSize(NULL, nlen);
        if (lowered == NULL) return NULL;
        char *out = PyBytes_AS_STRING(lowered);
        for (i = 0; i < nlen; i++) {
            char c = n[i];
            out[i] = c >= 'A' && c <= 'Z' ? (char)(c + ('a' - 'A')) : c;
        }
    }
    while (end > 0 && (v[end - 1] == ' ' || v[end - 1] == '\t')) end--;
    PyObject *stripped = end == vlen && PyBytes_CheckExact(value) ? Py_NewRef(value)
                                                                  : PyBytes_FromStringAndSize(v, end);
    if (stripped == NULL) {
        Py_DECREF(lowered);
        return NULL;
    }
    if (nlen == 6 && memcmp(PyBytes_AS_STRING(lowered), "expect", 6) == 0 && end == 12) {
        static const char want[] = "100-continue";
        for (i = 0; i < 12; i++) {
            char c = v[i];
            if (c >= 'A' && c <= 'Z') c = (char)(c + ('a' - 'A'));
            if (c != want[i]) break;
        }
        if (i == 12) self->expect = 1;
    }
    PyObject *pair = PyTuple_Pack(2, lowered, stripped);
    Py_DECREF(lowered);
    Py_DECREF(stripped);
    if (pair == NULL) return NULL;
    int failed = PyList_Append(self->headers, pair);
    Py_DECREF(pair);
    if (failed < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMemberDef header_sink_members[] = {
    {"headers", T_OBJECT_EX, offsetof(HeaderSink, headers), 0, "the current request's header pairs (a list)"},
    {"expect", T_BOOL, offsetof(HeaderSink, expect), 0, "an 'expect: 100-continue' field was seen"},
    {NULL},
};

static PyTypeObject HeaderSinkType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "infera.kv._native.HeaderSink",
    .tp_basicsize = sizeof(HeaderSink),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "uvicorn's on_header for httptools, in C (csrc/headers.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)HeaderSink_init,
    .tp_call = (ternaryfunc)HeaderSink_call,
    .tp_traverse = (traverseproc)HeaderSink_traverse,
    .tp_clear = (inquiry)HeaderSink_clear,
    .tp_dealloc = (destructor)HeaderSink_dealloc,
    .tp_members = header_sink_members,
};

static int headers_register(PyObject *mod) {
    if (PyType_Ready(&HeaderSinkType) < 0) return -1;
    Py_INCREF(&HeaderSinkType);
    if (PyModule_AddObject(mod, "HeaderSink", (PyObject *)&HeaderSinkType) < 0) {
        Py_DECREF(&HeaderSinkType);
        return -1;
    }
    return 0;
}
