"""The bounds of the on-call labels ``error_type`` and ``finish_reason`` (sidecar/base)."""

from __future__ import annotations

import ast

import pytest
from prometheus_client import CollectorRegistry

from sidecar.base.finish_reason import (
    FINISH_REASONS,
    MAX_FINISH_REASONS_PER_REQUEST,
    finish_reason_label,
)
from sidecar.base.outcomes import (
    CANCEL_TYPES,
    ERROR_TYPE_LABELS,
    ERROR_TYPES,
    Outcome,
    Verdict,
    error_type_label,
    verdict_of,
)
from sidecar.export.metrics import SidecarMetrics
from sidecar.measure.summary import summarize
from sidecar.measure.timeline import MAX_FINISH_REASONS, RequestTimeline
from sidecar.streams.protocols.events import ResponseInfo
from tests.support.paths import ROOT

PACKAGE = ROOT / "sidecar"


@pytest.mark.parametrize(
    ("raw", "label"),
    [
        # OpenAI chat / completions (vLLM, SGLang, TGI, llama.cpp, Ollama)
        ("stop", "stop"), ("length", "length"), ("tool_calls", "tool_calls"), ("function_call", "tool_calls"),
        ("content_filter", "content_filter"), ("abort", "other"), ("error", "other"), ("eos_token", "stop"),
        # Anthropic stop_reason
        ("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length"), ("tool_use", "tool_calls"),
        ("refusal", "content_filter"), ("pause_turn", "other"), ("model_context_window_exceeded", "length"),
        # Responses: status and incomplete_details.reason (sidecar/streams/protocols/responses.py)
        ("completed", "stop"), ("max_output_tokens", "length"), ("incomplete", "other"),
        # Ollama done_reason, llama.cpp stop_type, SGLang's finish_reason.type
        ("load", "other"), ("unload", "other"), ("eos", "stop"), ("word", "stop"), ("limit", "length"),
        # Anything else, whatever a server invents
        ("", "other"), ("x" * 1000, "other"), ("STOP", "stop"),
    ],
)  # fmt: skip
def test_each_dialects_finish_reason_has_one_label(raw, label):
    assert finish_reason_label(raw) == label
    assert label in FINISH_REASONS


def test_the_verdicts_are_the_error_type_vocabulary_each_once():
    pairs = [(v.outcome, v.error_type) for v in Verdict]
    assert len(set(pairs)) == len(pairs)
    assert {v.error_type for v in Verdict} == ERROR_TYPE_LABELS
    assert {v.error_type for v in Verdict if v.outcome is Outcome.CANCELLED} == {
        *CANCEL_TYPES,
        "other",
    }
    for v in Verdict:
        assert verdict_of(v.outcome, v.error_type) is v or v is Verdict.OK


def test_each_error_cause_alert_names_exactly_the_verdicts_that_say_so():
    from sidecar.tools.slo.rules import ERROR_CAUSES

    for cause in ERROR_CAUSES:
        assert set(cause.error_types) == {v.error_type for v in Verdict if v.alert == cause.alert}
    assert {v.alert for v in Verdict if v.alert} == {c.alert for c in ERROR_CAUSES}


def test_the_upstream_pools_answers_are_the_verdicts_statuses():
    import ssl

    from sidecar.relay.data import upstream
    from sidecar.relay.data.http1 import ProtocolError

    statuses = {
        error.verdict.error_type: error.verdict.answer_status
        for error in (
            upstream._unreachable(ConnectionRefusedError(), "h", 1),
            upstream._unreachable(ssl.SSLError(), "h", 1),
            upstream._timeout(),
            upstream._disconnected(),
            upstream._invalid(ProtocolError("x")),
        )
    }
    assert statuses == {
        "upstream_unreachable": 502,
        "upstream_timeout": 504,
        "upstream_disconnected": 502,
        "upstream_invalid_response": 502,
    }


@pytest.mark.parametrize(
    ("verdict", "status", "error_type", "code"),
    [
        (Verdict.OK, 200, None, "200"),
        (Verdict.OK, 404, "404", "404"),  # a 4xx answered: as HTTP client spans say it
        (Verdict.UPSTREAM_STATUS, 503, "503", "503"),
        (Verdict.UPSTREAM_UNREACHABLE, 502, "upstream_unreachable", "502"),
        (Verdict.STREAM_ERROR, 200, "stream_error", "200"),
        (Verdict.CLIENT_DISCONNECTED, None, None, "499"),  # a cancel is not an error
        (Verdict.CLIENT_SEND_TIMEOUT, 200, None, "200"),
        (Verdict.INTERNAL, None, "internal", "500"),
        (Verdict.OTHER_ERROR, None, "_OTHER", "500"),  # OTel's own word for an unknown cause
    ],
)
def test_a_verdict_gives_the_otel_error_type_and_the_code_label(verdict, status, error_type, code):
    assert verdict.otel_error_type(status) == error_type
    assert verdict.code(status) == code


def test_error_type_label_is_bounded_by_outcome():
    assert error_type_label(Outcome.OK, None) == "none"
    assert error_type_label(Outcome.OK, "stream_error") == "none"  # ok is ok, whatever was passed
    for kind in ERROR_TYPES:
        assert error_type_label(Outcome.ERROR, kind) == kind
        assert error_type_label(Outcome.CANCELLED, kind) == "other"
    for kind in CANCEL_TYPES:
        assert error_type_label(Outcome.CANCELLED, kind) == kind
        assert error_type_label(Outcome.ERROR, kind) == "other"
    assert error_type_label(Outcome.ERROR, "made-up-" * 20) == "other"
    assert len(ERROR_TYPE_LABELS) == 13


def test_every_relay_ending_is_a_verdict_never_a_string():
    """The relay, the upstream side and the body sink end with a :class:`Verdict` member, so
    a misspelt cause cannot become another label value ("other"): no relay module ends
    anything with a string literal, a relay refuses one, and the upstream's failures before
    the head carry members whose answer is the sidecar's own."""
    from sidecar.relay.data import body_relay, upstream

    relay_modules = ("upstream.py", "body_relay.py", "exchange.py", "token_lane_py.py")
    ends = {"_end", "end", "stop", "_finish", "_fail"}
    for name in relay_modules:
        tree = ast.parse((PACKAGE / "relay" / "data" / name).read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ends
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                raise AssertionError(f"{name}:{node.lineno} ends with a string")
    relay = body_relay.BodyRelay.__new__(body_relay.BodyRelay)
    relay.ended = None
    with pytest.raises(TypeError):
        relay._end("upstream_disconnected")  # type: ignore[arg-type]
    before_head = [
        upstream._unreachable(ConnectionRefusedError(), "h", 1).verdict,
        upstream._timeout().verdict,
        upstream._disconnected().verdict,
    ]
    assert all(isinstance(v, Verdict) and v.answer_status for v in before_head)
    assert set(CANCEL_TYPES) == {"client_disconnected", "client_send_timeout"}
    assert set(ERROR_TYPES) | set(CANCEL_TYPES) | {"none", "other"} == ERROR_TYPE_LABELS


def test_a_hostile_count_of_finish_reasons_is_capped_per_request():
    m = SidecarMetrics(CollectorRegistry())
    t = RequestTimeline(1.0, "POST", "/v1/chat/completions", "m")
    t.response_started(1.1, 200, streamed=True)
    t.events([ResponseInfo(finish_reasons=("length",) * 10_000)], 1.2)
    t.finish(Outcome.OK, 1.3)
    m.record(summarize(t, "m"))
    got = m.registry.get_sample_value(
        "llm_finish_reasons_total",
        {"model": "m", "route": "/v1/chat/completions", "finish_reason": "length"},
    )
    assert got == MAX_FINISH_REASONS_PER_REQUEST


def test_the_record_keeps_a_bounded_count_of_finish_reasons():
    """A hostile upstream repeating finish reasons in every event cannot grow the record."""
    t = RequestTimeline(1.0, "POST", "/v1/chat/completions", "m")
    t.response_started(1.1, 200, streamed=True)
    for i in range(1_000):
        t.events([ResponseInfo(finish_reasons=("stop", "length"))], 1.1 + i * 1e-4)
    assert len(t.finish_reasons) == MAX_FINISH_REASONS
    assert t.finish_reasons[:2] == ["stop", "length"], "the first ones are kept, in order"
