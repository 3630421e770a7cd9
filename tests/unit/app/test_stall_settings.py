"""--stall-seconds and --stall-probe-seconds: validated once at start, with one clear line."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sidecar.config import Settings

UP = "http://127.0.0.1:9"


def test_defaults_a_30_second_stall_and_no_probe():
    s = Settings(upstream=UP)
    assert (s.stall_seconds, s.stall_probe_seconds) == (30.0, None)


@pytest.mark.parametrize("probe", [10, 30])
def test_the_probe_waits_longer_than_the_stall(probe):
    with pytest.raises(ValidationError, match="must be longer than stall_seconds"):
        Settings(upstream=UP, stall_probe_seconds=probe)
    assert Settings(upstream=UP, stall_seconds=5, stall_probe_seconds=probe).stall_probe_seconds


@pytest.mark.parametrize("workers", [2, "auto"])
def test_the_probe_is_served_with_several_workers_too(workers):
    assert Settings(upstream=UP, workers=workers, stall_probe_seconds=300).stall_probe_seconds


def test_a_stall_threshold_under_a_second_is_refused():
    with pytest.raises(ValidationError, match="stall_seconds"):
        Settings(upstream=UP, stall_seconds=0.5)
