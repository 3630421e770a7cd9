"""Why generation ended, as one bounded label: ``finish_reason`` of
``llm_finish_reasons_total`` (stop, length, tool_calls, content_filter, other).

Each dialect reports the reason in its own words (sidecar/streams/protocols/*: every
``ResponseInfo.finish_reasons``); the timeline keeps them raw for spans, and this table folds
them into the five values a dashboard can plot across engines. A jump in ``length`` is answers
cut at ``max_tokens``; in ``content_filter``, answers refused or filtered.

What each server sends (raw value -> label):

- OpenAI chat and completions (vLLM, SGLang, TGI, llama.cpp, Ollama): ``stop``, ``length``,
  ``tool_calls``, ``content_filter`` as named; legacy ``function_call`` -> tool_calls; TGI's
  ``eos_token`` -> stop; vLLM's ``abort`` and ``error`` -> other.
- Anthropic Messages ``stop_reason``: ``end_turn``, ``stop_sequence`` -> stop; ``max_tokens``,
  ``model_context_window_exceeded`` -> length; ``tool_use`` -> tool_calls; ``refusal`` ->
  content_filter; ``pause_turn`` -> other.
- OpenAI Responses: ``response.completed`` -> stop; ``response.incomplete``'s
  ``incomplete_details.reason``: ``max_output_tokens`` -> length, ``content_filter``.
- TGI native ``details.finish_reason``: ``eos_token``, ``stop_sequence`` -> stop; ``length``.
- Ollama native ``done_reason``: ``stop``, ``length``; ``load``, ``unload`` -> other.
- llama.cpp ``/completion`` ``stop_type``: ``eos``, ``word`` -> stop; ``limit`` -> length.
- SGLang ``/generate`` ``meta_info.finish_reason.type``: ``stop``, ``length``; ``abort`` -> other.
- Triton reports none: no observation.

A Responses answer that ends in a function call is ``completed`` like any other: the status
does not say, so it counts as ``stop``.
"""

from __future__ import annotations

__all__ = ["FINISH_REASONS", "MAX_FINISH_REASONS_PER_REQUEST", "finish_reason_label"]

FINISH_REASONS: tuple[str, ...] = ("stop", "length", "tool_calls", "content_filter", "other")
"""Every value of the ``finish_reason`` label."""

MAX_FINISH_REASONS_PER_REQUEST = 16
"""At most this many reasons of one request are counted (one per choice with ``n`` > 1): an
upstream that repeats ``finish_reason`` on every chunk cannot inflate the counter without bound."""

_LABELS: dict[str, str] = {
    # stop: the model ended its answer, or a stop sequence did
    "stop": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "eos": "stop",
    "eos_token": "stop",
    "word": "stop",
    "completed": "stop",
    # length: cut at the token limit (max_tokens) or the context window
    "length": "length",
    "max_tokens": "length",
    "max_output_tokens": "length",
    "limit": "length",
    "model_context_window_exceeded": "length",
    # tool_calls: the model called a tool and waits for its result
    "tool_calls": "tool_calls",
    "tool_use": "tool_calls",
    "function_call": "tool_calls",
    # content_filter: refused or filtered
    "content_filter": "content_filter",
    "refusal": "content_filter",
}


def finish_reason_label(raw: str) -> str:
    """The bounded label value of one reported finish reason (anything unlisted: ``other``)."""
    return _LABELS.get(raw.strip().lower(), "other") if isinstance(raw, str) else "other"
