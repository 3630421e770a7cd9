"""Reading response bodies the way a test reads them: independent of the sidecar's parsers.

- :func:`json_events` splits an SSE body into its ``data:`` JSON objects (or takes a JSON
  body whole), so a test can count what the client saw without trusting ``sidecar.streams.sse``.
- :func:`scalars`, :func:`differing_keys` and :func:`mask` compare two bodies byte for byte
  except the values of named keys: the scanner walks JSON strings whole (so nothing inside a
  generated text is mistaken for a key) and replaces only scalar values, leaving every other
  byte (framing, spacing, field order, escapes) to be compared exactly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

# A JSON string, optionally followed by ":" and a scalar value (then it was a key).
_STRING = rb'"(?:[^"\\]|\\.)*"'
_SCALAR = rb'"(?:[^"\\]|\\.)*"|-?\d[\d.eE+-]*|null|true|false'
_TOKEN = re.compile(rb"(" + _STRING + rb")(?:(\s*:\s*)(" + _SCALAR + rb"))?", re.S)


def scalars(body: bytes) -> list[tuple[str, bytes, int, int]]:
    """Every ``"key": scalar`` in ``body``, in order: (key, value bytes, value start, end)."""
    out = []
    for m in _TOKEN.finditer(body):
        if m.group(3) is not None:
            key = json.loads(m.group(1))
            out.append((key, m.group(3), m.start(3), m.end(3)))
    return out


def differing_keys(a: bytes, b: bytes) -> set[str]:
    """Keys whose scalar values differ between two bodies of the same shape.

    Raises AssertionError when the sequences of keys differ: then the bodies differ in shape,
    which no value mask may hide."""
    sa, sb = scalars(a), scalars(b)
    keys_a, keys_b = [k for k, *_ in sa], [k for k, *_ in sb]
    if keys_a != keys_b:
        raise AssertionError(f"the bodies differ in shape:\n{a[:2000]!r}\n{b[:2000]!r}")
    return {ka for (ka, va, *_), (_, vb, *_) in zip(sa, sb) if va != vb}


def mask(body: bytes, keys: Iterable[str]) -> bytes:
    """``body`` with the scalar value of every key in ``keys`` replaced by ``<key>``."""
    keys = set(keys)
    parts, last = [], 0
    for key, _value, start, end in scalars(body):
        if key in keys:
            parts += [body[last:start], b"<" + key.encode() + b">"]
            last = end
    parts.append(body[last:])
    return b"".join(parts)


def json_events(body: bytes, streamed: bool) -> list[dict]:
    """The JSON objects of an SSE body's ``data:`` lines (``[DONE]`` skipped), or ``[body]``."""
    if not streamed:
        return [json.loads(body)]
    events = []
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = b"\n".join(line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:"))
        if data and data != b"[DONE]":
            events.append(json.loads(data))
    return events


def content_of(event: dict) -> str:
    """The generated text one event carries, whatever the route (chat, completions, native)."""
    if "choices" in event:
        text = ""
        for choice in event.get("choices") or []:
            delta = choice.get("delta")
            if isinstance(delta, dict):
                text += (delta.get("content") or "") + (delta.get("reasoning") or "")
                text += (delta.get("reasoning_content") or "")
            else:
                text += choice.get("text") or ""
        return text
    return event.get("content") or ""


def content_events(events: list[dict]) -> int:
    """How many events carried generated text: each is one token arrival for the sidecar."""
    return sum(1 for e in events if content_of(e))


def partial_token(event: dict) -> bool:
    """vLLM's chunk for a token whose bytes are not a whole character yet (a random model's
    stray UTF-8 bytes): a delta with ``"content": ""`` and nothing else to say, no ``role``,
    no ``finish_reason``."""
    for choice in event.get("choices") or []:
        delta = choice.get("delta")
        if (
            isinstance(delta, dict)
            and delta.get("content") == ""
            and "role" not in delta
            and choice.get("finish_reason") is None
            and not any(delta.get(k) for k in ("reasoning", "reasoning_content", "tool_calls", "refusal"))
        ):
            return True
    return False


def token_arrivals(events: list[dict]) -> int:
    """Tokens the client saw arrive: one per content event (and, once text came, one per
    :func:`partial_token` event), or more when per-chunk usage (vLLM's continuous usage
    stats) grew by more since the previous event: the server merged several tokens into one."""
    arrivals, so_far = 0, None
    for event in events:
        usage = event.get("usage") if event.get("choices") else None
        output = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if content_of(event) or (arrivals and partial_token(event)):
            grown = output - so_far if output is not None and so_far is not None else 1
            arrivals += max(grown, 1)
        if output is not None:
            so_far = output
    return arrivals


def reported_usage(events: list[dict]) -> dict | None:
    """The API's ``usage`` object (OpenAI routes), from the last event that has one."""
    for event in reversed(events):
        usage = event.get("usage")
        if isinstance(usage, dict):
            return {"output": usage.get("completion_tokens"), "input": usage.get("prompt_tokens")}
    return None


def engine_counts(events: list[dict]) -> dict | None:
    """llama.cpp's own counts: on its native route the final result's ``tokens_predicted``
    and ``tokens_evaluated``; on its OpenAI routes the ``timings``: output ``predicted_n``,
    input the prompt evaluated now plus the part reused from the cache (``prompt_n + cache_n``)."""
    for event in reversed(events):
        if "tokens_predicted" in event and event.get("stop"):
            return {"output": event["tokens_predicted"], "input": event.get("tokens_evaluated")}
        timings = event.get("timings")
        if isinstance(timings, dict) and "predicted_n" in timings:
            return {"output": timings["predicted_n"], "input": timings["prompt_n"] + timings.get("cache_n", 0)}
    return None
