/* ==== A prompt cache hit's new part in one call (infera/kv/prompt_cache.py, PromptCache._extend_native) ===========
 *
 * Included by prompt_cache.c (one extension module, infera.kv._native). What PromptCache.encode_within's Python lines
 * did one by one after the lookup found a stored prompt's cut, each step through the same C function as before:
 * the text past the cut decoded and encoded by the codec's packer (csrc/bpe.c's ``encode_chat``, called as any
 * Python callable), the stored ids before the cut copied and the new ones appended (an array('I')), every full
 * block's hash for the block sizes seen (``extend_u32``), the new cuts (``prompt_cuts``). So the ids, hashes and cuts
 * are those of the Python lines; what goes is a dozen interpreted lines and their objects per request, each costly
 * in a process that runs cold between requests (bench/README.md, "Issue 15, fourteenth round"). */

static PyObject *STR_FROMBYTES;

/* prompt_extend(data, start, base_ids, offset, packer, sizes, known, pos, first, last, names, tokens, state, window,
 * snap) -> (ids, complete, cuts):
 *   tail = data[start:].decode("utf-8", "surrogatepass") if start < len(data) else ""
 *   ids = base_ids[:offset]; ids.frombytes(packer(tail) if tail else b"")
 * ``packer``: a callable, or (packer, call, *rest) of 5 (an ASCII tail's ids are ``call(tail, *rest)``: the same
 * bytes without the packer's Python frame; any other tail's ``packer(tail)``)
 *   complete = {size: extend_u32(ids, known.get(size, []), size, offset // size) for size in sizes}
 *   cuts = prompt_cuts(data, start, ids, pos, first, last, names, tokens, state, window, snap)
 * ``sizes``: a tuple of ints; ``known``: a dict (block size -> list of hashes). */
static PyObject *prompt_extend(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 15 || !PyBytes_Check(args[0]) || !PyTuple_Check(args[5]) || !PyDict_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "prompt_extend(data: bytes, start, base_ids, offset, packer, sizes: tuple, "
                                         "known: dict, pos, first, last, names, tokens, state, window, snap)");
        return NULL;
    }
    PyObject *data = args[0], *sizes = args[5], *known = args[6];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), offset = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (start < 0 || start > n || offset < 0) {
        PyErr_SetString(PyExc_ValueError, "prompt_extend: 0 <= start <= len(data), offset >= 0");
        return NULL;
    }
    PyObject *ids = PySequence_GetSlice(args[2], 0, offset); /* a memcpy */
    if (ids == NULL) return NULL;
    PyObject *complete = NULL, *cuts = NULL;
    if (start < n) {
        PyObject *tail = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(data) + start, n - start, "surrogatepass");
        if (tail == NULL) goto fail;
        PyObject *packer = args[4], *packed;
        if (PyTuple_Check(packer) && PyTuple_GET_SIZE(packer) == 5) { /* (packer, call, *rest): ASCII to ``call`` */
            const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
            Py_ssize_t q = start;
            while (q < n && p[q] < 0x80) q++;
            if (q == n) {
                PyObject *call[4] = {tail, PyTuple_GET_ITEM(packer, 2), PyTuple_GET_ITEM(packer, 3),
                                     PyTuple_GET_ITEM(packer, 4)};
                packed = PyObject_Vectorcall(PyTuple_GET_ITEM(packer, 1), call, 4, NULL);
            } else {
                packed = PyObject_CallOneArg(PyTuple_GET_ITEM(packer, 0), tail);
            }
        } else {
            packed = PyObject_CallOneArg(packer, tail);
        }
        Py_DECREF(tail);
        if (packed == NULL) goto fail;
        PyObject *done = PyObject_CallMethodOneArg(ids, STR_FROMBYTES, packed);
        Py_DECREF(packed);
        if (done == NULL) goto fail;
        Py_DECREF(done);
    }
    complete = PyDict_New();
    if (complete == NULL) goto fail;
    for (Py_ssize_t s = 0; s < PyTuple_GET_SIZE(sizes); s++) {
        PyObject *size = PyTuple_GET_ITEM(sizes, s);
        Py_ssize_t bs = PyLong_AsSsize_t(size);
        if (bs == -1 && PyErr_Occurred()) goto fail;
        if (bs <= 0) {
            PyErr_SetString(PyExc_ValueError, "block sizes must be positive");
            goto fail;
        }
        PyObject *have = PyDict_GetItemWithError(known, size); /* borrowed */
        if (have == NULL && PyErr_Occurred()) goto fail;
        /* extend_u32 reads a list (what the entries keep); anything else as hashing.extend_hashes's list of it */
        PyObject *list = have == NULL ? PyList_New(0) : PyList_Check(have) ? Py_NewRef(have) : PySequence_List(have);
        PyObject *most = PyLong_FromSsize_t(offset / bs);
        PyObject *hashes = NULL;
        if (list != NULL && most != NULL) {
            PyObject *call[4] = {ids, list, size, most};
            hashes = extend_u32(self, call, 4);
        }
        Py_XDECREF(list);
        Py_XDECREF(most);
        if (hashes == NULL) goto fail;
        int bad = PyDict_SetItem(complete, size, hashes);
        Py_DECREF(hashes);
        if (bad < 0) goto fail;
    }
    PyObject *call[11] = {data, args[1], ids, args[7], args[8], args[9], args[10], args[11], args[12], args[13],
                          args[14]};
    cuts = prompt_cuts(self, call, 11);
    if (cuts == NULL) goto fail;
    PyObject *out = PyTuple_Pack(3, ids, complete, cuts);
    Py_DECREF(ids);
    Py_DECREF(complete);
    Py_DECREF(cuts);
    return out;
fail:
    Py_DECREF(ids);
    Py_XDECREF(complete);
    return NULL;
}
