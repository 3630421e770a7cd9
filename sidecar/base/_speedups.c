/* Optional C for the relay's per-read path (sidecar/base/speedups.py says which is used):
   three byte checks, each with a pure Python original that is the oracle
   (tests/unit/base/test_speedups.py compares them). The checks themselves are in _bytes.h, shared
   with the token lane beside its one user (sidecar/relay/data/_token_lane.c). */
#include "_bytes.h"

/* chunk_payload(data) -> bytes | None: data's payload if data is one whole chunk
   (whole_chunk), else None. */
static PyObject *chunk_payload(PyObject *self, PyObject *data) {
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "chunk_payload needs bytes");
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t start, size;
    if (!whole_chunk(b, PyBytes_GET_SIZE(data), &start, &size)) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)b + start, size);
}

/* chunk_payloads(data) -> (list[bytes], bool) | None: the payloads of data if it is whole,
   well-formed chunks back to back, and whether it ended with the body's last chunk exactly
   (chunk_payloads_py), else None. */
static PyObject *chunk_payloads(PyObject *self, PyObject *data) {
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "chunk_payloads needs bytes");
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data), pos = 0;
    if (n == 0) Py_RETURN_NONE;
    PyObject *pieces = PyList_New(0);
    if (pieces == NULL) return NULL;
    while (pos < n) {
        Py_ssize_t start;
        unsigned long long size;
        if (!size_line_at(b, n, pos, &start, &size)) goto none;
        if (size == 0) { /* the last chunk: the end of the body if nothing follows it */
            if (n - start != 2 || b[start] != '\r' || b[start + 1] != '\n') goto none;
            return Py_BuildValue("(NO)", pieces, Py_True);
        }
        if ((unsigned long long)(n - start) < size + 2) goto none;
        Py_ssize_t stop = start + (Py_ssize_t)size;
        if (b[stop] != '\r' || b[stop + 1] != '\n') goto none;
        PyObject *piece = PyBytes_FromStringAndSize((const char *)b + start, (Py_ssize_t)size);
        if (piece == NULL) goto error;
        int appended = PyList_Append(pieces, piece);
        Py_DECREF(piece);
        if (appended < 0) goto error;
        pos = stop + 2;
    }
    return Py_BuildValue("(NO)", pieces, Py_False); /* pos < n ran once: a piece at least */
none:
    Py_DECREF(pieces);
    Py_RETURN_NONE;
error:
    Py_DECREF(pieces);
    return NULL;
}

/* plain_at(buf, start, end) -> bool: whether buf[start:end] is plain (text_plain). */
static PyObject *plain_at(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "plain_at(bytes, start, end)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    if ((start == -1 || end == -1) && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    if (start < 0 || end > n || start >= end) Py_RETURN_FALSE;
    return PyBool_FromLong(text_plain((const unsigned char *)PyBytes_AS_STRING(args[0]) + start, end - start));
}

static PyMethodDef methods[] = {
    {"chunk_payload", (PyCFunction)chunk_payload, METH_O, NULL},
    {"chunk_payloads", (PyCFunction)chunk_payloads, METH_O, NULL},
    {"plain_at", (PyCFunction)(void (*)(void))plain_at, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", NULL, -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
