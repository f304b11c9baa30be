/* ==== A decision's KV catch-up as the source's one call, no Python frame of the feed's or the index's (helper intake20)
 *
 * Included by index.c, after zmtp_drain.c (drain_ready's work, zt_ready). The ZMQ source's catch-up called the feed's
 * ``on_ready``, which built its book (with its clock's time) and called the index's ``drain_ready``, which called the
 * C and passed the touched rows to ``_touch``: two Python frames and their tuples a decision, run cold live (the loop
 * wakes to each request after the engines and the client ran). The feed binds instead ``functools.partial(ready_sink,
 * workers, size, counters, batches, last, owed, clock, blind, post)`` (PrefixIndex.ready_sink): the source calls it
 * with its epoll descriptor and streams, and it does drain_ready's work with the book's time read from ``clock()`` at
 * the first drain that applied batches (none read when none did). Python is called back, ``post(arrived, touched)``,
 * only when something is left for it: touched router hashes (remembered walks' masks changed: the index's _touch) or,
 * while ``blind`` (the feed's set of workers logged as blind) is not empty, any arrival (the log line that a worker's
 * events flow again); ``arrived`` is then drain_ready's list, else empty. */

/* ready_sink(workers, size, counters, batches, last, owed, clock, blind, post, epfd, streams) -> (others, drained):
 * drain_ready(epfd, streams, workers, size, counters, None, (batches, last, owed, clock())) less its arrived and
 * touched, which go to ``post`` as said above. */
static PyObject *ready_sink(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "ready_sink takes 11 arguments");
        return NULL;
    }
    PyObject *workers = args[0], *size = args[1], *counters = args[2], *blind = args[7], *post = args[8];
    PyObject *streams = args[10];
    if (!PyDict_CheckExact(workers) || !PyDict_CheckExact(streams) || !PyDict_Check(args[3]) ||
        !PyDict_Check(args[4]) || !PyDict_Check(args[5]) || !PyAnySet_Check(blind) || !PyCallable_Check(args[6]) ||
        !PyCallable_Check(post)) {
        PyErr_SetString(PyExc_TypeError, "ready_sink(workers: dict, size, counters, batches: dict, last: dict, "
                                         "owed: dict, clock, blind: set, post, epfd, streams: dict)");
        return NULL;
    }
    long epfd = PyLong_AsLong(args[9]);
    if (epfd == -1 && PyErr_Occurred()) return NULL;
    if (epfd < 0 || epfd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "ready_sink: not a descriptor");
        return NULL;
    }
    zt_bookref bk = {args[3], args[4], args[5], NULL, args[6]};
    PyObject *others = PyList_New(0), *drained = PyList_New(0), *touched = PyList_New(0);
    PyObject *arrived = PySet_GET_SIZE(blind) ? PyList_New(0) : NULL, *out = NULL;
    if (others == NULL || drained == NULL || touched == NULL || (arrived == NULL && PySet_GET_SIZE(blind)))
        goto done;
    if (zt_ready((int)epfd, streams, workers, size, counters, Py_None, &bk, others, drained, arrived, touched) < 0)
        goto done;
    if (PyList_GET_SIZE(touched) || (arrived != NULL && PyList_GET_SIZE(arrived))) {
        PyObject *left = arrived != NULL ? arrived : PyList_New(0);
        PyObject *got = left == NULL ? NULL : PyObject_CallFunctionObjArgs(post, left, touched, NULL);
        if (left != arrived) Py_XDECREF(left);
        if (got == NULL) goto done;
        Py_DECREF(got);
    }
    out = PyTuple_Pack(2, others, drained);
done:
    zt_unbook(&bk);
    Py_XDECREF(others);
    Py_XDECREF(drained);
    Py_XDECREF(touched);
    Py_XDECREF(arrived);
    return out;
}

static PyMethodDef ready_methods[] = {
    {"ready_sink", (PyCFunction)(void (*)(void))ready_sink, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static int add_ready20(PyObject *mod) { return PyModule_AddFunctions(mod, ready_methods); }
