"""The request-field scanner against orjson: same model, stream and max-tokens on any valid
JSON, fed whole, byte by byte and at random splits, with bounded memory on hostile bodies."""

from __future__ import annotations

import json
import random
import time

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from sidecar.measure.request_fields import (
    MAX_TOKEN_KEYS,
    SMALL_BODY_BYTES,
    RequestFields,
    RequestFieldScanner,
    scan_request_fields,
)


def reference(body: bytes) -> RequestFields | None:
    """What the proxy read from a fully parsed body before the scanner."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(doc) is not dict:
        return None
    model = doc.get("model")
    max_tokens = None
    for holder in (doc, doc.get("parameters"), doc.get("options")):
        if type(holder) is dict and max_tokens is None:
            for key in MAX_TOKEN_KEYS:
                if type(holder.get(key)) is int:
                    max_tokens = holder[key]
                    break
    return RequestFields(
        model if isinstance(model, str) else None, doc.get("stream") is True, max_tokens
    )


def split_feed(body: bytes, cuts: list[int]) -> RequestFields | None:
    scanner = RequestFieldScanner()
    for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True):
        scanner.feed(body[a:b])
    return scanner.close()


def scanned(body: bytes, max_value_bytes: int = 1024) -> RequestFields | None:
    scanner = RequestFieldScanner(max_value_bytes)
    scanner.feed(body)
    return scanner.close()


def check_all_ways(body: bytes, expected: RequestFields | None, rng: random.Random) -> None:
    assert scanned(body) == expected
    if len(body) <= SMALL_BODY_BYTES:
        assert scan_request_fields(body) == reference(body)  # the small-body path: orjson
    if len(body) < 3000:
        assert split_feed(body, list(range(1, len(body)))) == expected
    for _ in range(5):
        n = rng.randint(0, min(60, max(len(body) - 1, 0)))
        assert (
            split_feed(body, sorted(rng.sample(range(1, len(body)), n)) if len(body) > 1 else [])
            == expected
        )


KEYS = st.sampled_from(
    [
        "model",
        "stream",
        "parameters",
        "options",
        "messages",
        "prompt",
        "mo\u00efdel",
        "",
        *MAX_TOKEN_KEYS,
    ]
) | st.text(max_size=8)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=25,
)


def encode_pairs(pairs: list[tuple[str, object]], rng: random.Random) -> bytes:
    """A JSON object with possibly repeated keys, random whitespace and random escaping."""
    parts = []
    for key, value in pairs:
        if isinstance(value, list) and value[:1] == ["__object__"]:
            text = encode_pairs(value[1], rng).decode()
        else:
            text = json.dumps(value, ensure_ascii=rng.random() < 0.5)
        k = json.dumps(key, ensure_ascii=rng.random() < 0.5)
        if rng.random() < 0.2 and key and max(map(ord, key)) < 0xD800:
            k = '"' + "".join(f"\\u{ord(c):04x}" for c in key) + '"'  # a fully escaped key
        ws = rng.choice(["", " ", "\n\t ", "\r\n"])
        parts.append(f"{ws}{k}{ws}:{ws}{text}{ws}")
    return ("{" + ",".join(parts) + "}").encode()


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(
            KEYS,
            VALUES | st.lists(st.tuples(KEYS, VALUES), max_size=4).map(lambda p: ["__object__", p]),
        ),
        max_size=8,
    ),
    seed=st.integers(0, 2**32),
)
def test_same_fields_as_orjson_on_valid_json_any_split(pairs, seed):
    rng = random.Random(seed)
    body = encode_pairs(pairs, rng)
    expected = reference(body)
    assert expected is not None  # valid JSON, an object
    check_all_ways(body, expected, rng)


@settings(max_examples=200, deadline=None)
@given(doc=VALUES, seed=st.integers(0, 2**32))
def test_same_answer_as_orjson_for_any_json_value(doc, seed):
    body = orjson.dumps(doc)
    check_all_ways(body, reference(body), random.Random(seed))


@pytest.mark.parametrize(
    "body, expected",
    [
        (b'{"model":"m","stream":true,"max_tokens":5}', RequestFields("m", True, 5)),
        (
            b'{"mo\\u0064el":"a\\"b\\\\","stream":false,"parameters":{"max_new_tokens":3}}',
            RequestFields('a"b\\', False, 3),
        ),
        (
            b'{"options":{"num_predict":7},"messages":[{"a":[[[[[[{"b":"}]\\"{["}]]]]]]}],"model":"x"}',
            RequestFields("x", False, 7),
        ),
        (b'{"model":1,"model":"y"}', RequestFields("y")),  # the last duplicate wins
        (b'{"model":"y","model":null}', RequestFields(None)),
        (b'{"parameters":{"max_new_tokens":3},"parameters":5}', RequestFields()),
        (b'{"parameters":{"max_new_tokens":3},"parameters":{"x":1}}', RequestFields()),
        (
            b'{"max_tokens":5.0,"n_predict":4,"max_completion_tokens":true}',
            RequestFields(max_tokens=4),
        ),
        (
            b'{"model":"\xf0\x9f\xa6\x99 caf\xc3\xa9","stream":true}',
            RequestFields("\U0001f999 caf\u00e9", True),
        ),
        (b'{"prompt":"' + b"\\\\" * 1000 + b'","model":"m"}', RequestFields("m")),
        (b'{"a":' + b"[" * 5000 + b"]" * 5000 + b',"model":"deep"}', RequestFields("deep")),
        (b"[{}]", None),
        (b'"model"', None),
        (b'{"model":"m"', None),  # unfinished
        (b'{"model":"m"}x', None),  # bytes after the document
        (b'{"model" "m"}', None),
        (b'{"model":"m",}', None),
        (b"", None),
    ],
)
def test_known_bodies(body, expected):
    check_all_ways(body, expected, random.Random(1))
    if expected is not None and body.count(b"[") < 1000:
        assert reference(body) == expected


def test_deeper_than_orjson_still_scanned_without_recursion():
    # orjson refuses nesting past 1024 levels; the scanner keeps a counter, not a stack.
    body = (
        b'{"model":"m","x":'
        + b"[" * 20_000
        + b"]" * 20_000
        + b',"stream":true,"pad":"'
        + b"p" * 30_000
        + b'"}'
    )
    assert reference(body) is None
    assert len(body) > SMALL_BODY_BYTES
    assert scan_request_fields(body) == scanned(body) == RequestFields("m", True)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # Every bracket past the skip pattern's three levels is a Python step: given up.
        (b'{"model":"m","messages":' + b"[0," * 4_000_000 + b"0" + b"]" * 4_000_000 + b"}", None),
        (b'{"model":"m","x":' + b'{"a":' * 3_000_000 + b"0" + b"}" * 3_000_000 + b"}", None),
        # Escapes are skipped in C, in a skipped string and past a kept value's limit.
        (
            b'{"model":"m","messages":[{"role":"user","content":"' + b"\\n" * 15_000_000 + b'"}]}',
            RequestFields("m"),
        ),
        (b'{"stream":true,"model":"' + b"\\n" * 15_000_000 + b'"}', "cut"),
    ],
    ids=["deep-arrays", "deep-objects", "escaped-content", "escaped-model"],
)
def test_costly_shapes_take_bounded_cpu(body, expected):
    """A body built to cost Python steps per byte (5-14 s of CPU if read naively) takes one
    step per 8 bytes at most, then it is given up."""
    start = time.process_time()
    scanner = RequestFieldScanner(max_value_bytes=1024)
    for i in range(0, len(body), 65536):
        scanner.feed(body[i : i + 65536])
    got = scanner.close()
    assert time.process_time() - start < 2.0  # 5.6-13.8 s before
    if expected == "cut":
        assert got is not None and got.stream and len(got.model) <= 1024
    else:
        assert got == expected


def test_hostile_bodies_are_scanned_in_bounded_memory_and_linear_time():
    import tracemalloc

    messages = (
        b'{"model":"m","messages":['
        + b",".join([b'{"role":"user","content":"x"}'] * 200_000)
        + b'],"stream":true}'
    )
    empties = b"[" + b",".join([b"{}"] * 1_000_000) + b"]"
    many_keys = (
        b"{" + b",".join(b'"k%d":[1,{"a":"b"}]' % i for i in range(200_000)) + b',"model":"z"}'
    )
    long_model = b'{"model":"' + b"m" * 5_000_000 + b'"}'
    for body, expected in (
        (messages, RequestFields("m", True)),
        (empties, None),
        (many_keys, RequestFields("z")),
        (long_model, None),
    ):
        tracemalloc.start()
        scanner = RequestFieldScanner(max_value_bytes=1024)
        for i in range(0, len(body), 65536):
            scanner.feed(body[i : i + 65536])
        got = scanner.close()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        if expected is not None:
            assert got == expected
        assert peak < 1 << 20, (len(body), peak)  # the slices of one piece, never the body
    got = scanned(long_model, max_value_bytes=1024)
    assert (
        got is not None and got.model is not None and len(got.model) == 1024
    )  # cut, labelled other
