"""The lock that lets a few tests run alone under ``pytest -n`` (tests/support/serial.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.serial import SERIAL, held, is_serial


def _hold(folder: Path, alone: bool, entered: threading.Event, leave: threading.Event) -> None:
    with held(folder, alone=alone):
        entered.set()
        leave.wait(10)


def _start(folder: Path, alone: bool) -> tuple[threading.Thread, threading.Event, threading.Event]:
    entered, leave = threading.Event(), threading.Event()
    thread = threading.Thread(target=_hold, args=(folder, alone, entered, leave), daemon=True)
    thread.start()
    return thread, entered, leave


def test_shared_holders_run_together_and_an_exclusive_one_waits_for_them(tmp_path):
    a, a_in, a_out = _start(tmp_path, alone=False)
    b, b_in, b_out = _start(tmp_path, alone=False)
    assert a_in.wait(5) and b_in.wait(5)  # two ordinary tests at once
    c, c_in, c_out = _start(tmp_path, alone=True)
    time.sleep(0.2)
    assert not c_in.is_set()  # the serial test waits for both
    a_out.set()
    time.sleep(0.2)
    assert not c_in.is_set()
    b_out.set()
    assert c_in.wait(5)
    c_out.set()
    for t in (a, b, c):
        t.join(5)


def test_a_waiting_exclusive_holder_is_not_starved_by_new_shared_ones(tmp_path):
    a, a_in, a_out = _start(tmp_path, alone=False)
    assert a_in.wait(5)
    c, c_in, c_out = _start(tmp_path, alone=True)
    time.sleep(0.2)
    late, late_in, late_out = _start(tmp_path, alone=False)  # the other worker's next test
    time.sleep(0.2)
    assert not late_in.is_set()  # held at the turnstile behind the serial test
    a_out.set()
    assert c_in.wait(5)
    time.sleep(0.2)
    assert not late_in.is_set()  # and not let in while it runs
    c_out.set()
    assert late_in.wait(5)
    late_out.set()
    for t in (a, c, late):
        t.join(5)


def test_every_serial_entry_names_a_test_file_that_exists():
    for prefix, why in SERIAL.items():
        assert (ROOT / prefix.split("::")[0]).is_file(), prefix
        assert why
        assert is_serial(prefix + "x")
    assert not is_serial("tests/unit/test_serial_lock.py::test_x")
