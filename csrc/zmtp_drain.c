/* ==== An engine's KV-event PUB read over ZMTP from a plain TCP socket into the index (PrefixIndex.drain_stream) ====
 *
 * Included by index.c, after zmq_drain.c (its status codes, payload_apply's use and its error helpers). The ZMTP
 * reader (infera/transport/zmtp.py) holds a non-blocking TCP socket subscribed to an engine's PUB and a bytearray of
 * the bytes read and not yet parsed, always starting at a message's first frame. This takes every whole message
 * off them, reading the socket until it would block, and applies each as zmq_drain.c's drain_socket does a message
 * off a libzmq socket, with the same checks and what it leaves to Python:
 *
 *   frames: flags byte (MORE 1, LONG 2, COMMAND 4), size (1 byte, or 8 big-endian when LONG), body;
 *   3 frames [topic, 8-byte big-endian seq, payload] expected; seq < expected: skip (applied from a replay);
 *   seq > expected: a gap, the Python loop takes it; else apply, expected = seq + 1.
 *
 * A payload is applied where it lies (in the read chunk, or in the bytearray when it spans reads); what is left
 * when the call ends (a message not all there yet) is kept in the bytearray. Beyond drain_socket's answers: a
 * command (PING, ...) at the head ends the call with nothing consumed (ZD_COMMAND: Python answers it), and the
 * connection's end is ZD_BROKEN with an OSError (the peer closed it: ConnectionResetError; a command inside a
 * message: OSError(EPROTO)), after every whole message before it was taken. */

#include <sys/epoll.h>
#include <time.h>
#include <sys/socket.h>

#define ZT_MORE 1
#define ZT_LONG 2
#define ZT_COMMAND 4
#define ZT_CHUNK 65536

enum { ZD_COMMAND = 6 };

typedef struct {
    const unsigned char *body[3];
    size_t size[3];
    size_t end;  /* the bytes it takes, from its first frame's flags */
    int nf;      /* its frames */
    int command; /* a command (one frame), not a message */
} zt_unit;

/* The message or command at d[0..len): 1 whole (u filled), 0 not all there yet, -1 a command inside a message. */
static int zt_split(const unsigned char *d, size_t len, zt_unit *u) {
    size_t pos = 0;
    u->nf = 0;
    u->command = 0;
    for (;;) {
        if (len - pos < 2) return 0;
        unsigned flags = d[pos];
        uint64_t size = 0;
        if (flags & ZT_LONG) {
            if (len - pos < 9) return 0;
            for (int k = 1; k <= 8; k++) size = (size << 8) | d[pos + k];
            pos += 9;
        } else {
            size = d[pos + 1];
            pos += 2;
        }
        if (size > len - pos) return 0;
        if (flags & ZT_COMMAND) {
            if (u->nf) return -1;
            u->command = 1;
            u->end = pos + (size_t)size;
            return 1;
        }
        if (u->nf < 3) {
            u->body[u->nf] = d + pos;
            u->size[u->nf] = (size_t)size;
        }
        if (u->nf < INT_MAX) u->nf++;
        pos += (size_t)size;
        if (!(flags & ZT_MORE)) {
            u->end = pos;
            return 1;
        }
    }
}

/* The unparsed data[pos..len) left in ``buf`` as its whole content (data is buf's own bytes, or the read chunk
 * when buf was empty): 0, or -1 with an error set. */
static int zt_keep(PyObject *buf, const unsigned char *data, size_t pos, size_t len, int in_chunk) {
    size_t rest = len - pos;
    if (in_chunk) {
        if (PyByteArray_Resize(buf, (Py_ssize_t)rest) < 0) return -1;
        if (rest) memcpy(PyByteArray_AS_STRING(buf), data + pos, rest);
        return 0;
    }
    if (pos == 0) return 0;
    if (rest) memmove(PyByteArray_AS_STRING(buf), data + pos, rest);
    return PyByteArray_Resize(buf, (Py_ssize_t)rest);
}

/* An OSError(errno, text) instance, or NULL with an error set. */
static PyObject *zt_oserror(int e, const char *text) {
    return PyObject_CallFunction(PyExc_OSError, "is", e, text == NULL ? strerror(e) : text);
}

/* drain_stream(fd, buffer, expected, blocks, media, extra, lower, predicted, holders, shared, watched, guess_masks,
 *              bit, block_size)
 *   -> (status, expected, n, ts, stored, removed, orphans, unknown, mismatched, touched, extra)
 * drain_socket's answer (zmq_drain.c) for the ZMTP stream on ``fd`` with ``buffer`` (a bytearray) holding what was
 * read of it and not parsed; ZD_COMMAND: a command is at the head, nothing taken of it (extra None). */
static PyObject *zt_drain(PyObject *const *args, int settled);

static PyObject *drain_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "drain_stream takes 14 arguments");
        return NULL;
    }
    return zt_drain(args, 0);
}

/* drain_stream's drain; ``settled``: the caller's epoll_wait saw no end of the peer (no EPOLLRDHUP, EPOLLHUP or
 * EPOLLERR), so a read that returns less than it asked for ends the drain (ZD_EMPTY) without the read that would
 * answer EAGAIN: the socket's queue was empty when that read ran, and what arrives after it signals the epoll again
 * (a peer's end that came before the epoll_wait is still read in this call, after the bytes before it). */
static PyObject *zt_drain(PyObject *const *args, int settled) {
    Tables t;
    long fd = PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    if (fd < 0 || fd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "drain_stream: not a descriptor");
        return NULL;
    }
    PyObject *buf = args[1];
    if (!PyByteArray_CheckExact(buf)) {
        PyErr_SetString(PyExc_TypeError, "drain_stream: the buffer must be a bytearray");
        return NULL;
    }
    zd_run run;
    Py_ssize_t size;
    if (zd_begin(&run, args + 2, &t, &size) < 0) return NULL;
    int status = ZD_EMPTY;
    PyObject *extra = NULL, *out = NULL;
    if (PyDict_GET_SIZE(t.media)) {
        status = ZD_DECLINED;
        goto answer;
    }
    unsigned char chunk[ZT_CHUNK];
    const unsigned char *data = (const unsigned char *)PyByteArray_AS_STRING(buf);
    size_t len = (size_t)PyByteArray_GET_SIZE(buf), pos = 0;
    int in_chunk = 0, short_read = 0;
    for (;;) {
        zt_unit u;
        int got = zt_split(data + pos, len - pos, &u);
        if (got < 0) {
            status = ZD_BROKEN;
            if ((extra = zt_oserror(EPROTO, "a ZMTP command inside a message")) == NULL) goto fail;
            break;
        }
        if (got == 0) { /* keep the rest, read more */
            if (zt_keep(buf, data, pos, len, in_chunk) < 0) goto fail;
            data = (const unsigned char *)PyByteArray_AS_STRING(buf);
            len = (size_t)PyByteArray_GET_SIZE(buf);
            pos = 0;
            in_chunk = 0;
            if (settled && short_read) break; /* ZD_EMPTY: the queue was empty at the last read */
            ssize_t r = recv((int)fd, chunk, sizeof chunk, MSG_DONTWAIT);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break; /* ZD_EMPTY */
            if (r <= 0) {
                status = ZD_BROKEN;
                extra = r == 0 ? zt_oserror(ECONNRESET, "the peer closed the connection") : zt_oserror(errno, NULL);
                if (extra == NULL) goto fail;
                break;
            }
            short_read = (size_t)r < sizeof chunk;
            if (len == 0) { /* parsed where it was read; only a partial message at the end is copied */
                data = chunk;
                len = (size_t)r;
                in_chunk = 1;
            } else {
                if (PyByteArray_Resize(buf, (Py_ssize_t)(len + (size_t)r)) < 0) goto fail;
                memcpy(PyByteArray_AS_STRING(buf) + len, chunk, (size_t)r);
                data = (const unsigned char *)PyByteArray_AS_STRING(buf);
                len += (size_t)r;
            }
            continue;
        }
        if (u.command) {
            status = ZD_COMMAND;
            break;
        }
        if (u.nf != 3) {
            pos += u.end;
            status = ZD_FRAMES;
            if ((extra = PyLong_FromLong(u.nf)) == NULL) goto fail;
            break;
        }
        int step = zd_step(&run, &t, size, u.body[1], u.size[1], u.body[2], u.size[2], &extra);
        if (step < 0) goto fail;
        if (step != ZD_LEFT) pos += u.end;
        if (step == ZD_TAKEN) continue;
        if (step == ZD_RAISED) {
            status = ZD_FAILED;
            break;
        }
        /* a gap, an odd seq frame, a payload the C declines: Python's loop takes the message whole */
        status = ZD_MESSAGE;
        if ((extra = PyList_New(3)) == NULL) goto fail;
        for (int k = 0; k < 3; k++) {
            PyObject *b = PyBytes_FromStringAndSize((const char *)u.body[k], (Py_ssize_t)u.size[k]);
            if (b == NULL) goto fail;
            PyList_SET_ITEM(extra, k, b);
        }
        pos += u.end;
        break;
    }
    if (zt_keep(buf, data, pos, len, in_chunk) < 0) goto fail;
answer:
    out = zd_answer(&run, status, extra);
    extra = NULL;
fail:
    Py_XDECREF(extra);
    Py_DECREF(run.touched);
    return out;
}

/* ``obj.<name> += n`` (nothing when n is 0): 0, or -1 with an error set. */
static int zt_add(PyObject *obj, PyObject *name, Py_ssize_t n) {
    if (n == 0) return 0;
    PyObject *was = PyObject_GetAttr(obj, name), *sum = NULL;
    if (was == NULL) return -1;
    PyObject *add = PyLong_FromSsize_t(n);
    if (add != NULL) sum = PyNumber_Add(was, add);
    Py_DECREF(was);
    Py_XDECREF(add);
    if (sum == NULL) return -1;
    int bad = PyObject_SetAttr(obj, name, sum);
    Py_DECREF(sum);
    return bad;
}

/* time.time(): the wall clock in seconds, as a float (NULL with an error set). */
static PyObject *zt_wall(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    return PyFloat_FromDouble((double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
}

/* A reader's record of arrivals (drain_ready's ``book``): dicts by worker id, and the time to record; ``when`` NULL:
 * ``clock()`` read at the first drain that applied batches (the reference then the struct's: zt_unbook drops it). */
typedef struct {
    PyObject *batches, *last, *owed, *when, *clock;
} zt_bookref;

static void zt_unbook(zt_bookref *bk) {
    if (bk != NULL && bk->clock != NULL) Py_CLEAR(bk->when);
}

/* What PrefixIndex._applied and the book's arrival do after a drain of ``worker`` (state ``st``) that applied
 * batches: ``ans`` its answer; ``arrived`` NULL: not kept. 0, or -1 with an error set. */
static int zt_book(PyObject *ans, PyObject *worker, PyObject *wid, PyObject *counters, PyObject *now, zt_bookref *bk,
                   PyObject *touched, PyObject *arrived) {
    static PyObject *s_names[5], *s_orphans, *s_ts, *s_at;
    if (s_at == NULL) {
        const char *names[5] = {"block_stored", "block_removed", "orphan_blocks", "unknown_removed",
                                "block_size_mismatch"};
        for (int k = 0; k < 5; k++)
            if ((s_names[k] = PyUnicode_InternFromString(names[k])) == NULL) return -1;
        if ((s_orphans = PyUnicode_InternFromString("orphan_blocks")) == NULL ||
            (s_ts = PyUnicode_InternFromString("last_event_ts")) == NULL ||
            (s_at = PyUnicode_InternFromString("last_applied_at")) == NULL)
            return -1;
    }
    PyObject *n = PyTuple_GET_ITEM(ans, 2);
    for (int k = 0; k < 5; k++) {
        Py_ssize_t c = PyLong_AsSsize_t(PyTuple_GET_ITEM(ans, 4 + k));
        if (c == -1 && PyErr_Occurred()) return -1;
        if (zt_add(counters, s_names[k], c) < 0) return -1;
        if (k == 2 && zt_add(worker, s_orphans, c) < 0) return -1;
    }
    PyObject *hashes = PyTuple_GET_ITEM(ans, 9);
    if (PyList_GET_SIZE(hashes) &&
        PyList_SetSlice(touched, PyList_GET_SIZE(touched), PyList_GET_SIZE(touched), hashes) < 0)
        return -1;
    if (PyObject_SetAttr(worker, s_ts, PyTuple_GET_ITEM(ans, 3)) < 0) return -1;
    PyObject *at = now == Py_None ? zt_wall() : (Py_INCREF(now), now);
    if (at == NULL) return -1;
    int bad = PyObject_SetAttr(worker, s_at, at);
    Py_DECREF(at);
    if (bad < 0) return -1;
    if (arrived != NULL) {
        PyObject *item = PyTuple_Pack(2, wid, n);
        if (item == NULL) return -1;
        bad = PyList_Append(arrived, item);
        Py_DECREF(item);
        if (bad < 0) return -1;
    }
    if (bk == NULL) return 0;
    /* the book: (batches per worker, the time of each worker's last batch, the workers owed a batch, that time) */
    if (bk->when == NULL && (bk->when = PyObject_CallNoArgs(bk->clock)) == NULL) return -1;
    PyObject *batches = bk->batches, *last = bk->last, *owed = bk->owed, *when = bk->when;
    PyObject *had = PyDict_GetItemWithError(batches, wid), *sum;
    if (had == NULL && PyErr_Occurred()) return -1;
    if ((sum = had == NULL ? (Py_INCREF(n), n) : PyNumber_Add(had, n)) == NULL) return -1;
    bad = PyDict_SetItem(batches, wid, sum);
    Py_DECREF(sum);
    if (bad < 0 || PyDict_SetItem(last, wid, when) < 0) return -1;
    int in = PyDict_Contains(owed, wid);
    return in < 0 ? -1 : in ? PyDict_DelItem(owed, wid) : 0;
}

/* drain_ready(epfd, streams, workers, block_size, counters, now, book) -> (others, drained, arrived, touched)
 * A decision's catch-up in one call: epoll_wait(epfd, 0), then drain_stream on every ready descriptor that
 * ``streams`` (descriptor -> the link's state: ``worker_id``, ``buffer``, ``expected``, ``busy``) holds, not busy,
 * for a worker in ``workers`` (the index's: worker id -> its WorkerTable, whose ``tables`` are drain_stream's ten),
 * its ``expected`` set to the drain's. A drain that applied batches is booked here as PrefixIndex._applied books
 * one: its counts added to ``counters`` (the index's IndexCounters) and its orphans to the worker's, its
 * ``last_event_ts`` and ``last_applied_at`` set (``now``, or time.time() after the drain when None), its touched
 * router hashes added to ``touched``; and, unless ``book`` is None, in ``book`` = (batches, last, owed, when),
 * dicts by worker id: its batches added to ``batches``, ``last`` set to ``when``, its entry in ``owed`` dropped.
 * ``others``: the ready descriptors it did not drain (the source runs their readers: a libzmq link, a busy one, a
 * worker the index does not know yet); ``drained``: (state, status, extra) of each drain that ended other than
 * ZD_EMPTY; ``arrived``: (worker id, batches) of each drain that applied any; all three in epoll's order. A drain
 * ends without the read that answers EAGAIN when its epoll event says nothing of the peer's end (zt_drain's
 * ``settled``): a stream registered with EPOLLRDHUP has a peer's end that came before the epoll_wait reported in
 * this call, after the bytes before it; one that comes later, at the next. */
#define ZT_EVENTS 256
/* drain_ready's work after its arguments' checks: the ready streams drained, the answers appended to ``others``,
 * ``drained``, ``arrived`` (NULL: not kept) and ``touched``. 0, or -1 with an error set. */
static int zt_ready(int epfd, PyObject *streams, PyObject *workers, PyObject *size, PyObject *counters, PyObject *now,
                    zt_bookref *book, PyObject *others, PyObject *drained, PyObject *arrived, PyObject *touched) {
    static PyObject *s_worker_id, *s_buffer, *s_expected, *s_busy, *s_tables;
    if (s_tables == NULL) {
        if ((s_worker_id = PyUnicode_InternFromString("worker_id")) == NULL ||
            (s_buffer = PyUnicode_InternFromString("buffer")) == NULL ||
            (s_expected = PyUnicode_InternFromString("expected")) == NULL ||
            (s_busy = PyUnicode_InternFromString("busy")) == NULL ||
            (s_tables = PyUnicode_InternFromString("tables")) == NULL)
            return -1;
    }
    struct epoll_event evs[ZT_EVENTS];
    int r;
    do {
        r = epoll_wait(epfd, evs, ZT_EVENTS, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        for (int i = 0; i < r; i++) {
            PyObject *fd = PyLong_FromLong(evs[i].data.fd);
            if (fd == NULL) return -1;
            PyObject *st = PyDict_GetItemWithError(streams, fd), *worker = NULL, *wid = NULL, *busy = NULL;
            if (st == NULL && PyErr_Occurred()) goto fd_fail;
            if (st != NULL) {
                if ((busy = PyObject_GetAttr(st, s_busy)) == NULL) goto fd_fail;
                int is_busy = PyObject_IsTrue(busy);
                Py_DECREF(busy);
                if (is_busy < 0) goto fd_fail;
                if (!is_busy) {
                    if ((wid = PyObject_GetAttr(st, s_worker_id)) == NULL) goto fd_fail;
                    worker = PyDict_GetItemWithError(workers, wid);
                    if (worker == NULL && PyErr_Occurred()) goto fd_fail;
                }
            }
            if (worker == NULL) {
                Py_XDECREF(wid);
                int bad = PyList_Append(others, fd);
                Py_DECREF(fd);
                if (bad < 0) return -1;
                continue;
            }
            PyObject *tables = PyObject_GetAttr(worker, s_tables), *buf = NULL, *exp = NULL, *ans = NULL;
            if (tables == NULL) goto fd_fail;
            if (!PyTuple_CheckExact(tables) || PyTuple_GET_SIZE(tables) != 10) {
                PyErr_SetString(PyExc_TypeError, "drain_ready: a worker's tables must be a tuple of ten");
                goto st_fail;
            }
            if ((buf = PyObject_GetAttr(st, s_buffer)) == NULL || (exp = PyObject_GetAttr(st, s_expected)) == NULL)
                goto st_fail;
            PyObject *a[14] = {fd, buf, exp};
            for (int k = 0; k < 10; k++) a[3 + k] = PyTuple_GET_ITEM(tables, k);
            a[13] = size;
            if ((ans = zt_drain(a, !(evs[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)))) == NULL) goto st_fail;
            if (PyObject_SetAttr(st, s_expected, PyTuple_GET_ITEM(ans, 1)) < 0) goto st_fail;
            Py_ssize_t n = PyLong_AsSsize_t(PyTuple_GET_ITEM(ans, 2));
            if (n && zt_book(ans, worker, wid, counters, now, book, touched, arrived) < 0) goto st_fail;
            if (PyLong_AsLong(PyTuple_GET_ITEM(ans, 0)) != ZD_EMPTY) {
                PyObject *item = PyTuple_Pack(3, st, PyTuple_GET_ITEM(ans, 0), PyTuple_GET_ITEM(ans, 10));
                if (item == NULL || PyList_Append(drained, item) < 0) {
                    Py_XDECREF(item);
                    goto st_fail;
                }
                Py_DECREF(item);
            }
            Py_DECREF(ans);
            Py_DECREF(exp);
            Py_DECREF(buf);
            Py_DECREF(tables);
            Py_DECREF(wid);
            Py_DECREF(fd);
            continue;
        st_fail:
            Py_XDECREF(ans);
            Py_XDECREF(exp);
            Py_XDECREF(buf);
            Py_DECREF(tables);
        fd_fail:
            Py_XDECREF(wid);
            Py_DECREF(fd);
            return -1;
        }
    } while (r == ZT_EVENTS);
    return 0;
}

static PyObject *drain_ready(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "drain_ready takes 7 arguments");
        return NULL;
    }
    long epfd = PyLong_AsLong(args[0]);
    if (epfd == -1 && PyErr_Occurred()) return NULL;
    if (epfd < 0 || epfd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "drain_ready: not a descriptor");
        return NULL;
    }
    PyObject *streams = args[1], *workers = args[2], *counters = args[4], *now = args[5], *book = args[6];
    if (!PyDict_CheckExact(streams) || !PyDict_CheckExact(workers)) {
        PyErr_SetString(PyExc_TypeError, "drain_ready: streams and workers must be dicts");
        return NULL;
    }
    if (now != Py_None && !PyFloat_Check(now)) {
        PyErr_SetString(PyExc_TypeError, "drain_ready: now must be a float or None");
        return NULL;
    }
    if (book != Py_None) {
        if (!PyTuple_CheckExact(book) || PyTuple_GET_SIZE(book) != 4 || !PyDict_Check(PyTuple_GET_ITEM(book, 0)) ||
            !PyDict_Check(PyTuple_GET_ITEM(book, 1)) || !PyDict_Check(PyTuple_GET_ITEM(book, 2))) {
            PyErr_SetString(PyExc_TypeError, "drain_ready: book must be (dict, dict, dict, when) or None");
            return NULL;
        }
    }
    zt_bookref bk = {NULL, NULL, NULL, NULL, NULL};
    if (book != Py_None) {
        bk.batches = PyTuple_GET_ITEM(book, 0);
        bk.last = PyTuple_GET_ITEM(book, 1);
        bk.owed = PyTuple_GET_ITEM(book, 2);
        bk.when = PyTuple_GET_ITEM(book, 3);
    }
    PyObject *others = PyList_New(0), *drained = PyList_New(0), *arrived = PyList_New(0), *touched = PyList_New(0);
    PyObject *out = NULL;
    if (others != NULL && drained != NULL && arrived != NULL && touched != NULL &&
        zt_ready((int)epfd, streams, workers, args[3], counters, now, book == Py_None ? NULL : &bk, others, drained,
                 arrived, touched) == 0)
        out = PyTuple_Pack(4, others, drained, arrived, touched);
    Py_XDECREF(others);
    Py_XDECREF(drained);
    Py_XDECREF(arrived);
    Py_XDECREF(touched);
    return out;
}

static PyMethodDef stream_methods[] = {
    {"drain_stream", (PyCFunction)(void (*)(void))drain_stream, METH_FASTCALL, NULL},
    {"drain_ready", (PyCFunction)(void (*)(void))drain_ready, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static int add_stream17(PyObject *mod) { return PyModule_AddFunctions(mod, stream_methods); }
