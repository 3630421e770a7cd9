"""The simulated inference server: :mod:`.core` (timing model, request parsing, the
OpenAI/vLLM routes), :mod:`.dialects` (Responses, Anthropic, TGI, Ollama, llama.cpp, Triton,
built on the core), :mod:`.server` (one app with both; the process). Imports go one way:
server -> dialects -> core.
"""
