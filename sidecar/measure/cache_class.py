"""How much of a request's prompt the server read from its prefix cache, as a bounded class.

A request whose prompt was mostly cached starts in milliseconds; one that missed pays the
whole prefill. One TTFT histogram over both hides a cache regression (more misses: TTFT
grows though prefill did not slow) and a prefill regression (misses slower: averaged away
by the hits). The class splits them (``llm_time_to_first_token_by_cache_seconds``).

The counts come from the response's usage, as the dialects read it: OpenAI-style
``prompt_tokens_details.cached_tokens`` (vLLM with ``--enable-prompt-tokens-details``,
SGLang), Responses ``input_tokens_details.cached_tokens``, Anthropic
``cache_read_input_tokens`` (over every prompt token: Anthropic's ``input_tokens`` leaves the
cache out, the dialect adds it back), llama.cpp ``cache_n``.

The classes and where their bounds come from:

- ``none``     nothing cached (``cached_tokens`` 0): the full prefill, what a prefill SLO
               should be judged on;
- ``partial``  some but less than half the prompt cached (:data:`MOST_FRACTION`): a
               shared system prompt or tool list, most of the prefill still paid;
- ``most``     at least half cached: the cache did the bulk of the work (a multi-turn
               agent's history); the uncached tail is at most as long as the cached part,
               so prefill is at most half what a miss pays (prefill time grows with the
               uncached tokens; vLLM caches whole 16-token blocks, so even an identical
               prompt reads as ``most``, not all);
- ``unknown``  the response did not say (no usage, or usage without a cached count:
               vLLM without ``--enable-prompt-tokens-details``, Ollama, TGI). Never filed
               as a miss: a server that does not report is not a server that missed.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["CacheClass", "cache_class", "MOST_FRACTION", "CACHE_CLASSES"]

MOST_FRACTION = 0.5
"""From this share of the prompt cached on, a request is ``most`` (see the module doc)."""


class CacheClass(str, Enum):
    NONE = "none"
    PARTIAL = "partial"
    MOST = "most"
    UNKNOWN = "unknown"


CACHE_CLASSES: tuple[str, ...] = tuple(c.value for c in CacheClass)
"""Every value of the ``cache`` label: the bound on its series."""


def cache_class(input_tokens: int | None, cached_input_tokens: int | None) -> CacheClass:
    """The class of a prompt of ``input_tokens`` (every prompt token, cached ones included)
    of which ``cached_input_tokens`` came from the cache; ``unknown`` unless both are known
    and the prompt is not empty."""
    if cached_input_tokens is None or input_tokens is None or input_tokens <= 0:
        return CacheClass.UNKNOWN
    if cached_input_tokens <= 0:
        return CacheClass.NONE
    if cached_input_tokens >= MOST_FRACTION * input_tokens:
        return CacheClass.MOST
    return CacheClass.PARTIAL
