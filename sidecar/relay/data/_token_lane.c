/* TokenLane: one stream's steady token read, relayed and noted in one call, beside its one
   user (sidecar/relay/data/token_lane.py says when and why; its oracle is the Python relay
   path it stands for, tests/unit/relay/data/test_token_lane.py). The byte checks it makes are the ones
   sidecar/base/_speedups.c exports (sidecar/base/_bytes.h). */
#include "../../base/_bytes.h"
#include <limits.h>

/* ---- TokenLane ---------------------------------------------------------------------------

   One stream's steady token read in one call (sidecar/relay/data/token_lane.py says when and
   why). take(read): when the read is one whole HTTP chunk whose payload is the stream's
   armed repeating event (prefix + text + suffix; text_lane), the client's buffer is empty, its
   transport open and no progress check due, write the read to the client as it came and
   note the token: its gap since the last token, the streams decoding then (decoding.n), the
   bytes sent. Else answer False having done nothing but read the clock; the Python path
   takes that read. The notes are kept here, in the lane (a few hundred bytes), and handed
   to the one function it was given, notes(sent, gaps, streams, last): when the batch is
   full and at flush(). The lane writes no attribute of any other object: what it is given
   is a clock to call, a transport to write to and ask, a count to read (decoding.n) and
   that function. What the lane does not check per read (the parser between chunks, the
   relay neither ended nor paused, the template still armed) the relay checks each time it
   opens the lane, after every read the Python path took. */

#define LANE_BATCH 32

static PyObject *s_n, *s_frombytes, *array_type;

enum { KIND_ANSWER = 0, KIND_REASONING = 1, KIND_OTHER = 2 };

typedef struct {
    PyObject_HEAD
    PyObject *clock, *write, *is_closing, *buffer_size;
    PyObject *decoding, *notes, *memo;
    PyObject *prefix, *suffix;
    Py_ssize_t start, tail, limit, high_water, yield_after;
    double check_at, last;
    int kind, is_open, off, count;
    Py_ssize_t sent, taken;
    double gaps[LANE_BATCH];
    unsigned int streams[LANE_BATCH];
} TokenLane;

static int lane_traverse(TokenLane *self, visitproc visit, void *arg) {
    Py_VISIT(self->clock); Py_VISIT(self->write); Py_VISIT(self->is_closing); Py_VISIT(self->buffer_size);
    Py_VISIT(self->decoding); Py_VISIT(self->notes); Py_VISIT(self->memo);
    Py_VISIT(self->prefix); Py_VISIT(self->suffix);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

/* Also what the garbage collector calls to break a cycle: a cleared lane is closed, with no
   notes, as a lane never initialised, so nothing after it reads a cleared reference. */
static int lane_clear(TokenLane *self) {
    self->is_open = 0;
    self->count = 0;
    self->sent = 0;
    Py_CLEAR(self->clock); Py_CLEAR(self->write); Py_CLEAR(self->is_closing); Py_CLEAR(self->buffer_size);
    Py_CLEAR(self->decoding); Py_CLEAR(self->notes); Py_CLEAR(self->memo);
    Py_CLEAR(self->prefix); Py_CLEAR(self->suffix);
    return 0;
}

static void lane_dealloc(TokenLane *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    lane_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int lane_init(TokenLane *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"clock", "transport", "decoding", "notes", "memo", "prefix", "suffix", "limit",
                            "kind", "high_water", "yield_after", NULL};
    PyObject *clock, *transport, *decoding, *notes, *memo, *prefix, *suffix;
    Py_ssize_t limit, high_water, yield_after;
    int kind;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOSSninn", names, &clock, &transport, &decoding, &notes,
                                     &memo, &prefix, &suffix, &limit, &kind, &high_water, &yield_after))
        return -1;
    if (kind < KIND_ANSWER || kind > KIND_OTHER) {
        PyErr_SetString(PyExc_ValueError, "kind: 0 answer, 1 reasoning, 2 other");
        return -1;
    }
    if (!PyCallable_Check(clock) || !PyCallable_Check(notes)) {
        PyErr_SetString(PyExc_TypeError, "clock and notes must be callable");
        return -1;
    }
    PyObject *write = PyObject_GetAttrString(transport, "write");
    PyObject *is_closing = write ? PyObject_GetAttrString(transport, "is_closing") : NULL;
    PyObject *buffer_size = is_closing ? PyObject_GetAttrString(transport, "get_write_buffer_size") : NULL;
    if (buffer_size == NULL) {
        Py_XDECREF(write);
        Py_XDECREF(is_closing);
        return -1;
    }
    lane_clear(self);
    Py_INCREF(clock); self->clock = clock;
    self->write = write; self->is_closing = is_closing; self->buffer_size = buffer_size;
    Py_INCREF(decoding); self->decoding = decoding;
    Py_INCREF(notes); self->notes = notes;
    Py_INCREF(memo); self->memo = memo;
    Py_INCREF(prefix); self->prefix = prefix;
    Py_INCREF(suffix); self->suffix = suffix;
    self->start = PyBytes_GET_SIZE(prefix);
    self->tail = PyBytes_GET_SIZE(suffix);
    self->limit = limit;
    self->kind = kind;
    self->high_water = high_water;
    self->yield_after = yield_after;
    self->is_open = self->off = self->count = 0;
    self->sent = self->taken = 0;
    self->check_at = self->last = 0;
    return 0;
}

/* array(typecode) holding the first size bytes of buf: a new reference, or NULL. */
static PyObject *new_array(const char *typecode, const void *buf, Py_ssize_t size) {
    PyObject *array = PyObject_CallFunction(array_type, "s", typecode);
    if (array == NULL) return NULL;
    PyObject *raw = PyBytes_FromStringAndSize((const char *)buf, size);
    PyObject *r = raw ? PyObject_CallMethodOneArg(array, s_frombytes, raw) : NULL;
    Py_XDECREF(raw);
    if (r == NULL) {
        Py_DECREF(array);
        return NULL;
    }
    Py_DECREF(r);
    return array;
}

/* The notes, handed to notes(sent, gaps, streams, last) and forgotten here; 0, or -1 with an
   exception set. Nothing noted: nothing handed. */
static int lane_hand_over(TokenLane *self) {
    int count = self->count;
    Py_ssize_t sent = self->sent;
    self->count = 0;
    self->sent = 0;
    if (self->notes == NULL || (!count && !sent)) return 0; /* never initialised, cleared, or nothing */
    PyObject *gaps = new_array("d", self->gaps, count * (Py_ssize_t)sizeof(double));
    PyObject *streams = gaps ? new_array("I", self->streams, count * (Py_ssize_t)sizeof(unsigned int)) : NULL;
    PyObject *r = NULL;
    if (streams != NULL) r = PyObject_CallFunction(self->notes, "nOOd", sent, gaps, streams, self->last);
    Py_XDECREF(gaps);
    Py_XDECREF(streams);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* A failure in measuring (a bug: tests pin what is read) switches the lane off for good;
   the read was relayed regardless. */
static void lane_failed(TokenLane *self) {
    PyErr_Clear();
    self->off = 1;
    self->is_open = 0;
}

/* The checks before anything is written: 1 take, 0 leave to Python, -1 error. */
static int lane_may_take(TokenLane *self, PyObject *data, double *now, unsigned int *streams) {
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data), at, len;
    if (n >= self->yield_after || n > self->high_water || !whole_chunk(b, n, &at, &len)) return 0;
    /* The payload as EventTemplate.matches takes it: prefix, a text (text_lane), suffix. */
    const unsigned char *p = b + at;
    Py_ssize_t end = len - self->tail;
    if (!(self->start < end && len <= self->limit)) return 0;
    if (memcmp(p, PyBytes_AS_STRING(self->prefix), self->start) != 0) return 0;
    if (memcmp(p + end, PyBytes_AS_STRING(self->suffix), self->tail) != 0) return 0;
    if (!text_lane(p + self->start, end - self->start)) return 0;
    PyObject *t = PyObject_CallNoArgs(self->clock);
    if (t == NULL) return -1;
    *now = PyFloat_AsDouble(t);
    Py_DECREF(t);
    if (*now == -1.0 && PyErr_Occurred()) return -1;
    if (*now >= self->check_at) return 0;
    PyObject *closing = PyObject_CallNoArgs(self->is_closing);
    if (closing == NULL) return -1;
    Py_DECREF(closing);
    if (closing != Py_False) return 0;
    /* An empty buffer before the write leaves at most this read (<= high_water) after it:
       the relay's flow check after the write (its _write_framed) cannot fire. */
    PyObject *queued = PyObject_CallNoArgs(self->buffer_size);
    if (queued == NULL) return -1;
    Py_ssize_t q = PyLong_AsSsize_t(queued);
    Py_DECREF(queued);
    if (q == -1 && PyErr_Occurred()) return -1;
    if (q != 0) return 0;
    PyObject *decoding = PyObject_GetAttr(self->decoding, s_n);
    if (decoding == NULL) return -1;
    unsigned long k = PyLong_AsUnsignedLong(decoding);
    Py_DECREF(decoding);
    if (k == (unsigned long)-1 && PyErr_Occurred()) return -1;
    if (k > UINT_MAX) return 0; /* not an 'I' array item: the Python path says so */
    *streams = (unsigned int)k;
    return 1;
}

/* take(data) -> bool: True when the read was relayed and noted here. An exception from the
   client's write goes to the caller (the relay's own handling, as on the Python path). */
static PyObject *lane_take(TokenLane *self, PyObject *data) {
    if (!self->is_open || !PyBytes_CheckExact(data)) Py_RETURN_FALSE;
    double now = 0;
    unsigned int streams = 0;
    int ok = lane_may_take(self, data, &now, &streams);
    if (ok <= 0) {
        if (ok < 0) lane_failed(self);
        Py_RETURN_FALSE;
    }
    PyObject *r = PyObject_CallOneArg(self->write, data);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if ((self->count == LANE_BATCH || self->sent > PY_SSIZE_T_MAX - n) && lane_hand_over(self) < 0) {
        lane_failed(self);
        Py_RETURN_TRUE;
    }
    self->gaps[self->count] = now - self->last;
    self->streams[self->count] = streams;
    self->count++;
    self->last = now;
    self->sent += n;
    if (self->taken < PY_SSIZE_T_MAX) self->taken++;
    Py_RETURN_TRUE;
}

/* open(check_at, last_token) -> bool: take reads again, the next token's gap counted from
   last_token (the timeline's), until a progress check is due at check_at (the relay's; it
   checks everything else before calling). */
static PyObject *lane_open(TokenLane *self, PyObject *const *args, Py_ssize_t nargs) {
    if (self->notes == NULL) { /* TokenLane.__new__ without __init__ (or cleared) */
        PyErr_SetString(PyExc_RuntimeError, "TokenLane.open() before __init__()");
        return NULL;
    }
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "open(check_at, last_token)");
        return NULL;
    }
    if (self->off) Py_RETURN_FALSE;
    double at = PyFloat_AsDouble(args[0]);
    if (at == -1.0 && PyErr_Occurred()) return NULL;
    if (self->count || self->sent) {
        PyErr_SetString(PyExc_RuntimeError, "open() with notes not handed over");
        return NULL;
    }
    if (args[1] == Py_None) Py_RETURN_FALSE; /* no token yet: the Python path records the first */
    double l = PyFloat_AsDouble(args[1]);
    if (l == -1.0 && PyErr_Occurred()) return NULL;
    self->last = l;
    self->check_at = at;
    self->is_open = 1;
    Py_RETURN_TRUE;
}

/* flush(): stop taking reads, and hand the notes over. */
static PyObject *lane_flush(TokenLane *self, PyObject *unused) {
    self->is_open = 0;
    if (lane_hand_over(self) < 0) lane_failed(self);
    Py_RETURN_NONE;
}

static PyObject *lane_get_taken(TokenLane *self, void *closure) { return PyLong_FromSsize_t(self->taken); }
static PyObject *lane_get_off(TokenLane *self, void *closure) { return PyBool_FromLong(self->off); }
static PyObject *lane_get_is_open(TokenLane *self, void *closure) { return PyBool_FromLong(self->is_open); }
static PyObject *lane_get_pending(TokenLane *self, void *closure) { return PyLong_FromLong(self->count); }
static PyObject *lane_get_memo(TokenLane *self, void *closure) {
    PyObject *m = self->memo ? self->memo : Py_None;
    Py_INCREF(m);
    return m;
}

static PyMethodDef lane_methods[] = {
    {"take", (PyCFunction)lane_take, METH_O, "take(read) -> bool: relayed and noted here"},
    {"open", (PyCFunction)(void (*)(void))lane_open, METH_FASTCALL,
     "open(check_at, last_token) -> bool: take reads from now on"},
    {"flush", (PyCFunction)lane_flush, METH_NOARGS, "stop, and hand the notes to notes()"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef lane_getset[] = {
    {"taken", (getter)lane_get_taken, NULL, "reads taken in all", NULL},
    {"off", (getter)lane_get_off, NULL, "switched off by an error in measuring", NULL},
    {"is_open", (getter)lane_get_is_open, NULL, "taking reads", NULL},
    {"pending", (getter)lane_get_pending, NULL, "tokens noted, not yet handed over", NULL},
    {"memo", (getter)lane_get_memo, NULL, "the template it stands for", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot lane_slots[] = {
    {Py_tp_init, lane_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, lane_dealloc},
    {Py_tp_traverse, lane_traverse},
    {Py_tp_clear, lane_clear},
    {Py_tp_methods, lane_methods},
    {Py_tp_getset, lane_getset},
    {0, NULL},
};

static PyType_Spec lane_spec = {
    "sidecar.relay.data._token_lane.TokenLane", sizeof(TokenLane), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, lane_slots,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_token_lane", NULL, -1, NULL};

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__token_lane(void) {
    INTERN(s_n, "n"); INTERN(s_frombytes, "frombytes");
    if (array_type == NULL) {
        PyObject *array = PyImport_ImportModule("array");
        if (array == NULL) return NULL;
        array_type = PyObject_GetAttrString(array, "array");
        Py_DECREF(array);
        if (array_type == NULL) return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *lane = PyType_FromSpec(&lane_spec);
    if (lane == NULL || PyModule_AddObject(m, "TokenLane", lane) < 0) {
        Py_XDECREF(lane);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
