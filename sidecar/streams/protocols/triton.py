"""Triton Inference Server generate extension (TensorRT-LLM, vLLM and Python backends):
``POST /v2/models/{model}[/versions/{v}]/generate_stream`` and ``/generate``.

``generate_stream`` is SSE with ``Content-Type: text/event-stream; charset=utf-8``; every
response of a decoupled model is one ``data:`` event holding the generate response object,
(keys in alphabetical order in every published example). The extension fixes only ``model_name``,
``model_version`` and ``text_output``; everything else is the model's other output
tensors, e.g. from the TensorRT-LLM ``ensemble``::

    data: {"context_logits":0.0,"cum_log_probs":0.0,"generation_logits":0.0,"model_name":"ensemble","model_version":"1","output_log_probs":[0.0,0.0],"sequence_end":false,"sequence_id":0,"sequence_start":false,"text_output":" count"}

What counts as a token: an event with a non-empty ``text_output``, one each. This is exact
for TensorRT-LLM with ``stream: true`` (one event per decoding step). It is an
approximation elsewhere, and the events are what is counted, never the text: with
``accumulate_tokens`` on, TensorRT-LLM's postprocessing sends the whole text so far in
every event (still one event per step, so the count holds); a backend that batches several
tokens per response undercounts. The protocol carries no usage, finish reason or end
marker (the stream just ends), so output tokens are always stream-counted.

The model comes from the path (the route knows it): pass it as ``model`` and it is reported
when the first event does not name its own ``model_name``. Errors are ``{"error": "..."}``, as an event inside a 200
stream or as the body of a failed request.
"""

from __future__ import annotations

from typing import Any

from ._base import ANSWER, SSEJSONDialect, error_of, load_object, str_or_none
from .events import DialectEvent, ResponseInfo

__all__ = ["TritonStreamDialect", "parse_triton_response"]


class TritonStreamDialect(SSEJSONDialect):
    """``generate_stream`` SSE bytes in, :mod:`events` out. Sans-I/O; safe at any split.

    ``model`` is the ``{model}`` path segment, reported as the response model unless the
    first event names its own ``model_name`` (with an ensemble they can differ).
    """

    __slots__ = ("_model", "_info_sent")
    HAS_END_MARKER = False  # the stream just ends: a cut-short one cannot be told apart

    def __init__(self, model: str | None = None, max_line_bytes: int | None = None) -> None:
        super().__init__(max_line_bytes)
        self._model = model
        self._info_sent = False

    def _object(self, obj: dict[str, Any], event: str, out: list[DialectEvent]) -> None:
        err = error_of(obj)
        if err is not None:
            out.append(err)
            return
        if not self._info_sent:
            self._info_sent = True
            model = str_or_none(obj.get("model_name")) or self._model
            if model is not None:
                out.append(ResponseInfo(response_model=model))
        text = obj.get("text_output")
        if isinstance(text, str) and text:
            out.append(ANSWER)


def parse_triton_response(body: bytes, model: str | None = None) -> list[DialectEvent]:
    """A whole ``/generate`` body -> events (the model, or the error). No usage exists."""
    obj = load_object(body, error_of)
    if isinstance(obj, list):
        return obj
    name = str_or_none(obj.get("model_name")) or model
    return [ResponseInfo(response_model=name)] if name is not None else []
