/* Optional C versions of two byte checks on the relay's per-token path, each with a pure
   Python original that is the oracle (sidecar/base/speedups.py says which is used, and
   tests/unit/test_speedups.py compares them). Only what CPython's stable C API offers. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* chunk_payload(data) -> bytes | None: data's payload if data is exactly one whole HTTP/1.1
   chunk with a non-zero size and no extension ("1a3\r\n" + payload + "\r\n"): the size
   line is 1 to 15 hex digits then CRLF. Else None. */
static PyObject *chunk_payload(PyObject *self, PyObject *data) {
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "chunk_payload needs bytes");
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data), i = 0;
    unsigned long long size = 0;
    for (; i < n && i < 16; i++) {
        unsigned char c = b[i];
        unsigned v;
        if (c >= '0' && c <= '9') v = c - '0';
        else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
        else break;
        size = size * 16 + v;
    }
    /* 1..15 digits, then CRLF (the Python original: find(CRLF, 0, 17) at 1..15). */
    if (i == 0 || i > 15 || i + 1 >= n || b[i] != '\r' || b[i + 1] != '\n' || size == 0)
        Py_RETURN_NONE;
    Py_ssize_t start = i + 2;
    if ((unsigned long long)(n - start) != size + 2 || b[n - 2] != '\r' || b[n - 1] != '\n')
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)b + start, (Py_ssize_t)size);
}

/* ascii_plain(buf, start, end) -> True | False | None: whether buf[start:end] is non-empty
   printable ASCII with no '"' and no '\\' (True), has a byte that is not (False), or has a
   byte of 0x80 or more, which only a Unicode-aware check can judge (None: ask Python). */
static PyObject *ascii_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "ascii_plain(bytes, start, end)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    if ((start == -1 || end == -1) && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    if (start < 0 || end > n || start >= end) Py_RETURN_FALSE;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    int wide = 0;
    for (Py_ssize_t i = start; i < end; i++) {
        unsigned char c = b[i];
        if (c >= 0x80) wide = 1;
        else if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') Py_RETURN_FALSE;
    }
    if (wide) Py_RETURN_NONE;
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"chunk_payload", (PyCFunction)chunk_payload, METH_O, NULL},
    {"ascii_plain", (PyCFunction)(void (*)(void))ascii_plain, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", NULL, -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
