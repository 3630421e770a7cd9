"""When each tool call of a recorded stream opens and when its arguments end, worked out
from the JSON itself, independently of the dialects: the oracle for tool-call timings
(``tests/unit/measure/test_tool_call_timings.py``) and for the simulator's tool-call streams
(``tests/unit/tools/sim/test_simulate_tool_calls.py``).

The event that opens each call is an OpenAI delta with the call's id/name, an Anthropic
``tool_use`` block start, a Responses ``function_call`` item or an Ollama message's call;
the last is the last event carrying a piece of its arguments.
"""

from __future__ import annotations

import json


def _payload(event: bytes) -> dict | None:
    for line in event.decode().splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            if data.startswith("{"):
                return json.loads(data)
    if event.strip().startswith(b"{"):
        return json.loads(event)
    return None


def _openai_calls(obj: dict) -> list[tuple[int, bool]]:
    """(call index, whether this piece carries arguments) per tool-call entry."""
    out = []
    for choice in obj.get("choices") or []:
        for entry in (choice.get("delta") or {}).get("tool_calls") or []:
            out.append((entry["index"], "arguments" in entry.get("function", {})))
    return out


def expected_times(folder: str, events: list[bytes]) -> dict[int, tuple[int, int]]:
    """call -> (index of its first event, index of its last argument piece's event)."""
    calls: dict[int, list[int]] = {}
    blocks: set[int] = set()
    for i, event in enumerate(events):
        obj = _payload(event)
        if obj is None:
            continue
        pieces: list[int] = []
        if folder == "openai":
            pieces = [c for c, _ in _openai_calls(obj)]
        elif folder == "anthropic":
            if obj["type"] == "content_block_start" and obj["content_block"]["type"] == "tool_use":
                blocks.add(obj["index"])
                pieces = [obj["index"]]
            elif (
                obj["type"] == "content_block_delta"
                and obj["index"] in blocks
                and obj["delta"].get("partial_json")
            ):
                pieces = [obj["index"]]
        elif folder == "responses":
            if (
                obj["type"] == "response.output_item.added"
                and obj["item"]["type"] == "function_call"
            ):
                pieces = [obj["output_index"]]
            elif obj["type"] == "response.function_call_arguments.delta":
                pieces = [obj["output_index"]]
        elif folder == "ollama":
            pieces = list(
                range(
                    len(calls), len(calls) + len((obj.get("message") or {}).get("tool_calls") or [])
                )
            )
        for call in pieces:
            calls.setdefault(call, [i, i])[1] = i
    return {call: (first, last) for call, (first, last) in calls.items()}
