"""Prompt-length classes for TTFT: a handful of bounded label values from the input tokens.

TTFT grows with the prompt (prefill is linear or worse in its length), so one TTFT objective
over every request pages on the users who send long contexts. The TTFT histogram therefore
carries ``prompt_class``, and an SLO objective can target one class.

Cardinality stays bounded by construction: the classes are fixed at start from at most
:data:`MAX_BOUNDS` token bounds, so the label has at most ``MAX_BOUNDS + 2`` values
(``le<b>`` per bound, ``gt<last bound>``, and ``unknown``), never a value taken from a
request. Without bounds every request is ``all`` (one value: the series count without it).

``unknown``: the input token count is known only when the response reports it (``usage``,
llama.cpp ``timings``, TGI ``details``, Ollama counts). The sidecar never asks the server for
usage (it does not rewrite requests), so an OpenAI-style stream without
``stream_options.include_usage`` (or a server flag such as vLLM's
``--enable-force-include-usage``) lands in ``unknown``.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["MAX_BOUNDS", "ALL", "UNKNOWN", "PromptClasses", "parse_bounds"]

MAX_BOUNDS = 4
ALL = "all"
UNKNOWN = "unknown"


def parse_bounds(value: object) -> list[int]:
    """``"1024,8192"`` or ``[1024, 8192]`` -> ``[1024, 8192]``; raises ValueError naming the problem."""
    if value is None or value == "":
        return []
    # Anything else is checked just below (a config value: any JSON).
    items: Iterable[object] = value.split(",") if isinstance(value, str) else value  # type: ignore[assignment]
    if not isinstance(items, Iterable):
        raise ValueError(f"expected token bounds such as 1024,8192, got {value!r}")
    out = []
    for item in items:
        text = str(item).strip()
        if not text.isdigit() or int(text) < 1:
            raise ValueError(
                f"{text!r} is not a whole number of tokens >= 1 (write e.g. 1024,8192)"
            )
        out.append(int(text))
    if out != sorted(set(out)):
        raise ValueError(f"token bounds must be increasing without repeats, got {out}")
    if len(out) > MAX_BOUNDS:
        raise ValueError(
            f"at most {MAX_BOUNDS} bounds (each class multiplies the TTFT series), got {len(out)}"
        )
    return out


class PromptClasses:
    """Maps an input token count (or None) to one of a fixed set of label values."""

    __slots__ = ("bounds", "values")

    def __init__(self, bounds: Iterable[int] = ()) -> None:
        self.bounds: tuple[int, ...] = tuple(parse_bounds(list(bounds)))
        if self.bounds:
            self.values: tuple[str, ...] = (
                *(f"le{b}" for b in self.bounds), f"gt{self.bounds[-1]}", UNKNOWN
            )  # fmt: skip
        else:
            self.values = (ALL,)

    def __call__(self, input_tokens: int | None) -> str:
        if not self.bounds:
            return ALL
        if input_tokens is None:
            return UNKNOWN
        for bound in self.bounds:
            if input_tokens <= bound:
                return f"le{bound}"
        return f"gt{self.bounds[-1]}"
