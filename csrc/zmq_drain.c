/* ==== A ZMQ SUB socket's queued KV-event batches into the index in one call (PrefixIndex.drain_socket) ====
 *
 * Included by index.c, after index_payload.c (it applies each payload with payload_apply). The ZMQ event source
 * (infera/transport/zmq_events.py) read a socket's batches through pyzmq, a getsockopt(EVENTS), two recv and a
 * getsockopt(RCVMORE) a batch, each a Python call, then decoded and applied each payload in its own call. This reads
 * them with libzmq itself, on pyzmq's socket handle (``zmq.Socket.underlying``), and applies each payload where it
 * lies, in the same order and with the same checks as the Python loop it replaces:
 *
 *   while getsockopt(EVENTS) & POLLIN: read one message (ZMQ_DONTWAIT; EAGAIN: drop what was read, ask again);
 *   3 frames [topic, 8-byte big-endian seq, payload] expected; seq < expected: skip (applied from a replay);
 *   seq > expected: a gap, the Python loop takes it; else apply, expected = seq + 1.
 *
 * What the C does not take ends the call and goes back to Python with the message: a gap, a seq frame not 8 bytes
 * long (or the last seq), a payload payload_apply declines (Python decodes it, the general way), a message of
 * another frame count (only the count comes back: it is logged and skipped). A payload whose apply fails is
 * returned with its exception (the batch is lost, as Python's delivery counts it). libzmq is the library pyzmq
 * loaded: the one libzmq among the process's loaded objects (dl_iterate_phdr), its functions resolved with dlsym; a
 * process with none loaded, or two, gets None from zmq_ready and the Python loop. */

#include <dlfcn.h>
#include <errno.h>
#include <link.h>

#define ZD_EVENTS 15 /* ZMQ_EVENTS */
#define ZD_POLLIN 1
#define ZD_DONTWAIT 1

typedef struct {
    _Alignas(void *) unsigned char _[64]; /* zmq_msg_t (libzmq 4.x: 64 bytes, pointer-aligned) */
} zd_msg;

static struct {
    int ok;
    int (*getsockopt)(void *, int, void *, size_t *);
    int (*msg_init)(zd_msg *);
    int (*msg_recv)(zd_msg *, void *, int);
    void *(*msg_data)(zd_msg *);
    size_t (*msg_size)(const zd_msg *);
    int (*msg_more)(const zd_msg *);
    int (*msg_close)(zd_msg *);
    int (*errno_)(void);
    const char *(*strerror)(int);
    void (*version)(int *, int *, int *);
    char path[4096];
} zd;

/* Counts the loaded objects named libzmq*, the first's path kept. */
static int zd_find(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    const char *name = info->dlpi_name, *base = name == NULL ? NULL : strrchr(name, '/');
    base = base == NULL ? name : base + 1;
    if (base != NULL && strncmp(base, "libzmq", 6) == 0 && strlen(name) < sizeof zd.path) {
        if (++*(int *)data == 1) strcpy(zd.path, name);
    }
    return 0;
}

/* Resolve libzmq's functions (once found): 1 ready, 0 not (no libzmq loaded, or a symbol missing). */
static int zd_load(void) {
    if (zd.ok) return 1; /* not found: looked for again at the next call (pyzmq may be imported since) */
    int found = 0;
    dl_iterate_phdr(zd_find, &found);
    if (found != 1) return 0; /* none, or two: which one pyzmq's sockets belong to is not known */
    void *h = dlopen(zd.path, RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL) return 0;
#define ZD_SYM(field, name)                                   \
    if ((*(void **)&zd.field = dlsym(h, name)) == NULL) return 0;
    ZD_SYM(getsockopt, "zmq_getsockopt")
    ZD_SYM(msg_init, "zmq_msg_init")
    ZD_SYM(msg_recv, "zmq_msg_recv")
    ZD_SYM(msg_data, "zmq_msg_data")
    ZD_SYM(msg_size, "zmq_msg_size")
    ZD_SYM(msg_more, "zmq_msg_more")
    ZD_SYM(msg_close, "zmq_msg_close")
    ZD_SYM(errno_, "zmq_errno")
    ZD_SYM(strerror, "zmq_strerror")
    ZD_SYM(version, "zmq_version")
#undef ZD_SYM
    zd.ok = 1;
    return 1;
}

/* zmq_ready() -> (path, (major, minor, patch)) of the libzmq this drains with, or None when there is none. */
static PyObject *zmq_ready(PyObject *self, PyObject *unused) {
    if (!zd_load()) Py_RETURN_NONE;
    int a, b, c;
    zd.version(&a, &b, &c);
    return Py_BuildValue("(s(iii))", zd.path, a, b, c);
}

/* The exception raised (normalized, with its traceback), the error indicator cleared. */
static PyObject *zd_take_error(void) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    if (tb != NULL && ev != NULL) PyException_SetTraceback(ev, tb);
    Py_XDECREF(et);
    Py_XDECREF(tb);
    return ev;
}

/* libzmq's error (errno) as an OSError instance, or NULL with an error set. */
static PyObject *zd_error(void) {
    int e = zd.errno_();
    return PyObject_CallFunction(PyExc_OSError, "is", e, zd.strerror(e));
}

enum { ZD_EMPTY = 0, ZD_MESSAGE = 1, ZD_FAILED = 2, ZD_FRAMES = 3, ZD_DECLINED = 4, ZD_BROKEN = 5 };

static void zd_close(zd_msg *msgs, int nf) {
    for (int k = 0; k < nf && k < 3; k++) zd.msg_close(&msgs[k]);
}

/* What one three-frame message did to a drain's run (this file's loop over a libzmq socket and csrc/zmtp_drain.c's over
 * a ZMTP stream): ZD_TAKEN, applied or below ``expected`` (already applied from a replay), go on; ZD_RAISED, its apply
 * raised: *extra is (seq, the exception), its counts and touched hashes are dropped (as Python's apply_payload's raise
 * drops them) and ``expected`` is past it; ZD_LEFT, a gap, an odd seq frame or a payload the C declines: nothing
 * changed, Python's loop takes the message whole. -1 with an exception set on an error of its own. */
#define ZD_TAKEN 0
#define ZD_RAISED 1
#define ZD_LEFT 2

typedef struct {
    int any;             /* no seq expected yet */
    uint64_t expected;   /* else the next seq */
    Py_ssize_t n;        /* batches applied */
    double ts;           /* the last applied batch's ts (0.0 when n is 0) */
    Py_ssize_t counts[5];
    PyObject *touched;   /* the applied batches' touched hashes, concatenated */
} zd_run;

static int zd_step(zd_run *r, Tables *t, Py_ssize_t size, const unsigned char *sq, size_t sq_size,
                   const unsigned char *payload, size_t payload_size, PyObject **extra) {
    uint64_t seq = 0;
    if (sq_size != 8) return ZD_LEFT;
    for (int k = 0; k < 8; k++) seq = (seq << 8) | sq[k];
    if (seq == UINT64_MAX) return ZD_LEFT; /* seq + 1 must fit */
    if (!r->any && seq < r->expected) return ZD_TAKEN;
    if (!r->any && seq != r->expected) return ZD_LEFT;
    Py_ssize_t saved[5];
    Py_ssize_t mark = PyList_GET_SIZE(r->touched);
    double bts = 0.0;
    memcpy(saved, r->counts, sizeof saved);
    int applied = payload_apply(t, payload, (Py_ssize_t)payload_size, size, r->counts, r->touched, &bts);
    if (applied == 0) return ZD_LEFT;
    if (applied > 0) {
        r->n++;
        r->ts = bts;
    } else {
        memcpy(r->counts, saved, sizeof saved);
        PyObject *exc = zd_take_error();
        if (exc == NULL || PyList_SetSlice(r->touched, mark, PyList_GET_SIZE(r->touched), NULL) < 0) {
            Py_XDECREF(exc);
            return -1;
        }
        if ((*extra = Py_BuildValue("(KN)", (unsigned long long)seq, exc)) == NULL) return -1;
    }
    r->any = 0;
    r->expected = seq + 1;
    return applied > 0 ? ZD_TAKEN : ZD_RAISED;
}

/* A drain's run started from its arguments ``expected, the tables (ten), size`` at ``args``; 0, or -1 with an exception
 * set (``run->touched`` then NULL). */
static int zd_begin(zd_run *run, PyObject *const *args, Tables *t, Py_ssize_t *size) {
    memset(run, 0, sizeof *run);
    run->any = args[0] == Py_None;
    if (!run->any) {
        run->expected = PyLong_AsUnsignedLongLong(args[0]);
        if (run->expected == (uint64_t)-1 && PyErr_Occurred()) return -1;
    }
    if (tables(args + 1, t) < 0) return -1;
    *size = PyLong_AsSsize_t(args[11]);
    if (*size == -1 && PyErr_Occurred()) return -1;
    return (run->touched = PyList_New(0)) == NULL ? -1 : 0;
}

/* The answer of a drain (drain_socket, drain_stream): (status, expected or None, n, ts, the five counts, touched,
 * extra); steals ``extra`` (NULL: None). */
static PyObject *zd_answer(zd_run *r, int status, PyObject *extra) {
    if (extra == NULL) {
        extra = Py_None;
        Py_INCREF(extra);
    }
    PyObject *exp = r->any ? (Py_INCREF(Py_None), Py_None) : PyLong_FromUnsignedLongLong(r->expected);
    if (exp == NULL) {
        Py_DECREF(extra);
        return NULL;
    }
    return Py_BuildValue("(iNndnnnnnON)", status, exp, r->n, r->ts, r->counts[0], r->counts[1], r->counts[2],
                         r->counts[3], r->counts[4], r->touched, extra);
}

/* drain_socket(handle, expected, blocks, media, extra, lower, predicted, holders, shared, watched, guess_masks, bit,
 *              block_size)
 *   -> (status, expected, n, ts, stored, removed, orphans, unknown, mismatched, touched, extra)
 * ``handle``: the libzmq socket's address; ``expected``: the next seq (None: any). Applies every queued batch in
 * sequence to the worker's tables (apply_payload's) and stops at the first thing it leaves to Python, ``status``:
 * ZD_EMPTY (the socket says nothing is queued; extra None), ZD_MESSAGE (extra: the message's three frames, not yet
 * looked at past the frame count: Python's loop takes it whole), ZD_FAILED (extra: (seq, the exception) of a batch
 * whose apply failed, taken off the socket: expected is past it), ZD_FRAMES (extra: the frame count of a message
 * taken off the socket and not 3), ZD_DECLINED (the worker has blocks in other tiers: nothing read), ZD_BROKEN
 * (extra: libzmq's error as an OSError, to raise: the socket failed). ``n`` batches were applied, the last's ts
 * ``ts`` (0.0 when n is 0), their counts summed and their touched hashes concatenated (what apply_payload returns
 * per batch); ``expected`` the next seq after them (None: still any). */
static PyObject *drain_socket(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Tables t;
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "drain_socket takes 13 arguments");
        return NULL;
    }
    if (!zd_load()) {
        PyErr_SetString(PyExc_RuntimeError, "drain_socket: no libzmq loaded");
        return NULL;
    }
    void *sock = PyLong_AsVoidPtr(args[0]);
    if (sock == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "drain_socket: a null socket");
        return NULL;
    }
    zd_run run;
    Py_ssize_t size;
    if (zd_begin(&run, args + 1, &t, &size) < 0) return NULL;
    int status = ZD_EMPTY;
    PyObject *extra = NULL, *out = NULL;
    zd_msg msgs[3];
    if (PyDict_GET_SIZE(t.media)) {
        status = ZD_DECLINED;
        goto answer;
    }
    for (;;) {
        int events = 0;
        size_t len = sizeof events;
        if (zd.getsockopt(sock, ZD_EVENTS, &events, &len) != 0) {
            status = ZD_BROKEN;
            if ((extra = zd_error()) == NULL) goto fail;
            break;
        }
        if (!(events & ZD_POLLIN)) break;
        int nf = 0, more = 1, again = 0;
        while (more) {
            zd_msg m;
            zd.msg_init(&m);
            if (zd.msg_recv(&m, sock, ZD_DONTWAIT) < 0) {
                int e = zd.errno_();
                zd.msg_close(&m);
                zd_close(msgs, nf);
                if (e != EAGAIN) {
                    status = ZD_BROKEN;
                    if ((extra = zd_error()) == NULL) goto fail;
                }
                again = 1;
                break;
            }
            more = zd.msg_more(&m);
            if (nf < 3) msgs[nf] = m;
            else zd.msg_close(&m);
            nf++;
        }
        if (status == ZD_BROKEN) break;
        if (again) continue; /* Python's loop: the frames read so far are dropped, the socket asked again */
        if (nf != 3) {
            zd_close(msgs, nf);
            status = ZD_FRAMES;
            if ((extra = PyLong_FromLong(nf)) == NULL) goto fail;
            break;
        }
        int step = zd_step(&run, &t, size, zd.msg_data(&msgs[1]), zd.msg_size(&msgs[1]), zd.msg_data(&msgs[2]),
                           zd.msg_size(&msgs[2]), &extra);
        if (step != ZD_LEFT) zd_close(msgs, 3);
        if (step < 0) goto fail;
        if (step == ZD_TAKEN) continue;
        if (step == ZD_RAISED) {
            status = ZD_FAILED;
            break;
        }
        /* a gap, an odd seq frame, a payload the C declines: Python's loop takes the message whole */
        status = ZD_MESSAGE;
        if ((extra = PyList_New(3)) == NULL) {
            zd_close(msgs, 3);
            goto fail;
        }
        for (int k = 0; k < 3; k++) {
            PyObject *b = PyBytes_FromStringAndSize(zd.msg_data(&msgs[k]), (Py_ssize_t)zd.msg_size(&msgs[k]));
            zd.msg_close(&msgs[k]);
            if (b == NULL) {
                for (int j = k + 1; j < 3; j++) zd.msg_close(&msgs[j]);
                goto fail;
            }
            PyList_SET_ITEM(extra, k, b);
        }
        break;
    }
answer:
    out = zd_answer(&run, status, extra);
    extra = NULL;
fail:
    Py_XDECREF(extra);
    Py_DECREF(run.touched);
    return out;
}

static PyMethodDef drain_methods[] = {
    {"zmq_ready", zmq_ready, METH_NOARGS, NULL},
    {"drain_socket", (PyCFunction)(void (*)(void))drain_socket, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static int add_drain16(PyObject *mod) { return PyModule_AddFunctions(mod, drain_methods); }
