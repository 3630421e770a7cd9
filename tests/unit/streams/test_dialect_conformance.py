"""Every dialect, every fixture, the same drivers: a stream must read the same whether it
arrives whole, byte by byte, with CRLF or CR line ends, with a last event that never
finished, at random splits, or cut inside a UTF-8 character.

The fixtures and what each must read as are in tests/fixtures/streams/expected.py (sources
in SOURCES.md, recordings of real vLLM and llama.cpp servers among them). What is one
dialect's own (its rules, its non-streamed bodies, its fuzzing keys) stays in
``test_dialect_<name>.py`` / ``test_openai_dialect.py``.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, strategies as st

from tests.fixtures.streams.expected import DIALECTS, Dialect
from tests.fixtures.streams.harness import (
    FAST,
    HERE,
    NDJSON_EOLS,
    SSE_EOLS,
    load,
    objects_from,
    run,
    run_bytewise,
    run_whole,
    split_at,
    with_eol,
)

FIXTURES = [(d, name) for d in DIALECTS for name in sorted(d.cases)]
IDS = [f"{d.folder}/{name}" for d, name in FIXTURES]
SPELLED_OUT = [(d, n) for d, n in FIXTURES if d.cases[n] is not None]
BY_NAME = {d.folder: d for d in DIALECTS}
WITH_UTF8 = [(d, n) for d, n in FIXTURES if any(b >= 0x80 for b in load(d.folder, n))]


def expected(dialect: Dialect, name: str) -> list:
    """The events the fixture must read as: spelled out, or for a recording, its whole reading."""
    events = dialect.cases[name]
    return run_whole(dialect.make, load(dialect.folder, name)) if events is None else events


def eols(dialect: Dialect) -> tuple[bytes, ...]:
    return NDJSON_EOLS if dialect.ndjson else SSE_EOLS


def test_every_stream_fixture_has_expectations():
    """A new fixture file cannot slip past the drivers: each stream in a dialect's folder is listed."""
    for d in DIALECTS:
        streams = {p.name for p in (HERE / d.folder).iterdir() if p.suffix in (".txt", ".ndjson")}
        assert streams == set(d.cases), d.folder


@pytest.mark.parametrize(
    "dialect,name", SPELLED_OUT, ids=[f"{d.folder}/{n}" for d, n in SPELLED_OUT]
)
def test_whole(dialect, name):
    assert run_whole(dialect.make, load(dialect.folder, name)) == dialect.cases[name]


@pytest.mark.parametrize("dialect,name", FIXTURES, ids=IDS)
def test_bytewise(dialect, name):
    assert run_bytewise(dialect.make, load(dialect.folder, name)) == expected(dialect, name)


# NDJSON knows LF and CRLF; SSE also a lone CR.
OTHER_EOLS = [(d, n, eol) for d, n in FIXTURES for eol in eols(d)[1:]]


@pytest.mark.parametrize(
    "dialect,name,eol", OTHER_EOLS, ids=[f"{d.folder}/{n}-{e!r}" for d, n, e in OTHER_EOLS]
)
def test_other_line_ends(dialect, name, eol):
    data = with_eol(load(dialect.folder, name), eol)
    assert run_whole(dialect.make, data) == expected(dialect, name)
    assert run_bytewise(dialect.make, data) == expected(dialect, name)


@pytest.mark.parametrize("dialect,name", FIXTURES, ids=IDS)
def test_ragged_end_adds_nothing(dialect, name):
    assert run_whole(dialect.make, dialect.ragged_end(load(dialect.folder, name))) == expected(
        dialect, name
    )


@pytest.mark.parametrize("dialect,name", WITH_UTF8, ids=[f"{d.folder}/{n}" for d, n in WITH_UTF8])
def test_utf8_character_split_inside(dialect, name):
    raw = load(dialect.folder, name)
    first = next(i for i, b in enumerate(raw) if b >= 0x80)
    assert run(dialect.make, [raw[: first + 1], raw[first + 1 :]]) == expected(dialect, name)


@pytest.mark.parametrize("folder", sorted(BY_NAME))
@FAST
@given(data=st.data())
def test_random_splits(folder, data):
    """Per dialect, so each gets the full number of examples."""
    dialect = BY_NAME[folder]
    name = data.draw(st.sampled_from(sorted(dialect.cases)))
    raw = with_eol(load(dialect.folder, name), data.draw(st.sampled_from(eols(dialect))))
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=25))
    assert run(dialect.make, split_at(raw, cuts)) == expected(dialect, name)


# -- properties: whatever arrives, no dialect raises, and splitting changes nothing --------

OBJECTS = {d.folder: objects_from(list(d.keys)) for d in DIALECTS}


@pytest.mark.parametrize("folder", sorted(BY_NAME))
@FAST
@given(raw=st.binary(max_size=400), cuts=st.lists(st.integers(0, 400), max_size=10))
def test_any_bytes_never_raise(folder, raw, cuts):
    dialect = BY_NAME[folder]
    run(dialect.make, split_at(raw, cuts))
    dialect.parse(raw)


@pytest.mark.parametrize("folder", sorted(BY_NAME))
@FAST
@given(data=st.data())
def test_any_json_events_never_raise_and_split_invariant(folder, data):
    dialect = BY_NAME[folder]
    objs = data.draw(st.lists(OBJECTS[folder], min_size=1, max_size=4))
    events = [
        data.draw(st.sampled_from(dialect.event_names)) if dialect.event_names else None
        for _ in objs
    ]
    raw = b"".join(dialect.frame(orjson.dumps(o), e) for o, e in zip(objs, events, strict=True))
    expected = run_whole(dialect.make, raw)
    assert (
        run(dialect.make, split_at(raw, data.draw(st.lists(st.integers(0, len(raw)), max_size=10))))
        == expected
    )
    for o in objs:
        dialect.parse(orjson.dumps(o))
