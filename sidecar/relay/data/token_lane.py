"""The steady token read, relayed and noted in one compiled call.

Once a stream's dialect has armed its repeating event's template
(:mod:`sidecar.streams.protocols.template`), nearly every read from the upstream is one
whole HTTP chunk holding that event with another text. The Python path for such a
read runs seven functions (``UpstreamConnection.data_received`` -> ``BodyRelay.chunk`` ->
``ResponseObserver.feed`` -> ``SSEJSONDialect.feed`` -> ``EventTemplate.matches`` ->
``RequestTimeline.events``) over as many objects, to do little: check the bytes, write them
on, append one gap. A :class:`TokenLane` (``_token_lane.c`` beside this module) does that in one
call from ``data_received``, and keeps what it noted (the gaps, the streams decoding at
each, the bytes sent: a batch of 32) in itself, one object, not spread over the timeline,
its arrays and the relay. It hands each batch to one function, ``notes``, made here: the
relay adds the bytes to what it sent and the timeline adds the tokens by its one per-token
rule (:meth:`~sidecar.measure.timeline.RequestTimeline.add_tokens`), the same call the
Python path makes. It answers False, having done nothing, for any read it is not sure
of: another shape, a text that is neither plain nor plain but for JSON's one-character
escapes (``\\n``, ``\\"``; a ``\\u`` escape is decoded by Python), the client's buffer not
empty or its transport closing, the client's progress check due.

Why in the lane and not on the objects: a first lane that did the same steps in C on the
timeline, its arrays, the relay, parser, observer and dialect (~25 attribute reads and writes
a token) saved nothing measurable (paired 0.98); in the relay every one of those objects is
out of the cache by the stream's next token. Keeping the notes in the lane: paired 0.86 of
the CPU per token (docs/performance.md).

What a lane does not check per read, the relay checks each time it opens one (``BodyRelay._link``,
after every read the Python path took, as the Python path is what changes these): the
parser between chunks, the relay neither ended nor paused, the dialect's template still the
lane's, the timeline past its first token (and its first answer token, for an answer lane);
and the client's buffer empty (a slow reader's next read would go to Python anyway).
The connection flushes and drops the lane before the Python path takes a read
(``UpstreamConnection.data_received``), and the relay flushes it when it ends
(``BodyRelay.settle``), so whatever reads the timeline or ``BodyRelay.sent`` sees every token.

The Python path is the oracle: tests/unit/relay/data/test_token_lane.py relays the same streams
with lanes and without and compares the bytes and every figure. The lane writes no
attribute of another object (a test runs it against objects that refuse every write): what
it is given is the small protocol below, :class:`LaneTransport`, :class:`Decoding`, a clock
and ``notes``. Without the C extensions the same lane in Python stands in
(:mod:`~sidecar.relay.data.token_lane_py`: most of the gain came from keeping the notes in
one object, not from C), checked against the same oracle. Which one is used is decided
here, once: :data:`TokenLane`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...base.speedups import IN_C
from ...measure.timeline import RequestTimeline
from ...streams.protocols.events import TokenKind
from . import token_lane_py
from .token_lane_py import Decoding, LaneTransport
from .upstream import YIELD_AFTER_READ

if TYPE_CHECKING:
    from array import array

    from ...streams.protocols.template import EventTemplate

__all__ = ["lane_for", "AVAILABLE", "LaneTransport", "Decoding", "TokenLane", "IN_C_LANE"]

_c_lane: type[token_lane_py.TokenLane] | None
try:  # sidecar/relay/data/_token_lane.c, built with the byte checks where a compiler is
    from ._token_lane import TokenLane as _c_lane
except ImportError:
    _c_lane = None
if not IN_C:  # one compiler builds both; a C lane without the C checks is no install's state
    _c_lane = None
IN_C_LANE = _c_lane is not None
"""Whether the lanes are the compiled ones (else :class:`token_lane_py.TokenLane`)."""
TokenLane = token_lane_py.TokenLane if _c_lane is None else _c_lane

AVAILABLE = True
"""Lanes are always there (in C or in Python); the relay still reads this, and a test
switches lanes off through it."""

_KINDS = {TokenKind.ANSWER: 0, TokenKind.REASONING: 1, TokenKind.TOOL: 2}


def lane_for(
    steady: tuple[EventTemplate, TokenKind] | None,
    *,
    clock: Callable[[], float],
    transport: LaneTransport,
    timeline: RequestTimeline,
    on_sent: Callable[[int], None],
    high_water: int,
) -> token_lane_py.TokenLane | None:
    """A lane for ``steady``, ``observer.steady()``'s ``(template, kind)``, or None
    when there is nothing it may stand for yet: the first token (of an answer lane's kind:
    the first answer token) is the Python path's to record. Its notes go to ``on_sent``
    (the bytes written) and to ``timeline.add_tokens``."""
    if steady is None or timeline.first_token is None:
        return None
    memo, kind = steady
    if kind is TokenKind.ANSWER and timeline.first_answer_token is None:
        return None
    add_tokens = timeline.add_tokens

    def notes(sent: int, gaps: array[float], streams: array[int], last: float) -> None:
        if sent:
            on_sent(sent)
        if gaps:
            add_tokens(len(gaps), gaps, streams, last, kind)

    return TokenLane(
        clock=clock,
        transport=transport,
        decoding=timeline.decode,
        notes=notes,
        memo=memo,
        prefix=memo.prefix,
        suffix=memo.suffix,
        limit=memo.limit,
        kind=_KINDS[kind],
        high_water=high_water,
        yield_after=YIELD_AFTER_READ,
    )
