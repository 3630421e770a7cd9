#!/usr/bin/env python3
"""The suite's fuzz properties, run much longer: every stream dialect and JSON parser of the
route table, the observer, and the SSE decoder, over hostile bytes at
any split points (see ``tests/unit/streams/test_fuzz_dialects.py`` for the properties and
the byte mix).

Hypothesis by default (``--examples`` per property); with ``--atheris`` (if the ``atheris``
package is installed) coverage-guided fuzzing of the same properties for ``--seconds``.
A failure prints the falsifying input and exits 1.

Run:  python scripts/fuzz.py --examples 20000
      python scripts/fuzz.py --atheris --seconds 600
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import (  # noqa: E402
    HealthCheck,
    given,
    settings,
    strategies as st,
)

from tests.unit.streams.test_fuzz_dialects import (  # noqa: E402
    JSON_ROUTES,
    STREAM_ROUTES,
    cuts_for,
    hostile_bytes,
    json_objects,
    max_lines,
    prop_dialect,
    prop_json,
    prop_observer,
    prop_sse,
)


def hypothesis_run(examples: int) -> None:
    cfg = settings(
        max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )

    @cfg
    @given(st.sampled_from(STREAM_ROUTES), st.data(), max_lines)
    def dialects(template, data, max_line):
        raw = data.draw(hostile_bytes)
        prop_dialect(template, raw, data.draw(cuts_for(raw)), max_line)

    @cfg
    @given(st.sampled_from(STREAM_ROUTES), st.data(), max_lines)
    def observer(template, data, max_line):
        raw = data.draw(hostile_bytes)
        prop_observer(template, raw, data.draw(cuts_for(raw)), max_line)

    @cfg
    @given(
        st.sampled_from(JSON_ROUTES),
        st.one_of(hostile_bytes, json_objects.map(lambda o: repr(o).encode())),
    )
    def json_bodies(template, body):
        prop_json(template, body)

    @cfg
    @given(st.data(), max_lines)
    def sse(data, max_line):
        raw = data.draw(hostile_bytes)
        prop_sse(raw, data.draw(cuts_for(raw)), max_line)

    for prop in (dialects, observer, json_bodies, sse):
        t0 = time.monotonic()
        prop()
        print(
            f"{prop.__name__:<14} {examples} examples  {time.monotonic() - t0:6.1f} s  ok",
            flush=True,
        )


def atheris_run(seconds: float) -> None:
    import atheris  # noqa: PLC0415

    lines = [None, 1, 7, 64, 256]

    def one_input(buf: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(buf)
        template = STREAM_ROUTES[fdp.ConsumeIntInRange(0, len(STREAM_ROUTES) - 1)]
        max_line = lines[fdp.ConsumeIntInRange(0, len(lines) - 1)]
        cuts = [fdp.ConsumeIntInRange(0, 4096) for _ in range(fdp.ConsumeIntInRange(0, 8))]
        data = fdp.ConsumeBytes(fdp.remaining_bytes())
        prop_dialect(template, data, cuts, max_line)
        prop_observer(template, data, cuts, max_line)
        prop_sse(data, cuts, max_line)
        prop_json(JSON_ROUTES[len(data) % len(JSON_ROUTES)], data)

    atheris.Setup([sys.argv[0], f"-max_total_time={int(seconds)}"], one_input)
    atheris.Fuzz()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=20000, help="hypothesis examples per property")
    p.add_argument(
        "--atheris", action="store_true", help="coverage-guided fuzzing with atheris instead"
    )
    p.add_argument("--seconds", type=float, default=300, help="atheris: how long")
    args = p.parse_args()
    if args.atheris:
        try:
            import atheris  # noqa: F401, PLC0415
        except ImportError:
            print(
                "atheris is not installed (pip install atheris); use the hypothesis mode",
                file=sys.stderr,
            )
            return 2
        atheris_run(args.seconds)
        return 0
    t0 = time.monotonic()
    hypothesis_run(args.examples)
    print(f"all properties held ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
