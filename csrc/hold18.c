/* ==== One leg's hold in one call: the load ticket, the overlap statistic and the prediction (helper place18) =========
 *
 * Included by index.c after load.c and decide17.c (it uses begin_ticket, predict_map_prefetch and d17_hashes).
 * infera/router/legs.py's Legs.hold, with the lines it calls (LoadTracker.begin, RouterStats.observe_overlap,
 * PrefixIndex.predict, Predictions.add), as one C call from Legs.place: the prompt's hashes are read once while warm
 * (the ticket's references, then the prediction's expiries), and the four Python frames with their cold lines go
 * (issue 15's sixteenth round). The values, the clock's readings and their order are the Python lines':
 *
 *     wid, size = worker.instance_id, worker.kv_block_size
 *     hashes = ctx.hashes(size)
 *     max_tokens = 1 if role == "prefill" else ctx.max_tokens
 *     prefill_tokens = 0 if role == "decode" else max(0, ctx.prompt_tokens - overlap * size)
 *     tail_blocks = -(-(ctx.prompt_tokens - len(hashes) * size + max_tokens) // size)
 *     ticket = load.begin(wid, prefill_tokens, hashes, tail_blocks)
 *     if hashes:
 *         if role != "decode": stats.observe_overlap(overlap / len(hashes))
 *         index.predict(wid, hashes, ttl, clock())   # the prune when the heap's head is due, the worker's table,
 *                                                    # Predictions.add (predict_map_prefetch, the heap's entry)
 *     return ticket
 *
 * legs_hold(parts, worker, role, ctx, overlap) -> LoadTicket, where ``parts`` (built once by Legs, from
 * LoadTracker.hold_parts and PrefixIndex.predict_parts) is
 *     (loads, load clock, maxlen, legs clock, ttl, heap, prune, index workers, make worker, masks, seq, heappush,
 *      stats, OVERLAP_BUCKETS, RoutingContext) */

#define H18_PARTS 15

static PyObject *STR_H18_ID, *STR_H18_SIZE, *STR_H18_PREDICTED, *STR_H18_BIT, *STR_H18_HITS, *STR_H18_SUM,
    *STR_H18_COUNT;

/* Python's a // b for b != 0 */
static long long h18_floordiv(long long a, long long b) {
    long long q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

/* An int attribute of ``obj`` as a long long, -1 with an error set (a value of -1 is told apart by PyErr_Occurred) */
static long long h18_int_attr(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    long long out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return out;
}

/* RouterStats.observe_overlap(fraction): the first bound at or above it counted (bisect_left), the sum and count */
static int h18_observe(PyObject *stats, PyObject *buckets, double fraction) {
    Py_ssize_t nb = PyTuple_GET_SIZE(buckets), lo = 0, hi = nb;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        double b = PyFloat_AsDouble(PyTuple_GET_ITEM(buckets, mid));
        if (b == -1.0 && PyErr_Occurred()) return -1;
        if (b < fraction) lo = mid + 1;
        else hi = mid;
    }
    if (lo < nb) {
        PyObject *hits = PyObject_GetAttr(stats, STR_H18_HITS);
        if (hits == NULL) return -1;
        PyObject *was = PySequence_GetItem(hits, lo);
        PyObject *now = was != NULL ? PyNumber_Add(was, ONE) : NULL;
        int rc = now != NULL ? PySequence_SetItem(hits, lo, now) : -1;
        Py_XDECREF(was);
        Py_XDECREF(now);
        Py_DECREF(hits);
        if (rc < 0) return -1;
    }
    PyObject *f = PyFloat_FromDouble(fraction);
    if (f == NULL) return -1;
    PyObject *sum = PyObject_GetAttr(stats, STR_H18_SUM);
    PyObject *added = sum != NULL ? PyNumber_Add(sum, f) : NULL;
    Py_XDECREF(sum);
    Py_DECREF(f);
    int rc = added != NULL ? PyObject_SetAttr(stats, STR_H18_SUM, added) : -1;
    Py_XDECREF(added);
    if (rc < 0) return -1;
    PyObject *count = PyObject_GetAttr(stats, STR_H18_COUNT);
    PyObject *more = count != NULL ? PyNumber_Add(count, ONE) : NULL;
    Py_XDECREF(count);
    rc = more != NULL ? PyObject_SetAttr(stats, STR_H18_COUNT, more) : -1;
    Py_XDECREF(more);
    return rc;
}

/* PrefixIndex.predict(wid, hashes, ttl, now) on the C path: the prune when the heap's head is due, the worker's table
 * (made when new), Predictions.add's predict_map_prefetch and its heap entry (expiry, next(seq), wid, fresh) */
static int h18_predict(PyObject *const *p, PyObject *wid, PyObject *hashes, PyObject *now) {
    PyObject *ttl = p[4], *heap = p[5], *workers = p[7], *masks = p[9];
    if (PyList_GET_SIZE(heap) > 0) {
        PyObject *head = PyList_GET_ITEM(heap, 0);
        PyObject *first = PyTuple_Check(head) && PyTuple_GET_SIZE(head) > 0 ? PyTuple_GET_ITEM(head, 0) : NULL;
        if (first == NULL) {
            PyErr_SetString(PyExc_TypeError, "legs_hold: the expiry heap holds tuples");
            return -1;
        }
        int due = PyObject_RichCompareBool(first, now, Py_LE);
        if (due < 0) return -1;
        if (due) {
            PyObject *r = PyObject_CallFunctionObjArgs(p[6], now, workers, NULL);
            if (r == NULL) return -1;
            Py_DECREF(r);
        }
    }
    PyObject *worker = PyDict_GetItemWithError(workers, wid);
    if (worker != NULL) Py_INCREF(worker);
    else if (PyErr_Occurred() || (worker = PyObject_CallOneArg(p[8], wid)) == NULL) return -1;
    int positive = PyObject_RichCompareBool(ttl, ZERO, Py_GT);
    if (positive <= 0) {
        Py_DECREF(worker);
        return positive;
    }
    PyObject *expiry = PyNumber_Add(now, ttl), *predicted = NULL, *bit = NULL, *fresh = NULL, *seq = NULL, *entry = NULL;
    int rc = -1;
    if (expiry == NULL || (predicted = PyObject_GetAttr(worker, STR_H18_PREDICTED)) == NULL ||
        (bit = PyObject_GetAttr(worker, STR_H18_BIT)) == NULL) goto done;
    PyObject *args[5] = {predicted, masks, bit, hashes, expiry};
    if ((fresh = predict_map_prefetch(NULL, args, 5)) == NULL) goto done;
    if (PyList_GET_SIZE(fresh) > 0) {
        if ((seq = PyIter_Next(p[10])) == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "legs_hold: the sequence ended");
            goto done;
        }
        if ((entry = PyTuple_Pack(4, expiry, seq, wid, fresh)) == NULL) goto done;
        PyObject *r = PyObject_CallFunctionObjArgs(p[11], heap, entry, NULL);
        if (r == NULL) goto done;
        Py_DECREF(r);
    }
    rc = 0;
done:
    Py_DECREF(worker);
    Py_XDECREF(expiry);
    Py_XDECREF(predicted);
    Py_XDECREF(bit);
    Py_XDECREF(fresh);
    Py_XDECREF(seq);
    Py_XDECREF(entry);
    return rc;
}

static PyObject *legs_hold(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != H18_PARTS ||
        !PyUnicode_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "legs_hold(parts, worker, role, ctx, overlap)");
        return NULL;
    }
    PyObject *const *p = &PyTuple_GET_ITEM(args[0], 0);
    if (!PyList_CheckExact(p[5]) || !PyDict_CheckExact(p[7]) || !PyDict_CheckExact(p[9]) ||
        !PyTuple_CheckExact(p[13])) {
        PyErr_SetString(PyExc_TypeError, "legs_hold: parts are not the tracker's and the index's");
        return NULL;
    }
    PyObject *worker = args[1], *role = args[2], *ctx = args[3];
    int prefill_role = PyUnicode_CompareWithASCIIString(role, "prefill") == 0;
    int decode_role = PyUnicode_CompareWithASCIIString(role, "decode") == 0;
    long long overlap = PyLong_AsLongLong(args[4]);
    if (overlap == -1 && PyErr_Occurred()) return NULL;
    PyObject *wid = PyObject_GetAttr(worker, STR_H18_ID), *size = NULL, *hashes = NULL, *ticket = NULL;
    if (wid == NULL || (size = PyObject_GetAttr(worker, STR_H18_SIZE)) == NULL) goto done;
    if ((hashes = d17_hashes(ctx, size, p[14])) == NULL) goto done;
    long long bs = PyLong_AsLongLong(size);
    long long prompt = bs == -1 && PyErr_Occurred() ? -1 : h18_int_attr(ctx, STR_D_PROMPT_TOKENS);
    long long max_tokens = prefill_role ? 1 : (prompt == -1 && PyErr_Occurred()) ? -1 :
        h18_int_attr(ctx, STR_D_MAX_TOKENS);
    if (max_tokens == -1 && PyErr_Occurred()) goto done;
    Py_ssize_t n = PyObject_Size(hashes);
    if (n < 0) goto done;
    if (bs == 0) {
        PyErr_SetString(PyExc_ZeroDivisionError, "integer division or modulo by zero");
        goto done;
    }
    long long prefill = decode_role ? 0 : prompt - overlap * bs;
    if (prefill < 0) prefill = 0;
    long long tail = -h18_floordiv(-(prompt - (long long)n * bs + max_tokens), bs);
    ticket = begin_ticket(p[0], p[1], p[2], wid, prefill, hashes, tail);
    if (ticket == NULL || n == 0) goto done;
    if (!decode_role && h18_observe(p[12], p[13], (double)overlap / (double)n) < 0) goto fail;
    PyObject *now = PyObject_CallNoArgs(p[3]);
    if (now == NULL) goto fail;
    int rc = h18_predict(p, wid, hashes, now);
    Py_DECREF(now);
    if (rc < 0) goto fail;
done:
    Py_XDECREF(wid);
    Py_XDECREF(size);
    Py_XDECREF(hashes);
    return ticket;
fail:  /* as the Python lines: the ticket begun stays held (nothing returns it to end) */
    Py_CLEAR(ticket);
    goto done;
}

/* predict_expire(predicted, masks, bit, hashes, expiry) -> None: Predictions.prune's loop over one expired add's
 * hashes with the worker's expiries in a U64Map(True) (predict_map_add's), its drop inline:
 *
 *     for local in hashes:
 *         if predicted.get(local) == expiry:  # not extended since
 *             predicted.pop(local); mask = masks[local] ^ bit; masks[local] = mask if mask else (del)
 *
 * A routed prompt's ~170 hashes expire 120 s after it (PREDICTION_TTL), mostly extended since by later prompts: a
 * probe each, against a Python iteration and a method call each. */
static PyObject *predict_expire(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !IS_MAP(args[0]) || !((U64Map *)args[0])->objvals || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "predict_expire(predicted: U64Map(True), masks: dict, bit, hashes, expiry)");
        return NULL;
    }
    U64Map *m = (U64Map *)args[0];
    PyObject *masks = args[1], *bit = args[2], *expiry = args[4];
    PyObject *seq = PySequence_Fast(args[3], "predict_expire: hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t k = 0; k < n; k++) map_prefetch_obj(m, items[k]);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *local = items[k];
        Py_ssize_t i = map_lookup(m, local);
        if (i == -2) goto fail;
        if (i < 0) continue;
        PyObject *had = (PyObject *)(uintptr_t)m->slots[i].val;
        int same;
        if (PyFloat_CheckExact(had) && PyFloat_CheckExact(expiry)) {
            same = PyFloat_AS_DOUBLE(had) == PyFloat_AS_DOUBLE(expiry);
        } else {
            PyObject *r = PyObject_RichCompare(had, expiry, Py_EQ);
            same = r == NULL ? -1 : PyObject_IsTrue(r);
            Py_XDECREF(r);
        }
        if (same < 0) goto fail;
        if (!same) continue;
        map_unlink(m, i);
        Py_DECREF(had);  /* the map's reference */
        PyObject *mask = PyDict_GetItemWithError(masks, local);
        if (mask == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, local);
            goto fail;
        }
        PyObject *left = PyNumber_Xor(mask, bit);
        if (left == NULL) goto fail;
        int truth = PyObject_IsTrue(left), rc = truth < 0 ? -1 : truth ? PyDict_SetItem(masks, local, left) :
            PyDict_DelItem(masks, local);
        Py_DECREF(left);
        if (rc < 0) goto fail;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef hold18_methods[] = {
    {"legs_hold", (PyCFunction)(void (*)(void))legs_hold, METH_FASTCALL, NULL},
    {"predict_expire", (PyCFunction)(void (*)(void))predict_expire, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static int add_hold18(PyObject *mod) {
    PyObject **names[] = {&STR_H18_ID, &STR_H18_SIZE, &STR_H18_PREDICTED, &STR_H18_BIT, &STR_H18_HITS, &STR_H18_SUM,
                          &STR_H18_COUNT};
    const char *text[] = {"instance_id", "kv_block_size", "predicted", "bit", "overlap_hits", "overlap_sum",
                          "overlap_count"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        *names[k] = PyUnicode_InternFromString(text[k]);
        if (*names[k] == NULL) return -1;
    }
    return PyModule_AddFunctions(mod, hold18_methods);
}
