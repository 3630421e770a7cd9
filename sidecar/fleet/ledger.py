"""A worker's requests in flight, in memory its supervisor can still read after ``kill -9``.

A worker's registry dies with it; what it had counted survives in the supervisor's last
copy (:mod:`sidecar.fleet.merge`), but the requests it was relaying when it died would be
counted nowhere: their records were to be closed by a process that is gone. So each worker
also keeps its requests in flight, by label set, in a file the supervisor made and maps
too (a shared mapping: the kernel keeps its pages when the writer dies, whatever signal
killed it). When the worker is gone, the supervisor reads what was still in flight and
counts each such request once, as an error (:data:`sidecar.fleet.merge.LOST_REQUEST`).

Layout: :data:`SLOTS` slots of :data:`SLOT_BYTES`; a slot is a little-endian int64 count,
a uint16 key length and the key (``model``, ``route``, ``tenant`` as JSON). Only the worker
writes; a key is written once, before its count first moves, and counts are aligned 8-byte
stores. A label set that does not fit (a key past the slot, or every slot taken: more label
sets than the series budget allows in any case) is kept in slot 0 under ``other``.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Iterator

from ..base.labels import OTHER

__all__ = ["SLOTS", "SLOT_BYTES", "InFlightLedger", "create_ledger", "read_lost"]

SLOTS = 4096
SLOT_BYTES = 256
_SIZE = SLOTS * SLOT_BYTES
_COUNT = struct.Struct("<q")
_KEYLEN = struct.Struct("<H")
_KEY_AT = _COUNT.size + _KEYLEN.size
_KEY_ROOM = SLOT_BYTES - _KEY_AT

Key = tuple[str, str, str]
"""(model label, route template, tenant label or "")."""


def create_ledger(path: str) -> None:
    """The supervisor makes a worker's ledger, zeroed, before it starts the worker."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, _SIZE)
    finally:
        os.close(fd)


def _encode(key: Key) -> bytes:
    return json.dumps(key, separators=(",", ":")).encode()


class InFlightLedger:
    """The worker's side: :meth:`opened` and :meth:`closed` per request, by its labels at
    its start (the ones the in-flight gauge moves under)."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)
        self._slots: dict[Key, int] = {}
        self._counts = [0] * SLOTS
        overflow = _encode((OTHER, OTHER, ""))
        self._write_key(0, overflow)
        self._next = 1

    def _write_key(self, slot: int, key: bytes) -> None:
        at = slot * SLOT_BYTES
        self._map[at + _KEY_AT : at + _KEY_AT + len(key)] = key
        _KEYLEN.pack_into(self._map, at + _COUNT.size, len(key))

    def _slot(self, key: Key) -> int:
        slot = self._slots.get(key)
        if slot is not None:
            return slot
        encoded = _encode(key)
        if len(encoded) > _KEY_ROOM or self._next >= SLOTS:
            slot = 0
        else:
            slot = self._next
            self._next += 1
            self._write_key(slot, encoded)
        self._slots[key] = slot
        return slot

    def opened(self, model: str, route: str, tenant: str) -> None:
        self._move(self._slot((model, route, tenant)), 1)

    def closed(self, model: str, route: str, tenant: str) -> None:
        self._move(self._slot((model, route, tenant)), -1)

    def _move(self, slot: int, by: int) -> None:
        count = self._counts[slot] = self._counts[slot] + by
        _COUNT.pack_into(self._map, slot * SLOT_BYTES, count)

    def close(self) -> None:
        self._map.close()


def read_lost(path: str) -> Iterator[tuple[Key, int]]:
    """The supervisor's side, once the worker is gone: each label set still in flight and
    how many requests it had. A missing or short file holds nothing."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return
    for slot in range(min(SLOTS, len(data) // SLOT_BYTES)):
        at = slot * SLOT_BYTES
        (count,) = _COUNT.unpack_from(data, at)
        if count <= 0:
            continue
        (size,) = _KEYLEN.unpack_from(data, at + _COUNT.size)
        if not 0 < size <= _KEY_ROOM:
            continue
        try:
            model, route, tenant = json.loads(data[at + _KEY_AT : at + _KEY_AT + size])
        except (ValueError, TypeError):
            continue
        yield (str(model), str(route), str(tenant)), count
