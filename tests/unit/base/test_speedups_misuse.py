"""No call order crashes the C extensions (sidecar/base/_speedups.c and
sidecar/relay/data/_token_lane.c): every type and function
it exports, called on an object never initialised, with the wrong argument types, in an
odd order, or with counts at the edge of a machine word, raises a Python exception or
answers; it never dereferences NULL or overflows a signed integer.

Each case runs in its own interpreter, so a crash is one failed test (with its signal in the
message), not a dead test runner. The child imports the same package copy as this process
(``make test-sanitizers`` runs these against a build with ASan and UBSan: its preload and
options are inherited). :func:`test_every_entry_point_has_a_case` keeps the table complete
when the module grows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import sidecar
from tests.support.skips import IN_CI

try:
    from sidecar.base import _speedups
    from sidecar.relay.data import _token_lane
except ImportError:  # not built: no C compiler when the package was installed
    _speedups = _token_lane = None

pytestmark = pytest.mark.skipif(
    _speedups is None and not IN_CI,
    reason="the C extension was not built (no C compiler when the package was installed)",
)

PRELUDE = r'''
import copy, sys
from array import array
from types import SimpleNamespace as NS
from sidecar.base import _speedups as m
from sidecar.relay.data._token_lane import TokenLane
PREFIX, SUFFIX = b'data: {"t":"', b'"}\n\n'

class Transport:
    def __init__(self):
        self.out = []
    def write(self, data):
        self.out.append(data)
    def is_closing(self):
        return False
    def get_write_buffer_size(self):
        return 0

class Notes:
    """What a lane hands over, gathered (the relay and the timeline do this in the package)."""
    def __init__(self):
        self.sent, self.gaps, self.streams, self.last, self.calls = 0, array("d"), array("I"), None, 0
    def __call__(self, sent, gaps, streams, last):
        self.calls += 1
        self.sent += sent
        self.gaps.extend(gaps)
        self.streams.extend(streams)
        self.last = last

def lane_args(**kw):
    args = dict(clock=lambda: 2.0, transport=Transport(), decoding=NS(n=1), notes=Notes(),
                memo=None, prefix=PREFIX, suffix=SUFFIX, limit=1000, kind=0, high_water=65536,
                yield_after=1 << 20)
    args.update(kw)
    return args

def frame(text=b"a"):
    payload = PREFIX + text + SUFFIX
    return b"%x\r\n%b\r\n" % (len(payload), payload)

def opened(**kw):
    args = lane_args(**kw)
    lane = TokenLane(**args)
    assert lane.open(10.0, 1.0) is True
    return lane, args

def fresh():
    return TokenLane.__new__(TokenLane)

def outcome(fn):
    try:
        result = fn()
    except Exception as exc:
        return type(exc).__name__
    return repr(result)
'''

# name -> (the entry points it calls, setup statements, expression, what it must answer).
# The answers are the extension's contract; a crash (a signal) fails whatever was expected.
CASES: dict[str, tuple[set[str], str, str, str]] = {
    # -- module functions with wrong arguments
    "chunk_payload no argument": ({"chunk_payload"}, "", "m.chunk_payload()", "TypeError"),
    "chunk_payload str": ({"chunk_payload"}, "", "m.chunk_payload('1\\r\\nx\\r\\n')", "TypeError"),
    "chunk_payload None": ({"chunk_payload"}, "", "m.chunk_payload(None)", "TypeError"),
    "chunk_payload bytearray": (
        {"chunk_payload"},
        "",
        "m.chunk_payload(bytearray(b'1\\r\\nx\\r\\n'))",
        "TypeError",
    ),
    "chunk_payload empty": ({"chunk_payload"}, "", "m.chunk_payload(b'')", "None"),
    "chunk_payload 15 f digits": (
        {"chunk_payload"},
        "",
        "m.chunk_payload(b'f' * 15 + b'\\r\\nx\\r\\n')",
        "None",
    ),
    "chunk_payloads no argument": ({"chunk_payloads"}, "", "m.chunk_payloads()", "TypeError"),
    "chunk_payloads str": (
        {"chunk_payloads"},
        "",
        "m.chunk_payloads('1\\r\\nx\\r\\n')",
        "TypeError",
    ),
    "chunk_payloads bytearray": (
        {"chunk_payloads"},
        "",
        "m.chunk_payloads(bytearray(b'1\\r\\nx\\r\\n'))",
        "TypeError",
    ),
    "chunk_payloads empty": ({"chunk_payloads"}, "", "m.chunk_payloads(b'')", "None"),
    "chunk_payloads 15 f digits": (
        {"chunk_payloads"},
        "",
        "m.chunk_payloads(b'1\\r\\nx\\r\\n' + b'f' * 15 + b'\\r\\nx\\r\\n')",
        "None",
    ),
    "chunk_payloads the last chunk alone": (
        {"chunk_payloads"},
        "",
        "m.chunk_payloads(b'0\\r\\n\\r\\n')",
        "([], True)",
    ),
    "chunk_payloads a size line at the end": (
        {"chunk_payloads"},
        "",
        "m.chunk_payloads(b'1\\r\\nx\\r\\n1\\r')",
        "None",
    ),
    "plain_at no argument": ({"plain_at"}, "", "m.plain_at()", "TypeError"),
    "plain_at two arguments": ({"plain_at"}, "", "m.plain_at(b'x', 0)", "TypeError"),
    "plain_at str": ({"plain_at"}, "", "m.plain_at('x', 0, 1)", "TypeError"),
    "plain_at str index": ({"plain_at"}, "", "m.plain_at(b'x', '0', 1)", "TypeError"),
    "plain_at huge index": ({"plain_at"}, "", "m.plain_at(b'x', 2 ** 70, 1)", "OverflowError"),
    "plain_at negative start": ({"plain_at"}, "", "m.plain_at(b'x', -5, 1)", "False"),
    "plain_at end past the bytes": ({"plain_at"}, "", "m.plain_at(b'x', 0, 10 ** 6)", "False"),
    "plain_at start after end": ({"plain_at"}, "", "m.plain_at(b'xy', 2, 1)", "False"),
    "plain_at max index": ({"plain_at"}, "", "m.plain_at(b'x', sys.maxsize, sys.maxsize)", "False"),
    # -- TokenLane() with bad arguments
    "TokenLane no argument": ({"__init__"}, "", "TokenLane()", "TypeError"),
    "TokenLane str prefix": (
        {"__init__"},
        "",
        "TokenLane(**lane_args(prefix='data'))",
        "TypeError",
    ),
    "TokenLane kind out of range": (
        {"__init__"},
        "",
        "TokenLane(**lane_args(kind=7))",
        "ValueError",
    ),
    "TokenLane negative kind": ({"__init__"}, "", "TokenLane(**lane_args(kind=-1))", "ValueError"),
    "TokenLane notes not callable": (
        {"__init__"},
        "",
        "TokenLane(**lane_args(notes=NS()))",
        "TypeError",
    ),
    "TokenLane clock not callable": (
        {"__init__"},
        "",
        "TokenLane(**lane_args(clock=2.0))",
        "TypeError",
    ),
    "TokenLane transport without is_closing": (
        {"__init__"},
        "",
        "TokenLane(**lane_args(transport=NS(write=print)))",
        "AttributeError",
    ),
    "TokenLane transport without write": (
        {"__init__"},
        "",
        "TokenLane(**lane_args(transport=NS()))",
        "AttributeError",
    ),
    "__init__ on another type": (
        {"__init__"},
        "",
        "TokenLane.__init__(object(), **lane_args())",
        "TypeError",
    ),
    # -- a lane never initialised (TokenLane.__new__): every method and attribute
    "uninitialised open": ({"__new__", "open"}, "", "fresh().open(1.0, 1.0)", "RuntimeError"),
    "uninitialised open str": (
        {"__new__", "open"},
        "",
        "fresh().open('soon', 1.0)",
        "RuntimeError",
    ),
    "uninitialised take": ({"__new__", "take"}, "", "fresh().take(frame())", "False"),
    "uninitialised take str": ({"__new__", "take"}, "", "fresh().take('x')", "False"),
    "uninitialised flush": ({"__new__", "flush"}, "", "fresh().flush()", "None"),
    "uninitialised flush open take": (
        {"__new__", "flush", "open", "take"},
        "u = fresh(); u.flush()",
        "(outcome(lambda: u.open(1.0, 1.0)), u.take(frame()), u.flush())",
        "('RuntimeError', False, None)",
    ),
    "uninitialised attributes": (
        {"__new__", "taken", "off", "is_open", "pending", "memo"},
        "u = fresh()",
        "(u.taken, u.off, u.is_open, u.pending, u.memo)",
        "(0, False, False, 0, None)",
    ),
    "uninitialised copy": ({"__new__"}, "", "type(copy.copy(fresh())).__name__", "TypeError"),
    "initialised after __new__": (
        {"__new__", "__init__", "open", "take"},
        "u = fresh(); u.__init__(**lane_args())",
        "(u.open(10.0, 1.0), u.take(frame()), u.taken)",
        "(True, True, 1)",
    ),
    "attribute assignment": (
        {"taken"},
        "lane, _ = opened()",
        "setattr(lane, 'taken', 5)",
        "AttributeError",
    ),
    # -- an initialised lane, misused
    "open str": (
        {"open"},
        "lane = TokenLane(**lane_args())",
        "lane.open('soon', 1.0)",
        "TypeError",
    ),
    "open one argument": (
        {"open"},
        "lane = TokenLane(**lane_args())",
        "lane.open(10.0)",
        "TypeError",
    ),
    "open three arguments": (
        {"open"},
        "lane = TokenLane(**lane_args())",
        "lane.open(10.0, 1.0, 1.0)",
        "TypeError",
    ),
    "open twice": (
        {"open"},
        "lane = TokenLane(**lane_args())",
        "(lane.open(10.0, 1.0), lane.open(10.0, 1.0))",
        "(True, True)",
    ),
    "open before the first token": (
        {"open"},
        "lane = TokenLane(**lane_args())",
        "lane.open(10.0, None)",
        "False",
    ),
    "open with a str last_token": (
        {"open"},
        "lane = TokenLane(**lane_args())",
        "lane.open(10.0, 'x')",
        "TypeError",
    ),
    "open with notes pending": (
        {"open", "take"},
        "lane, _ = opened(); lane.take(frame())",
        "lane.open(10.0, 1.0)",
        "RuntimeError",
    ),
    "take not bytes": (
        {"take"},
        "lane, _ = opened()",
        "(lane.take(1), lane.take(bytearray(frame())), lane.take(None))",
        "(False, False, False)",
    ),
    "take before open": (
        {"take"},
        "lane = TokenLane(**lane_args())",
        "lane.take(frame())",
        "False",
    ),
    "take after flush": (
        {"take", "flush"},
        "lane, _ = opened(); lane.flush()",
        "lane.take(frame())",
        "False",
    ),
    "clock not a float": (
        {"take", "off"},
        "lane, _ = opened(clock=lambda: 'x')",
        "(lane.take(frame()), lane.off)",
        "(False, True)",
    ),
    "write raises": (
        {"take"},
        "lane, _ = opened(transport=NS(write=lambda d: 1 / 0, is_closing=lambda: False, "
        "get_write_buffer_size=lambda: 0))",
        "lane.take(frame())",
        "ZeroDivisionError",
    ),
    "decoding count past an array item": (
        {"take"},
        "lane, a = opened(); a['decoding'].n = 2 ** 40",
        "(lane.take(frame()), lane.off)",
        "(False, False)",
    ),
    "decoding count negative": (
        {"take"},
        "lane, a = opened(); a['decoding'].n = -1",
        "(lane.take(frame()), lane.off)",
        "(False, True)",
    ),
    "decoding without a count": (
        {"take"},
        "lane, a = opened(decoding=NS())",
        "(lane.take(frame()), lane.off)",
        "(False, True)",
    ),
    "notes raise": (
        {"take", "flush", "off"},
        "lane, a = opened(notes=lambda *a: 1 / 0); lane.take(frame())",
        "(lane.flush(), lane.off, lane.pending)",
        "(None, True, 0)",
    ),
    "re-init refused while open": (
        {"__init__", "take"},
        "lane, a = opened()",
        "(outcome(lambda: lane.__init__(**lane_args(kind=9))), lane.take(frame()))",
        "('ValueError', True)",
    ),
    "re-init while open closes": (
        {"__init__", "is_open", "pending"},
        "lane, a = opened(); lane.take(frame()); lane.__init__(**lane_args())",
        "(lane.is_open, lane.pending)",
        "(False, 0)",
    ),
    "a batch and more": (
        {"take", "flush", "pending"},
        "lane, a = opened()\nfor _ in range(70): assert lane.take(frame())",
        "(lane.pending, lane.flush(), a['notes'].calls, len(a['notes'].gaps), lane.taken)",
        "(6, None, 3, 70, 70)",
    ),
    "notes are what was noted": (
        {"take", "flush"},
        "lane, a = opened(); lane.take(frame()); lane.take(frame(b'b')); lane.flush(); n = a['notes']",
        "(n.sent == 2 * len(frame()), n.gaps.tolist(), n.streams.tolist(), n.last, n.calls)",
        "(True, [1.0, 0.0], [1, 1], 2.0, 1)",
    ),
    "nothing noted, nothing handed": (
        {"flush"},
        "lane, a = opened(); lane.flush(); lane.flush()",
        "a['notes'].calls",
        "0",
    ),
}

ENTRY_POINTS = {"chunk_payload", "chunk_payloads", "plain_at", "__new__", "__init__"}


def run_case(setup: str, expr: str) -> subprocess.CompletedProcess:
    code = f"{PRELUDE}\n{setup}\nprint(outcome(lambda: {expr}))\n"
    env = dict(os.environ)
    package_root = str(
        Path(sidecar.__file__).resolve().parents[1]
    )  # the copy this process imported
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )


@pytest.mark.parametrize("name", list(CASES))
def test_no_crash(name: str) -> None:
    _, setup, expr, expected = CASES[name]
    proc = run_case(setup, expr)
    if proc.returncode < 0:
        pytest.fail(
            f"{name}: the interpreter died of {signal.Signals(-proc.returncode).name}\n{proc.stderr[-3000:]}"
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == expected, proc.stderr[-3000:]


def test_every_entry_point_has_a_case() -> None:
    """Every public name the modules export, and every public attribute of their types, is
    called by at least one case above."""
    wanted = set(ENTRY_POINTS)
    exported = set()
    for module in (_speedups, _token_lane):
        names = {n for n in dir(module) if not n.startswith("_")}
        exported |= names
        for name in names:
            obj = getattr(module, name)
            if isinstance(obj, type):
                wanted |= {a for a in dir(obj) if not a.startswith("_")}
            else:
                wanted.add(name)
    covered = set().union(*(case[0] for case in CASES.values()))
    assert exported == {"chunk_payload", "chunk_payloads", "plain_at", "TokenLane"}, (
        "a new export: add its cases"
    )
    assert wanted <= covered, f"no case calls {sorted(wanted - covered)}"
