/* The byte checks both C files of the relay's per-token path share (sidecar/base/_speedups.c,
   whose Python originals in sidecar/base/speedups.py are their oracle, and the token lane,
   sidecar/relay/data/_token_lane.c): included by each, so there is one copy of each rule. */
#ifndef SIDECAR_BYTES_H
#define SIDECAR_BYTES_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* A bare chunk size line at b[pos:n] (no extension): 1 to 15 hex digits then CRLF, as the
   Python original (sidecar.base.speedups.size_line: find(CRLF, pos, pos + 17) after 1..15
   digits); then *start is where the payload starts and *size its size. */
static inline int size_line_at(const unsigned char *b, Py_ssize_t n, Py_ssize_t pos,
                               Py_ssize_t *start, unsigned long long *size) {
    Py_ssize_t i = pos;
    unsigned long long value = 0;
    for (; i < n && i - pos < 16; i++) {
        unsigned char c = b[i];
        unsigned v;
        if (c >= '0' && c <= '9') v = c - '0';
        else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
        else break;
        value = value * 16 + v;
    }
    if (i == pos || i - pos > 15 || i + 1 >= n || b[i] != '\r' || b[i + 1] != '\n') return 0;
    *start = i + 2;
    *size = value;
    return 1;
}

/* Whether b[0:n] is exactly one whole HTTP/1.1 chunk with a non-zero size and no extension
   ("1a3\r\n" + payload + "\r\n": size_line_at, the payload, CRLF, nothing after); then
   *start and *size say the payload. */
static inline int whole_chunk(const unsigned char *b, Py_ssize_t n, Py_ssize_t *start, Py_ssize_t *size) {
    Py_ssize_t at;
    unsigned long long value;
    if (!size_line_at(b, n, 0, &at, &value) || value == 0) return 0;
    if ((unsigned long long)(n - at) != value + 2 || b[n - 2] != '\r' || b[n - 1] != '\n') return 0;
    *start = at;
    *size = (Py_ssize_t)value;
    return 1;
}

/* 1 when p[0:n] is what sidecar.base.speedups.plain accepts: non-empty, valid UTF-8 (strict,
   as bytes.decode(): no overlong form, no surrogate, nothing past U+10FFFF), no '"' and no
   '\\', and every character printable as str.isprintable() judges it (the same
   Py_UNICODE_ISPRINTABLE). 0 otherwise. With escapes, a backslash may also start one of
   JSON's one-character escapes (text_lane). */
static inline int text_checked(const unsigned char *p, Py_ssize_t n, int escapes) {
    if (n <= 0) return 0;
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x80) {
            if (c == '\\' && escapes && i + 1 < n && strchr("\"\\/bfnrt", p[i + 1]) && p[i + 1]) {
                i += 2; /* one character, whatever it is: the text stays non-empty */
                continue;
            }
            if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') return 0;
            i++;
            continue;
        }
        Py_UCS4 ch;
        int more;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) { ch = c & 0x1F; more = 1; }
        else if (c >= 0xE0 && c <= 0xEF) {
            ch = c & 0x0F; more = 2;
            if (c == 0xE0) lo = 0xA0;       /* no overlong */
            else if (c == 0xED) hi = 0x9F;  /* no surrogate */
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            ch = c & 0x07; more = 3;
            if (c == 0xF0) lo = 0x90;       /* no overlong */
            else if (c == 0xF4) hi = 0x8F;  /* nothing past U+10FFFF */
        }
        else return 0;
        if (i + more >= n) return 0;
        unsigned char c1 = p[i + 1];
        if (c1 < lo || c1 > hi) return 0;
        ch = (ch << 6) | (c1 & 0x3F);
        for (int k = 2; k <= more; k++) {
            unsigned char ck = p[i + k];
            if (ck < 0x80 || ck > 0xBF) return 0;
            ch = (ch << 6) | (ck & 0x3F);
        }
        if (!Py_UNICODE_ISPRINTABLE(ch)) return 0;
        i += more + 1;
    }
    return 1;
}

static inline int text_plain(const unsigned char *p, Py_ssize_t n) { return text_checked(p, n, 0); }

/* What a token lane takes as its text: plain (text_plain), or plain but for JSON's
   one-character escapes (\" \\ \/ \b \f \n \r \t; never \u): a valid, non-empty JSON string
   either way, which is all the dialect asks of it (its events and state depend on the text
   only through whether it is empty: sidecar/streams/protocols/_base.py). */
static inline int text_lane(const unsigned char *p, Py_ssize_t n) { return text_checked(p, n, 1); }

#endif
