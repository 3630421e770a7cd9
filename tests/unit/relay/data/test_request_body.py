"""What a request's head says of its body (sidecar/relay/data/request_body.head_says): the
refusals its head alone gives, in their order, whether a body follows, and whether it is
held whole for its fields. (tests/integration/relay/server/test_one_way_in.py drives the
same through the proxy port, against what aiohttp's handler answered.)"""

from __future__ import annotations

import pytest
from aiohttp.http import HttpVersion, HttpVersion10, HttpVersion11, RawRequestMessage
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from sidecar.base.routes import match_route
from sidecar.relay.data.limits import RelayLimits
from sidecar.relay.data.request_body import head_says

LIMITS = RelayLimits(max_request_body_bytes=1000, max_request_inspect_bytes=100)


def message(
    method: str = "POST",
    path: str = "/v1/chat/completions",
    version: HttpVersion = HttpVersion11,
    chunked: bool = False,
    **fields: str,
) -> RawRequestMessage:
    headers = CIMultiDict(
        {"Host": "up:8000", **{k.replace("_", "-"): v for k, v in fields.items()}}
    )
    return RawRequestMessage(
        method, path, version, CIMultiDictProxy(headers), (), False, None, False, chunked, URL(path)
    )


def says(msg: RawRequestMessage):
    return head_says(msg, match_route(msg.path, msg.method)[0], LIMITS)


@pytest.mark.parametrize(
    "msg, status",
    [
        (message("CONNECT", Content_Length="5000"), 405),  # before the length
        (message(version=HttpVersion(2, 0), Content_Length="5000"), 505),
        (message(Host="a b", Content_Length="5000"), 400),  # the host before the length
        (message(Content_Length="1001", Transfer_Encoding="gzip"), 413),
        (message(version=HttpVersion10, Transfer_Encoding="chunked"), 400),
        (message(Transfer_Encoding="gzip, chunked", Expect="nope"), 501),
        (message(Content_Length="5", Expect="nope"), 417),
    ],
)
def test_the_refusals_a_head_gives_in_their_order(msg, status):
    assert says(msg).refused[0] == status


def test_a_host_with_a_path_or_userinfo_is_refused_and_none_is_fine():
    assert says(message(Host="a/b")).refused[0] == 400
    assert says(message(Host="u@a")).refused[0] == 400
    headers = CIMultiDict({"Content-Length": "2"})
    bare = message()._replace(headers=CIMultiDictProxy(headers))
    assert says(bare).refused is None


def test_expect_100_continue_invites_the_body_in_http_11_only():
    assert says(message(Content_Length="5", Expect="100-Continue")).expect
    assert says(message(version=HttpVersion10, Content_Length="5", Expect="x")).refused is None
    assert not says(message(version=HttpVersion10, Content_Length="5", Expect="x")).expect


@pytest.mark.parametrize(
    "msg, body, hold",
    [
        (message(Content_Length="100"), True, 100),  # an API route's JSON: held for its fields
        (message(Content_Length="101"), True, 0),  # past the inspect limit: streamed
        (message(Content_Length="0"), False, 0),
        (message(chunked=True, Transfer_Encoding="chunked"), True, 0),  # no length: streamed
        (message(path="/other", Content_Length="10"), True, 0),  # not an API route
        (message("PUT", Content_Length="10"), True, 0),
        (message("GET"), False, 0),
        (message(Content_Length="+5"), False, 0),  # not digits: no length (the parser refuses it)
    ],
)
def test_whether_a_body_follows_and_whether_it_is_held(msg, body, hold):
    it = says(msg)
    assert it.refused is None and it.body is body and it.hold == hold
