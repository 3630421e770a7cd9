"""Sans-I/O: a small copy of a JSON response body, made as the pieces arrive.

Why: kept whole (up to ``max_response_inspect_bytes``, 16 MiB) and parsed by
``orjson.loads``, a non-streamed JSON response is a hostile upstream's lever: 15.9 MiB of
``{"choices":[{},{},...]}`` would take the sidecar's peak RSS from 53 to 553 MiB (the pod's
limit is 512Mi) and stall its event loop for 1.5 s. The whole-body parsers
(``parse_*_response`` in :mod:`sidecar.streams.protocols`) read only small things: ids,
model names, finish reasons, ``usage`` and the engines' counts and timings (vLLM's
``metrics``, llama.cpp's ``timings``, Ollama's durations, SGLang's ``meta_info``), and an
error's type, code and message; never the generated text. So :class:`JsonSkeleton` keeps a
pruned copy of the document and the parsers run unchanged on it:

- a string (key or value) longer than ``MAX_STRING_BYTES`` is cut to a prefix of at most
  that many bytes that is still a valid JSON string (whole escapes and UTF-8 characters);
  it stays non-empty, and an error message keeps its start (the message is never
  exported anyway: only its type is);
- an object or array keeps its first ``MAX_MEMBERS`` members; the rest are skipped;
- a container nested deeper than ``MAX_KEPT_DEPTH`` is kept empty (``{}`` or ``[]``:
  its type stays, its content is skipped); nesting deeper than ``MAX_NESTING`` anywhere
  (orjson itself refuses more than 1024 levels) gives up;
- a number or literal longer than ``MAX_SCALAR_BYTES`` becomes ``null`` (no count or
  duration is that long);
- the copy is at most ``MAX_OUTPUT_BYTES``; past that, or past the work budget below, the
  reader gives up: :meth:`close` returns ``None`` and the response counts as not
  inspected (as a body over ``max_response_inspect_bytes`` always did).

What the parsers read lies within these bounds in every response seen so far; past them
a few figures are read from the kept part only (the first 256 choices' finish reasons, the
first 256 prompts of an SGLang batch, at most 256 of TGI's ``prefill`` tokens, which are
read only when TGI 2.x's ``input_length`` is missing): docs/reliability.md, known limits.
:class:`~sidecar.measure.observe.ResponseObserver` parses bodies up to 64 KiB whole, so
only larger ones go through the copy.

Within those bounds the copy is the document itself (minus insignificant whitespace), so
the parsers give exactly the events they give on the whole body; tests check every route's
parser on recorded responses and generated documents, whole, byte by byte and at random
splits. Outside them the copy is still a valid document when the body was one, and an
invalid one (the parsers report "not JSON") when the part that was kept is broken or the
body ends early. Not a validator: skipped content (the members past the limit, the tail of
a long string) is not checked, as ``RequestFieldScanner`` does not check what it skips.

Work is O(n) with a small constant, nearly all of it in C:

- skipped content is first tried with bytes methods only (:meth:`JsonSkeleton._skip_counted`:
  split at quotes, brackets counted, a few hundred MB/s), which settle a whole piece when
  the skipped region provably goes on past it; otherwise by the regular expression of
  :mod:`sidecar.measure.request_fields` (strings, plain bytes and whole containers up to
  three levels deep; about 40 MB/s), with Python stepping in only at a bracket it leaves;
- a long string's body is one expression per piece, escapes included;
- a kept container that is small (whole within 4 KiB of the piece, no more than four
  levels, no long string or scalar, few members: a ``usage`` object, one logprobs entry)
  is copied in one step; the rest of what is kept is read a token at a time.

Python steps are bounded: past ``_STEP_ALLOWANCE`` plus one per ``_BYTES_PER_STEP`` bytes
fed, the reader gives up. Only hostile shapes get there (a long run of tiny containers
nested deeper than the expression reaches, a kept region made only of tokens), and the
time any body can cost is bounded whatever its shape. ``python -m bench.json_skeleton``
times hostile shapes.
"""

from __future__ import annotations

import re

from .request_fields import _SKIP_RUN, _run

__all__ = [
    "JsonSkeleton",
    "json_skeleton",
    "MAX_STRING_BYTES",
    "MAX_MEMBERS",
    "MAX_KEPT_DEPTH",
    "MAX_NESTING",
    "MAX_SCALAR_BYTES",
    "MAX_OUTPUT_BYTES",
]

MAX_STRING_BYTES = 1024
MAX_MEMBERS = 256
MAX_KEPT_DEPTH = 16
MAX_NESTING = 1024
MAX_SCALAR_BYTES = 64
MAX_OUTPUT_BYTES = 1 << 20

_STEP_ALLOWANCE = 20_000
"""Python steps any body may take. A large legitimate response takes far fewer: a chat
answer with 256 tokens of top-20 logprobs (300 KB, all of it kept) about 850."""
_BYTES_PER_STEP = 16
"""Beyond the allowance, one more step per this many bytes fed."""

_QUOTE = 0x22
_OPEN = frozenset(b"[{")
_CLOSE = frozenset(b"]}")

_SPACE = _run(rb"[ \t\r\n]*+")
_STRING_BODY = _run(rb'(?:[^"\\]++|\\.)*+', re.S)  # stops at ", a trailing \ or the end
_SCALAR = _run(rb'[^,:\[\]{}"\s]*+')
_OPENERS = _run(rb"[\[{]++")
_CLOSERS = _run(rb"[\]}]++")
# A whole prefix of a JSON string's body: stops before an escape cut in two, a lone high
# surrogate or anything else orjson would refuse.
_WHOLE_ESCAPES = _run(
    rb'(?:[^\\]++|\\["\\/bfnrt]|\\u(?![dD][89abAB])[0-9a-fA-F]{4}'
    rb"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})*+"
)


_SMALL_LEVELS = 4
_SMALL_BYTES = 4096


def _small_pattern(levels: int) -> re.Pattern[bytes]:
    string = rb'"(?:[^"\\]++|\\.)*+"'
    plain = rb'[^"\[\]{}]++'
    run = rb"(?:%s|%s)*+" % (plain, string)
    for _ in range(levels - 1):
        run = rb"(?:%s|%s|\{%s\}|\[%s\])*+" % (plain, string, run, run)
    return re.compile(rb"\{%s\}|\[%s\]" % (run, run), re.S)


_SMALL = _small_pattern(_SMALL_LEVELS)
_LONG_SCALAR = re.compile(rb'[^\s,:\[\]{}"]{%d}' % (MAX_SCALAR_BYTES + 1))
_KEEP_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_REDUCE_PASSES = 8

# Where the reader is.
_VALUE, _STRING, _SCALAR_RUN, _SKIPPING, _DONE, _FAILED = range(6)


class JsonSkeleton:
    """Incremental: ``feed(bytes)`` the body as it arrives, then :meth:`close`."""

    __slots__ = (
        "_state",
        "_out",
        "_stack",
        "_counts",
        "_skip",
        "_token",
        "_token_len",
        "_escape",
        "_skip_string",
        "_steps",
        "_budget",
        "_fed",
        "_counting",
    )

    def __init__(self) -> None:
        self._state = _VALUE
        self._out = bytearray()
        self._stack = bytearray()  # the kept containers: b"{" or b"["
        self._counts: list[int] = []  # members of each kept container seen so far
        self._skip = 0  # containers open inside the skipped region
        self._token = bytearray()  # the string or scalar being read (its first bytes)
        self._token_len = 0
        self._escape = False  # a backslash ended the last piece inside a string
        self._skip_string = False  # that string is inside skipped content
        self._steps = 0
        self._budget = _STEP_ALLOWANCE
        self._fed = 0
        self._counting = True  # _skip_counted may still pay off in this piece

    @property
    def steps(self) -> int:
        """Python steps taken so far (the work budget counts them)."""
        return self._steps

    @property
    def failed(self) -> bool:
        return self._state == _FAILED

    def feed(self, data: bytes) -> None:
        if self._state == _FAILED:
            return
        if type(data) is not bytes:  # bytes methods and slices below (the relay gives bytes)
            data = bytes(data)
        end = len(data)
        self._fed += end
        self._budget = _STEP_ALLOWANCE + self._fed // _BYTES_PER_STEP
        pos = 0
        out = self._out
        self._counting = True
        while pos < end:
            state = self._state
            if state == _VALUE:
                pos = self._structure(data, pos, end)
            elif state == _STRING:
                pos = self._string(data, pos, end)
            elif state == _SKIPPING:
                pos = self._skipping(data, pos, end)
            elif state == _SCALAR_RUN:
                pos = self._scalar(data, pos, end)
            elif state == _DONE:
                pos = _SPACE.match(data, pos).end()
                if pos < end:  # bytes after the document: keep one, so the copy is invalid too
                    out.append(data[pos])
                    self._state = _FAILED_LATER
                    return
            else:
                return
            self._steps += 1
            if self._steps > self._budget or len(out) > MAX_OUTPUT_BYTES:
                self._fail()
                return

    def close(self) -> bytes | None:
        """The copy, or None when the reader gave up (the body is not inspected)."""
        if self._state == _FAILED:
            return None
        if self._state == _SCALAR_RUN:  # a document that is one number or literal
            self._scalar_done()
        return bytes(self._out)

    # -- internals -------------------------------------------------------------------------

    def _fail(self) -> int:
        self._state = _FAILED
        self._out = bytearray()
        self._token = bytearray()
        return 1 << 62

    def _structure(self, data: bytes, pos: int, end: int) -> int:
        pos = _SPACE.match(data, pos).end()
        if pos == end:
            return end
        byte = data[pos]
        out = self._out
        if byte == _QUOTE:
            self._state = _STRING
            self._skip_string = False
            self._token = bytearray()
            self._token_len = 0
            return pos + 1
        if byte in _OPEN:
            if len(self._stack) + _SMALL_LEVELS <= MAX_KEPT_DEPTH:
                small = _small_value(data, pos, end)
                if small:
                    out += small
                    if not self._stack:
                        self._state = _DONE
                    return pos + len(small)
            out.append(byte)
            self._stack.append(byte)
            self._counts.append(1)
            if len(self._stack) > MAX_KEPT_DEPTH:  # kept empty: {} or []
                self._state, self._skip = _SKIPPING, 1
            return pos + 1
        if byte in _CLOSE:
            out.append(byte)
            if not self._stack:  # a stray closer: the copy is as broken as the body
                self._state = _FAILED_LATER
                return end
            self._stack.pop()
            self._counts.pop()
            if not self._stack:
                self._state = _DONE
            return pos + 1
        if byte == 0x2C:  # ,
            counts = self._counts
            if counts and counts[-1] >= MAX_MEMBERS:  # the rest of this container is skipped
                self._state, self._skip = _SKIPPING, 1
                return pos + 1
            if counts:
                counts[-1] += 1
            out.append(byte)
            return pos + 1
        if byte == 0x3A:  # :
            out.append(byte)
            return pos + 1
        self._state = _SCALAR_RUN
        self._token = bytearray()
        self._token_len = 0
        return pos

    def _keep(self, piece: bytes, limit: int) -> None:
        room = limit - len(self._token)
        self._token_len += len(piece)
        if room > 0:
            self._token += piece[:room] if len(piece) > room else piece

    def _string(self, data: bytes, pos: int, end: int) -> int:
        keep = not self._skip_string
        if self._escape:
            self._escape = False
            if keep:
                self._keep(data[pos : pos + 1], MAX_STRING_BYTES)
            pos += 1
            if pos == end:
                return end
        stop = _STRING_BODY.match(data, pos).end()
        if keep and stop > pos:
            self._keep(data[pos:stop], MAX_STRING_BYTES)
        if stop == end:
            return end
        if data[stop] == _QUOTE:
            if keep:
                self._string_done()
            else:
                self._state = _SKIPPING
            return stop + 1
        # A backslash ends the piece: the byte it escapes comes with the next one.
        if keep:
            self._keep(b"\\", MAX_STRING_BYTES)
        self._escape = True
        return end

    def _string_done(self) -> None:
        token: bytes | bytearray = self._token
        if self._token_len > MAX_STRING_BYTES:
            token = _whole_prefix(bytes(token))
        out = self._out
        out.append(_QUOTE)
        out += token
        out.append(_QUOTE)
        self._token = bytearray()
        self._state = _VALUE if self._stack else _DONE

    def _scalar(self, data: bytes, pos: int, end: int) -> int:
        stop = _SCALAR.match(data, pos).end()
        if stop > pos:
            self._keep(data[pos:stop], MAX_SCALAR_BYTES + 1)
        if stop == end:
            return end
        if stop == pos and self._token_len == 0:  # a byte no token starts with
            self._out.append(data[pos])
            self._state = _FAILED_LATER
            return end
        self._scalar_done()
        return stop  # the delimiter is read as structure

    def _scalar_done(self) -> None:
        self._out += b"null" if self._token_len > MAX_SCALAR_BYTES else self._token
        self._token = bytearray()
        self._state = _VALUE if self._stack else _DONE

    def _skipping(self, data: bytes, pos: int, end: int) -> int:
        if self._counting:
            fast = self._skip_counted(data, pos, end)
            if fast is not None:
                return fast
            self._counting = False  # tried once per piece: a miss costs a pass over it
        pos = _SKIP_RUN.match(data, pos).end()
        if pos == end:
            return end
        byte = data[pos]
        if byte == _QUOTE:  # a string the piece cuts
            self._state = _STRING
            self._skip_string = True
            return pos + 1
        if byte in _OPEN:
            stop = _OPENERS.match(data, pos).end()
            self._skip += stop - pos
            if len(self._stack) + self._skip > MAX_NESTING:
                return self._fail()
            return stop
        stop = _CLOSERS.match(data, pos).end()
        closed = stop - pos
        if closed < self._skip:
            self._skip -= closed
            return stop
        # The closer of the container being skipped: read as structure.
        pos += self._skip - 1
        self._skip = 0
        self._state = _VALUE
        return pos

    def _skip_counted(self, data: bytes, pos: int, end: int) -> int | None:
        """Skip the rest of the piece with bytes methods only (several hundred MB/s, the
        expression does 40), when that provably does not pass the end of the skipped
        region: strings removed by splitting at quotes (when no backslash makes that
        ambiguous), every byte but brackets deleted, then nested pairs removed a level
        per pass. What remains is ``]...][...[``: fewer closers than open containers means
        the region goes on past this piece. Anything else (the end of the region in sight,
        escapes, nesting deeper than the passes) is left to the expression. Returns where
        it stopped, or None."""
        seg = data[pos:end] if pos or end != len(data) else data
        if 0x5C in seg:  # a backslash
            return None
        stop = end
        if 0x22 in seg:
            parts = seg.split(b'"')
            if len(parts) % 2 == 0:  # the last quote opens a string the piece cuts
                last = len(seg) - len(parts[-1]) - 1
                seg, stop = seg[:last], pos + last
                parts.pop()
            seg = b"".join(parts[0::2])
        brackets = seg.translate(_KEEP_BRACKETS, _NOT_BRACKETS)
        for _ in range(_REDUCE_PASSES):
            reduced = brackets.replace(b"[]", b"")
            if len(reduced) == len(brackets):
                break
            brackets = reduced
        opened = brackets.lstrip(b"]")
        closed = len(brackets) - len(opened)
        if closed >= self._skip or opened.count(b"]"):
            return None
        self._skip += len(opened) - closed
        if len(self._stack) + self._skip > MAX_NESTING:
            return self._fail()
        if stop < end:  # at the opening quote of the cut string
            self._state = _STRING
            self._skip_string = True
            return stop + 1
        return end


_FAILED_LATER = _DONE + 10
"""The copy is already invalid (a stray byte was kept): nothing more is read, and the
parser reports it as not JSON, as it would have reported the body."""


def _small_value(data: bytes, pos: int, end: int) -> bytes | None:
    """The container starting at ``pos`` when it is small enough to be kept as it is:
    whole within ``_SMALL_BYTES`` of this piece, at most ``_SMALL_LEVELS`` deep, no string
    longer than ``MAX_STRING_BYTES``, no scalar longer than ``MAX_SCALAR_BYTES`` and fewer
    commas than ``MAX_MEMBERS``. One step for what would take dozens (a ``usage`` object,
    one logprobs entry, SGLang's ``meta_info``); the checks err towards the slow path."""
    window = data[pos : min(end, pos + _SMALL_BYTES)]
    found = _SMALL.match(window)
    if found is None:
        return None
    value = found.group()
    if value.count(b",") >= MAX_MEMBERS or _LONG_SCALAR.search(value) is not None:
        return None
    if len(value) > MAX_STRING_BYTES and 0x22 in value:  # are its strings short? (odd parts)
        if 0x5C in value or max(map(len, value.split(b'"')[1::2])) > MAX_STRING_BYTES:
            return None
    return value


def _whole_prefix(token: bytes) -> bytes:
    """The longest prefix of a cut string's body that is still a valid JSON string."""
    token = token[: _WHOLE_ESCAPES.match(token).end()]
    try:
        token.decode()
    except UnicodeDecodeError as e:
        if e.end == len(token) and e.reason == "unexpected end of data":
            token = token[: e.start]  # a character cut in two
    return token


def json_skeleton(body: bytes) -> bytes | None:
    """The copy of a whole body (tests; the observer feeds pieces)."""
    reader = JsonSkeleton()
    reader.feed(body)
    return reader.close()
