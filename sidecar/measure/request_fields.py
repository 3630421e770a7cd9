"""Sans-I/O: the few request fields the figures need, read from a JSON body in flight.

Why not ``orjson.loads(body)``: a parsed body costs far more than its bytes (a 33 MB chat
body of a million small messages became 450 MiB of Python objects; ``[{},{},...]`` 874 MiB,
and 2 s of event-loop time to build), and it lived as long as the stream. The sidecar needs
only the top-level ``model`` and ``stream`` and the output-length limit (top level, TGI's
``parameters`` or Ollama's ``options``), so :class:`RequestFieldScanner` reads those and
skips everything else without keeping it: ``feed(bytes)`` any number of times, then
``close() -> RequestFields | None``.

Memory is bounded whatever the body: a key is held up to ``_MAX_KEY_BYTES``, a value of
interest up to ``max_value_bytes``; everything else is skipped keeping only a nesting
counter and whether a string or escape is open. Work is O(n): containers that are not of
interest (``messages``, ``prompt``, ``tools``...) are skipped by one regular expression that
consumes strings and nested containers (up to three levels at a time) in C, so Python only
steps in at the rare bracket it leaves.

Same answers as ``orjson.loads`` on valid JSON (tests compare them, including duplicate
keys, where the last one wins, escaped keys and deep nesting). Not a validator: the scanner
returns ``None`` for what it can see is not one JSON object (a top-level array, a stray
byte between tokens, an unfinished document), but does not check the inside of skipped
values (UTF-8, number syntax); the server judges those, as it always did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol, cast

import orjson

__all__ = ["RequestFields", "RequestFieldScanner", "MAX_TOKEN_KEYS", "scan_request_fields"]

MAX_TOKEN_KEYS = (
    "max_completion_tokens",
    "max_tokens",
    "max_output_tokens",
    "max_new_tokens",
    "n_predict",
    "num_predict",
)
"""Where each API puts its output-length limit, in the order they are looked for."""
_HOLDERS = ("parameters", "options")  # TGI's and Ollama's nested option objects
_MAX_KEY_BYTES = 256  # far above any key of interest, even fully \\u-escaped
_MAX_SCALAR_BYTES = 64


class _Run(Protocol):
    """A pattern that matches wherever it is tried (a ``*+`` run, empty at worst, or one
    tried where the caller saw its first byte): ``match`` never answers None."""

    @property
    def pattern(self) -> bytes: ...

    def match(self, string: bytes, pos: int = ..., /) -> re.Match[bytes]: ...


def _run(pattern: bytes, flags: int = 0) -> _Run:
    return cast(_Run, re.compile(pattern, flags))


_STRING_BODY = _run(rb'[^"\\]*+', re.S)
# A skipped string's body, escapes and all, up to its closing quote or a backslash that ends
# the piece: an escape-dense string ("\\n\\n...") is consumed in C, not one escape per step.
_SKIPPED_STRING_BODY = _run(rb'(?:[^"\\]++|\\.)*+', re.S)
_SCALAR_BODY = _run(rb"[^,}\]\s]*+")
_SPACE = _run(rb"[ \t\r\n]*+")
_BASE_STEPS = 50_000
"""Python steps any body may take, beyond one per 8 bytes (see ``RequestFieldScanner.feed``)."""


def _skip_pattern(levels: int) -> _Run:
    """A run of content inside a container: non-structural bytes, whole strings and whole
    nested containers up to ``levels`` deep. Possessive, so a container cut by the end of a
    piece fails at once instead of backtracking."""
    string = rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
    plain = rb'[^"\[\]{}]++'
    run = rb"(?:%s|%s)*+" % (plain, string)
    for _ in range(levels):
        run = rb"(?:%s|%s|\{%s\}|\[%s\])*+" % (plain, string, run, run)
    return _run(run, re.S)


_SKIP_RUN = _skip_pattern(3)


def _pairs_pattern() -> _Run:
    """A run of ``, "key": value`` pairs whose key is not of interest: a plain key (no
    escape) that is none of ours, and a value that is a string, a scalar or a container
    up to three levels deep. Lets a body of millions of top-level keys pass in C."""
    ours = b"|".join(re.escape(k.encode()) for k in ("model", "stream", *_HOLDERS, *MAX_TOKEN_KEYS))
    string = rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
    run = _skip_pattern(2).pattern
    value = rb"(?:%s|[^,}\]\s\[{\"]++(?=[,}\]\s])|\{%s\}|\[%s\])" % (string, run, run)
    pair = rb'[ \t\r\n]*+,[ \t\r\n]*+"(?!(?:%s)")[^"\\]*+"[ \t\r\n]*+:[ \t\r\n]*+%s' % (ours, value)
    return _run(rb"(?:%s)*+" % pair, re.S)


_OTHER_PAIRS = _pairs_pattern()

# What comes next at an object level of interest.
_KEY_OR_END, _KEY, _COLON, _VALUE, _NEXT = range(5)
# Where the scanner is.
_BEFORE, _TOP, _HOLDER, _AFTER, _FAILED = range(5)


class _Opaque:
    """A value that was skipped unread: not a string, not ``true``, not an integer."""

    __repr__ = lambda self: "<opaque>"  # noqa: E731


_OPAQUE = _Opaque()


@dataclass(frozen=True, slots=True)
class RequestFields:
    """What :mod:`sidecar.relay.data.exchange` labels a request with."""

    model: str | None = None
    stream: bool = False
    max_tokens: int | None = None


SMALL_BODY_BYTES = 64 << 10
"""Up to this size a whole body is parsed with orjson: 100 times faster than the scanner on
a typical chat body (0.4 vs 36 us for 220 bytes) and its objects stay small (a 64 KiB body
of ``{},`` is about 1.5 MiB of dicts, freed at once)."""


def scan_request_fields(body: bytes, max_value_bytes: int = 1024) -> RequestFields | None:
    """The fields of a whole body: parsed when small, scanned when large."""
    if len(body) <= SMALL_BODY_BYTES:
        return _parsed_fields(body)
    scanner = RequestFieldScanner(max_value_bytes)
    scanner.feed(body)
    return scanner.close()


def _parsed_fields(body: bytes) -> RequestFields | None:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(doc) is not dict:
        return None
    # Read as ``key in doc and doc[key]``, not ``doc.get(key)``: the same values, and no
    # call per field on every request's way in.
    model = doc["model"] if "model" in doc else None
    parameters = doc["parameters"] if "parameters" in doc else None  # TGI's
    options = doc["options"] if "options" in doc else None  # Ollama's
    max_tokens = None
    for holder in (doc, parameters, options):
        if type(holder) is dict:
            for key in MAX_TOKEN_KEYS:
                if key in holder and type(holder[key]) is int:
                    max_tokens = holder[key]
                    break
            if max_tokens is not None:
                break
    return RequestFields(
        model if type(model) is str else None,
        "stream" in doc and doc["stream"] is True,
        max_tokens,
    )


class RequestFieldScanner:
    """Incremental: ``feed(bytes)`` the body as it arrives, then :meth:`close`."""

    __slots__ = (
        "_where",
        "_expect",
        "_key",
        "_holder",
        "_skip",
        "_in_string",
        "_escape",
        "_token",
        "_token_kind",
        "_token_over",
        "_in_scalar",
        "_max_value",
        "_model",
        "_stream",
        "_limits",
        "_holder_is_object",
        "_steps",
        "_budget",
    )

    def __init__(self, max_value_bytes: int = 1024) -> None:
        self._where = _BEFORE
        self._expect = _KEY_OR_END
        # The key whose value comes next (None: not of interest; _BAD: not decodable).
        self._key: str | _Bad | None = None
        self._holder: str | None = None  # inside "parameters"/"options" (else the top level)
        self._skip = 0  # depth inside a container that is not of interest
        self._in_string = False
        self._escape = False  # a backslash ended the last piece inside a string
        self._token: bytearray | None = None  # a key or value being kept (None: skipped)
        self._token_kind = ""  # "key", "string" or "scalar"
        self._token_over = False
        self._in_scalar = False
        self._max_value = max_value_bytes
        self._model: object = None
        self._stream: object = None
        self._limits: dict[tuple[str | None, str], object] = {}
        self._holder_is_object: dict[str, bool] = {}
        self._steps = 0
        self._budget = _BASE_STEPS

    def feed(self, data: bytes) -> None:
        pos, end = 0, len(data)
        # Python steps allowed: a fixed allowance plus one per 8 bytes. A body whose shape
        # costs more (nesting deeper than the skip pattern's three levels on every bracket:
        # 15 MiB of "[0," took 6.6 s of CPU) is given up: its fields are unknown (the
        # request is relayed all the same), and its CPU is bounded like its memory.
        budget = self._budget = self._budget + (end >> 3)
        steps = self._steps
        while pos < end and self._where != _FAILED:
            steps += 1
            if steps > budget:
                self._fail()
                break
            if self._in_string:
                pos = self._string(data, pos, end)
            elif self._in_scalar:
                pos = self._scalar(data, pos, end)
            elif self._skip:
                pos = self._skipping(data, pos, end)
            else:
                pos = self._structure(data, pos, end)
        self._steps = steps

    def close(self) -> RequestFields | None:
        """The fields, or None when the body was not one complete JSON object."""
        if self._where != _AFTER:
            return None
        model = self._model if isinstance(self._model, str) else None
        return RequestFields(model, self._stream is True, self._max_tokens())

    # -- internals -------------------------------------------------------------------------

    def _max_tokens(self) -> int | None:
        for holder in (None, *_HOLDERS):
            if holder is not None and not self._holder_is_object.get(holder):
                continue
            for key in MAX_TOKEN_KEYS:
                value = self._limits.get((holder, key))
                if type(value) is int:
                    return value
        return None

    def _fail(self) -> int:
        self._where = _FAILED
        return 1 << 62

    def _keep(self, piece: bytes) -> None:
        token = self._token
        if token is None:
            return
        limit = (
            _MAX_KEY_BYTES
            if self._token_kind == "key"
            else (_MAX_SCALAR_BYTES if self._token_kind == "scalar" else self._max_value)
        )
        room = limit - len(token)
        if len(piece) > room:
            token += piece[: max(room, 0)]
            self._token_over = True
        else:
            token += piece

    def _string(self, data: bytes, pos: int, end: int) -> int:
        if self._escape:
            self._escape = False
            self._keep(data[pos : pos + 1])
            pos += 1
        if (self._token is None or self._token_over) and pos < end:
            # Not kept (or kept up to its limit already): the rest is skipped, escapes in C.
            stop = _SKIPPED_STRING_BODY.match(data, pos).end()
            if stop == end:
                return end
            if data[stop] == 0x22:
                self._in_string = False
                self._string_done()
                return stop + 1
            self._escape = True  # a backslash is the piece's last byte
            return end
        while pos < end:
            stop = _STRING_BODY.match(data, pos).end()
            if stop > pos:
                self._keep(data[pos:stop])
            if stop == end:
                return end
            if data[stop] == 0x22:  # the closing quote
                self._in_string = False
                self._string_done()
                return stop + 1
            # A backslash: keep it with the byte it escapes (which may be in the next piece).
            if stop + 1 < end:
                self._keep(data[stop : stop + 2])
                pos = stop + 2
            else:
                self._keep(data[stop : stop + 1])
                self._escape = True
                return end
        return end

    def _string_done(self) -> None:
        token, self._token = self._token, None
        if self._skip:
            return  # a string inside a skipped container
        if self._token_kind == "key":
            self._key = None if token is None or self._token_over else _decode_key(bytes(token))
            if self._key is _BAD:
                self._fail()
            self._expect = _COLON
            return
        value: object = _OPAQUE
        if token is not None:
            value = _decode_string(bytes(token), self._token_over)
            if value is _BAD:
                self._fail()
                return
        self._value_done(value)

    def _scalar(self, data: bytes, pos: int, end: int) -> int:
        stop = _SCALAR_BODY.match(data, pos).end()
        self._keep(data[pos:stop])
        if stop == end:
            return end
        self._in_scalar = False
        token, self._token = self._token, None
        value: object = _OPAQUE
        if token is not None:
            if self._token_over:
                value = _OPAQUE
            else:
                try:
                    value = orjson.loads(bytes(token))
                except orjson.JSONDecodeError:
                    return self._fail()
        self._value_done(value)
        return stop  # the delimiter is read as structure

    def _skipping(self, data: bytes, pos: int, end: int) -> int:
        pos = _SKIP_RUN.match(data, pos).end()
        if pos == end:
            return end
        byte = data[pos]
        if byte == 0x22:
            self._in_string = True
            self._token = None
        elif byte in b"[{":
            self._skip += 1
        else:  # ] or }
            self._skip -= 1
            if not self._skip:
                self._value_done(_OPAQUE)
        return pos + 1

    def _structure(self, data: bytes, pos: int, end: int) -> int:
        pos = _SPACE.match(data, pos).end()
        if pos == end:
            return end
        byte = data[pos]
        where = self._where
        if self._expect == _NEXT and where != _AFTER:
            pos = _OTHER_PAIRS.match(data, pos).end()
            pos = _SPACE.match(data, pos).end()
            if pos == end:
                return end
            byte = data[pos]
        if where == _BEFORE:
            if byte != 0x7B:  # not an object at the top: nothing to read
                return self._fail()
            self._where, self._expect = _TOP, _KEY_OR_END
            return pos + 1
        if where == _AFTER:
            return self._fail()  # bytes after the document
        expect = self._expect
        if byte == 0x22 and expect in (_KEY_OR_END, _KEY):
            self._start_string("key", keep=True)
        elif byte == 0x7D and expect in (_KEY_OR_END, _NEXT):  # }
            if where == _HOLDER:
                self._where, self._holder, self._expect = _TOP, None, _NEXT
            else:
                self._where = _AFTER
        elif byte == 0x3A and expect == _COLON:
            self._expect = _VALUE
        elif byte == 0x2C and expect == _NEXT:
            self._expect = _KEY
        elif expect == _VALUE:
            return self._value_start(byte, pos)
        else:
            return self._fail()
        return pos + 1

    def _value_start(self, byte: int, pos: int) -> int:
        key = self._key
        if byte == 0x22:  # "
            self._start_string("string", keep=key == "model" and self._where == _TOP)
            return pos + 1
        if byte == 0x7B and key in _HOLDERS and self._where == _TOP:
            self._holder_is_object[key] = True
            for name in MAX_TOKEN_KEYS:  # a repeated key replaces the whole object
                self._limits.pop((key, name), None)
            self._where, self._holder, self._expect = _HOLDER, key, _KEY_OR_END
            return pos + 1
        if byte in b"[{":
            self._skip = 1
            return pos + 1
        if byte in b",:]}":
            return self._fail()
        self._in_scalar = True
        self._token = bytearray() if key is not None else None
        self._token_kind = "scalar"
        self._token_over = False
        return pos

    def _start_string(self, kind: str, keep: bool) -> None:
        self._in_string = True
        self._token = bytearray() if keep else None
        self._token_kind = kind
        self._token_over = False

    def _value_done(self, value: object) -> None:
        self._expect = _NEXT
        key, self._key = self._key, None
        if key is None:
            return
        if self._where == _TOP:
            if key == "model":
                self._model = value
            elif key == "stream":
                self._stream = value
            elif key in _HOLDERS:
                self._holder_is_object[key] = False  # a repeated key that is not an object
            if key in MAX_TOKEN_KEYS:
                self._limits[(None, key)] = value
        elif key in MAX_TOKEN_KEYS:
            self._limits[(self._holder, key)] = value


class _Bad:
    pass


_BAD = _Bad()


def _decode_key(raw: bytes) -> str | None | _Bad:
    if b"\\" not in raw:
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return _BAD
    try:
        key: str = orjson.loads(b'"' + raw + b'"')  # a JSON string: a str
    except orjson.JSONDecodeError:
        return _BAD
    return key


def _decode_string(raw: bytes, cut: bool) -> str | _Bad:
    """A kept string value. One cut at ``max_value_bytes`` is decoded as far as it goes
    (a model name that long is labelled ``other`` anyway); a whole one must be valid."""
    if cut:
        return raw.decode("utf-8", "replace")
    try:
        value: str = orjson.loads(b'"' + raw + b'"')  # a JSON string: a str
    except orjson.JSONDecodeError:
        return _BAD
    return value
