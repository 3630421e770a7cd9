"""sidecar/relay/server/drain.py: the three steps of a shutdown that loses no request, driven directly."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import pytest
from structlog.testing import capture_logs

from sidecar.relay.server.drain import PROGRESS_SECONDS, RETRY_AFTER_SECONDS, Drain, in_kubernetes
from tests.support.waits import wait_for


class Upstream:
    def __init__(self, up: bool = True) -> None:
        self.up = up
        self.asked = 0

    async def __call__(self) -> bool:
        self.asked += 1
        if self.up is None:
            raise aiohttp.ClientConnectionError("refused")
        return self.up


async def test_keeps_serving_while_the_upstream_answers_then_refuses():
    upstream, in_flight = Upstream(True), [0]
    drain = Drain(upstream, lambda: in_flight[0], pod=True)
    task = asyncio.create_task(drain.run(60))
    await wait_for(lambda: upstream.asked >= 2)  # asked again after a poll
    assert drain.draining and not drain.refusing and not task.done()
    upstream.up = None  # the server closed its listener
    await wait_for(task.done)  # "nothing in flight: the proxy may close", long before the 60 s
    assert drain.refusing
    task.result()


async def test_waits_for_in_flight_requests_once_the_upstream_is_gone():
    in_flight = [2]
    drain = Drain(Upstream(False), lambda: in_flight[0])
    task = asyncio.create_task(drain.run(60))
    await wait_for(lambda: drain.refusing)
    await asyncio.sleep(0.2)  # a few turns of its in-flight poll: it must still be waiting
    assert not task.done()
    in_flight[0] = 0
    await asyncio.wait_for(task, 30)


class Clock:
    """A clock the test moves; the drain reads its deadline from it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_drain_seconds_bounds_every_step():
    clock, upstream = Clock(), Upstream(True)  # upstream never leaves, a stream never ends
    drain = Drain(upstream, lambda: 1, clock=clock)
    task = asyncio.create_task(drain.run(0.6))
    await wait_for(lambda: upstream.asked >= 3)  # polling, however long that took in real time
    assert not task.done() and not drain.refusing
    clock.now += 0.59
    asked = upstream.asked
    await wait_for(lambda: upstream.asked > asked)
    assert not task.done(), "before drain_seconds"
    clock.now += 0.02  # past the deadline: both steps end
    await asyncio.wait_for(task, 30)
    assert drain.refusing


@pytest.mark.parametrize("pod", [False, True])
async def test_outside_a_pod_the_drain_ends_with_the_last_request(pod):
    """Outside Kubernetes nobody routes by endpoints: once nothing is in flight there is
    nothing to wait for, though the upstream still answers (a Ctrl-C'd serve
    must not wait the whole drain_seconds after its stream). In a pod, step 1 waits
    on for the upstream to go, as requests still arrive until the endpoints drop the pod."""
    upstream, in_flight = Upstream(True), [1]
    drain = Drain(upstream, lambda: in_flight[0], pod=pod)
    with capture_logs() as logs:
        task = asyncio.create_task(drain.run(60))
        await wait_for(lambda: upstream.asked >= 2)
        assert not task.done(), "a request is in flight"
        in_flight[0] = 0
        if pod:
            asked = upstream.asked
            await wait_for(lambda: upstream.asked >= asked + 3)
            assert not task.done() and not drain.refusing, "in a pod: until the upstream goes"
            upstream.up = False
        await asyncio.wait_for(task, 30)
    events = [e["event"] for e in logs]
    assert events[0] == "draining" and events[-1] == "drained", events
    first = logs[0]
    assert first["in_flight"] == 1 and first["drain_seconds"] == 60
    assert "1 request in flight" in first["waits_for"]
    assert ("inference server to stop" in first["waits_for"]) is pod
    assert "again to exit now" in first["exit_now"]


async def test_a_long_drain_says_what_it_still_waits_for():
    clock, in_flight = Clock(), [3]
    drain = Drain(Upstream(False), lambda: in_flight[0], clock=clock, pod=True)
    with capture_logs() as logs:
        task = asyncio.create_task(drain.run(30))
        await wait_for(lambda: drain.refusing)
        clock.now += PROGRESS_SECONDS
        await wait_for(lambda: any(e["event"] == "still_draining" for e in logs))
        in_flight[0] = 0
        await asyncio.wait_for(task, 30)
    still = next(e for e in logs if e["event"] == "still_draining")
    assert still["in_flight"] == 3 and still["waits_for"] == "3 requests in flight to end"
    assert still["seconds_left"] == 25.0 and "exit now" in still["exit_now"]


def test_in_kubernetes_reads_the_kubelets_variable():
    assert in_kubernetes({"KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    assert not in_kubernetes({}) and not in_kubernetes({"KUBERNETES_SERVICE_HOST": ""})


async def test_a_hanging_health_check_counts_as_gone_at_the_deadline():
    async def hangs() -> bool:
        await asyncio.sleep(60)
        return True

    drain = Drain(hangs, lambda: 0, pod=True)
    started = time.monotonic()
    await drain.run(0.5)
    # Cut at the deadline (0.5 s, late on a loaded machine), not when the check returns (60 s).
    assert drain.refusing and time.monotonic() - started < 30


async def test_the_refusal_is_503_json_with_retry_after():
    """What the relay answers a new request in step 2 (that it asks only then, and relays
    otherwise, is the one-way-in and drain integration tests')."""
    drain = Drain(Upstream(), lambda: 0)
    answer = drain.refusal("POST", "10.0.0.1")
    head, _, body = answer.partition(b"\r\n\r\n")
    fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert fields[b"Retry-After"] == str(RETRY_AFTER_SECONDS).encode()
    assert fields[b"Content-Type"] == b"application/json"
    assert int(fields[b"Content-Length"]) == len(body)
    assert orjson.loads(body)["error"]["type"] == "draining"
    assert fields[b"Connection"] == b"close", "the client reconnects, to another pod"
