"""Time the JSON skeleton reader on hostile response bodies (issue 23, finding 3).

    .venv/bin/python -m bench.json_skeleton            # every shape, 64 KiB pieces
    .venv/bin/python -m bench.json_skeleton choices    # one shape

Each body (about 16 MiB, the default ``max_response_inspect_bytes``) is fed to a
:class:`~sidecar.measure.json_skeleton.JsonSkeleton` in 64 KiB pieces, as the relay reads
them. Printed: the CPU time of all feeds and of the largest single feed (thread CPU time,
so a busy machine does not inflate it), the size of the copy (``None``: the reader gave
up, the body counts as not inspected) and the Python steps taken. Measured, never
asserted: the bounds are tested in ``tests/unit/measure/test_json_skeleton.py``.
"""

from __future__ import annotations

import sys
import time

from sidecar.measure.json_skeleton import JsonSkeleton

PIECE = 64 << 10


def shapes() -> dict[str, bytes]:
    return {
        "choices": b'{"choices":['
        + b",".join([b"{}"] * 5_500_000)
        + b'],"usage":{"prompt_tokens":1}}',
        "top_array": b"[" + b",".join([b"{}"] * 5_500_000) + b"]",
        "long_string": b'{"choices":[{"message":{"content":"' + b"x" * (15 << 20) + b'"}}]}',
        "escapes": b'{"a":"' + b"\\n" * (7 << 20) + b'"}',
        "keys": b"{" + b",".join(b'"k%d":1' % i for i in range(1_000_000)) + b"}",
        "deep": b"[" * (8 << 20) + b"]" * (8 << 20),
        "string_objects": b"[" + b",".join([b'{"a":"b"}'] * 1_700_000) + b"]",
        "escaped_objects": b"[" + b",".join([b'{"a":"\\n"}'] * 1_500_000) + b"]",
        "tall": b"[" + b",".join([b"[[[[0]]]]"] * 1_700_000) + b"]",
        "comb": (b"[" + b"[0," * 1000 + b"0" + b"]" * 1000 + b",") * 5000 + b"0]",
        "comb_after": (b"[" + b"[" * 1000 + b"0" + b"],0" * 1000 + b",") * 5000 + b"0]",
        "kept_tokens": b"[" + b",".join([b"[" + b",".join([b"0"] * 300) + b"]"] * 28000) + b"]",
    }


def measure(body: bytes) -> tuple[float, float, int | None, int]:
    reader = JsonSkeleton()
    largest = 0.0
    start = time.thread_time()
    for i in range(0, len(body), PIECE):
        t = time.thread_time()
        reader.feed(body[i : i + PIECE])
        largest = max(largest, time.thread_time() - t)
    copy = reader.close()
    return time.thread_time() - start, largest, None if copy is None else len(copy), reader.steps


def main(argv: list[str]) -> None:
    for name, body in shapes().items():
        if argv and name not in argv:
            continue
        total, largest, out, steps = measure(body)
        print(
            f"{name:16s} {len(body) / 2**20:5.1f} MiB  all feeds {total * 1e3:6.1f} ms  "
            f"largest feed {largest * 1e3:5.2f} ms  copy {out} B  steps {steps}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
