"""Summarise a py-spy ``--format raw`` (collapsed stacks) profile: top functions by self and
inclusive share of the sampled (non-idle) time.

    .venv/bin/python -m bench.pyspy_top /tmp/prof/sidecar-200.txt [--top 25] [--lines]

``--lines`` keeps line numbers (``Exchange._respond (sidecar/relay/data/exchange.py:440)``) to see which
statement of a function is hot; without it, frames are merged per function.
``--breakdown`` assigns every sample to one part of the sidecar's relay path (first match
in :data:`PARTS`), for a per-token cost split; best on a ``--native`` profile, where the
``read``/``write`` system calls and the idle ``epoll_wait`` show as their own frames.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

_LINE = re.compile(r":\d+\)$")


# (part, frame substrings): a sample belongs to the first part any of whose substrings
# appears in its stack. Order matters: the kernel calls first, then the sidecar's own work,
# then the aiohttp layers around it.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("idle (epoll wait)", ("epoll_wait (", "epoll_pwait (")),
    ("write() syscall: relay to client", ("write (libc", "writev (libc", "sendmsg (libc")),
    ("read() syscall: from upstream/client", ("read (libc", "recv (libc", "recvfrom (libc")),
    ("observe: SSE framing", ("SSEDecoder.",)),
    ("observe: dialect + JSON decode", ("Dialect.", "_count_choices", "orjson")),
    ("observe: timeline", ("RequestTimeline.",)),
    ("observe: other", ("ResponseObserver.feed",)),
    ("metrics at request end", ("SidecarMetrics.", "RecordBook.close", "observe_many")),
    ("relay: write to client", ("BodyRelay.write", "BodyRelay._write_framed")),
    ("relay: upstream framing", ("ResponseParser.", "UpstreamConnection.data_received")),
    (
        "per-request setup/teardown",
        (
            "UpstreamPool.",
            "_request_body",
            "_upstream_headers",
            "RequestHandler.data_received",
            "Carrier.",
            "Exchange._begin",
            "Exchange._send",
            "Exchange._finish",
            "RecordBook.open",
            "request_head",
        ),
    ),
    ("relay: the exchange", ("Exchange.", "BodyRelay.")),
    ("event loop, tasks, other", ("",)),
)


def breakdown(path: str) -> list[tuple[str, int]]:
    counts: Counter = Counter()
    with open(path, encoding="utf-8", errors="replace") as fh:
        for row in fh:
            stack, _, n = row.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            for part, needles in PARTS:
                if any(x in stack for x in needles):
                    counts[part] += int(n)
                    break
    return [(part, counts[part]) for part, _ in PARTS]


def load(path: str, lines: bool) -> tuple[Counter, Counter, int]:
    own: Counter = Counter()
    incl: Counter = Counter()
    total = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for row in fh:
            row = row.rstrip("\n")
            if not row:
                continue
            stack, _, count = row.rpartition(" ")
            n = int(count)
            total += n
            frames = stack.split(";")
            if not lines:
                frames = [_LINE.sub(")", f) for f in frames]
            own[frames[-1]] += n
            for f in set(frames):
                incl[f] += n
    return own, incl, total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.pyspy_top", description=__doc__.split("\n")[0]
    )
    p.add_argument("profile")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--lines", action="store_true", help="keep line numbers")
    p.add_argument("--match", default=None, help="only frames containing this text")
    p.add_argument(
        "--breakdown", action="store_true", help="split samples by part of the relay path"
    )
    p.add_argument(
        "--us-per-token", type=float, default=None, help="with --breakdown: scale to microseconds"
    )
    args = p.parse_args(argv)
    if args.breakdown:
        parts = breakdown(args.profile)
        active = sum(n for part, n in parts if not part.startswith("idle"))
        print(f"{'part':<40} {'% busy':>7}" + (f" {'us/token':>9}" if args.us_per_token else ""))
        for part, n in parts:
            if part.startswith("idle"):
                print(f"{part:<40} {'(' + str(n) + ' samples, excluded)':>7}")
                continue
            share = n / active if active else 0.0
            us = f" {share * args.us_per_token:9.1f}" if args.us_per_token else ""
            print(f"{part:<40} {100 * share:6.1f}%{us}")
        return 0
    own, incl, total = load(args.profile, args.lines)
    if not total:
        print("no samples")
        return 1
    for title, table in (("self", own), ("inclusive", incl)):
        print(f"\n{title} (% of {total} samples)")
        shown = 0
        for frame, n in table.most_common():
            if args.match and args.match not in frame:
                continue
            print(f"{100 * n / total:6.1f}%  {frame}")
            shown += 1
            if shown >= args.top:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
