"""Reading response bodies the way a test reads them: independent of the sidecar's parsers.

- :func:`json_events` splits an SSE body into its ``data:`` JSON objects (or takes a JSON
  body whole), so a test can count what the client saw without trusting ``sidecar.streams.sse``.
"""

from __future__ import annotations

import json


def json_events(body: bytes, streamed: bool) -> list[dict]:
    """The JSON objects of an SSE body's ``data:`` lines (``[DONE]`` skipped), or ``[body]``."""
    if not streamed:
        return [json.loads(body)]
    events = []
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = b"\n".join(
            line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")
        )
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
                text += delta.get("reasoning_content") or ""
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
            and not any(
                delta.get(k) for k in ("reasoning", "reasoning_content", "tool_calls", "refusal")
            )
        ):
            return True
    return False


def finishing_without_text(event: dict) -> bool:
    """A choice that finishes on an empty ``content`` (or ``text``) and nothing else: vLLM's
    last token when it has no text of its own, or a bare terminator (llama.cpp,
    ``transformers serve``); the final usage tells which."""
    for choice in event.get("choices") or []:
        delta = choice.get("delta")
        empty = (
            delta.get("content") == ""
            and "role" not in delta
            and not any(
                delta.get(k) for k in ("reasoning", "reasoning_content", "tool_calls", "refusal")
            )
            if isinstance(delta, dict)
            else choice.get("text") == ""
        )
        if empty and choice.get("finish_reason"):
            return True
    return False


def token_arrivals(events: list[dict]) -> int:
    """Tokens the client saw arrive: one per content event (and, once text came, one per
    :func:`partial_token` event), or more when per-chunk usage (vLLM's continuous usage
    stats) grew by more since the previous event: the server merged several tokens into one.
    A last event :func:`finishing_without_text` is one more when the final usage counts
    exactly one more than that."""
    arrivals, so_far, maybe_last = 0, None, False
    for event in events:
        usage = event.get("usage") if event.get("choices") else None
        output = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if content_of(event) or (arrivals and partial_token(event)):
            grown = output - so_far if output is not None and so_far is not None else 1
            arrivals += max(grown, 1)
        elif arrivals and finishing_without_text(event):
            maybe_last = True
        if output is not None:
            so_far = output
    final = reported_usage(events)
    if maybe_last and final is not None and final["output"] == arrivals + 1:
        arrivals += 1
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
            return {
                "output": timings["predicted_n"],
                "input": timings["prompt_n"] + timings.get("cache_n", 0),
            }
    return None
