"""The simulator's other dialects: every API the sidecar measures besides OpenAI chat and
completions, on the same app as :mod:`sidecar.tools.sim.core` and with its timing model.

Each dialect is one small encoder class: request parsing, the stream's bytes (``start``
right after the headers, one ``token`` per generation step, ``end`` with the last token,
``error`` for ``x-sim-fail: stream``), the non-streaming body and the error body. One
driver (:func:`_serve_stream`) schedules every stream exactly as the vLLM routes are
scheduled: first token at ``start + ttft``, then one step per (jittered) TPOT, against
absolute deadlines. ``x-sim-*`` headers, ``fail_rate``/``drop_rate``, seeds and
``SIM_STATS`` behave as documented in :mod:`sidecar.tools.sim.core`.

Wire formats (byte shapes copied from ``tests/fixtures/streams``; its SOURCES.md cites
each server's documentation and source):

=================================  ==========================================================
``POST /v1/responses``             OpenAI Responses: ``event:``/``data:`` typed events,
                                   ``response.created``, ``response.in_progress`` (with the
                                   headers), ``output_item.added``, ``content_part.added``,
                                   ``response.output_text.delta`` (``reasoning_text.delta``
                                   for reasoning), the ``*.done`` events, then
                                   ``response.completed`` (``response.incomplete`` at
                                   ``max_output_tokens``) with usage; no ``[DONE]``.
                                   Compact JSON, ``type`` first, ``sequence_number`` last,
                                   no ``obfuscation`` (as with ``include_obfuscation:
                                   false``). Whole: the Response object, pretty-printed.
                                   In-stream error: ``response.failed``.
``POST /v1/messages``              Anthropic Messages: ``message_start``,
                                   ``content_block_start`` and a ``ping`` with the
                                   headers, ``content_block_delta`` (``thinking_delta``
                                   then ``signature_delta`` for reasoning, ``text_delta``),
                                   ``content_block_stop``, ``message_delta`` (stop reason,
                                   output usage), ``message_stop``; ``event:`` lines as the
                                   API sends them, compact JSON except the ``ping``.
                                   Whole: the Message. In-stream error: ``event: error``
                                   ``overloaded_error``, then the stream ends.
``POST /generate_stream``,         TGI: ``data:`` (no space) per token, the last event with
``POST /generate``, ``POST /``     ``generated_text`` and, when ``parameters.details``,
                                   ``details`` with ``input_length``. A generation that
                                   ends by itself ends with the ``special`` ``</s>`` token
                                   (finish ``eos_token``), counted in ``generated_tokens``.
                                   ``/`` is TGI's compat route (``stream`` picks; whole
                                   bodies in a one-element list). In-stream error:
                                   ``data:{"error":..,"error_type":"generation"}``.
``POST /api/chat``,                Ollama: NDJSON (``application/x-ndjson``), Go
``POST /api/generate``             ``json.Marshal`` bytes (``<>&`` escaped, field order of
                                   ``api/types.go``), one line per token (``thinking``
                                   for reasoning), a final ``done:true`` line with
                                   ``done_reason``, ``prompt_eval_count``, ``eval_count``
                                   and nanosecond durations (``omitempty``: zero is
                                   absent). Streams unless ``"stream": false``.
                                   In-stream error: ``{"error":"..."}``.
``POST /completion``               llama.cpp: ``data: `` per token (``content``,
                                   ``stop:false``), a final ``stop:true`` event with
                                   ``stop_type``, ``timings`` in milliseconds.
                                   In-stream error: ``data: {"error":{...}}``.
``POST /v2/models/{m}[/versions/   Triton / TensorRT-LLM ensemble: one ``data:`` event per
{v}]/generate_stream``,            token with ``text_output`` (alphabetical keys); no end
``.../generate``                   marker, no usage. In-stream error: ``data:
                                   {"error":"..."}``.
=================================  ==========================================================

Tool calls (``x-sim-tool-calls: N``, streamed requests on Responses, Anthropic and Ollama
``/api/chat``; the vLLM chat route in :mod:`.core`): the answer's steps become N calls, one
after the other (:func:`~.core.tool_steps`), laid out as the recordings in
``tests/fixtures/streams`` (checked by tests/unit/tools/sim/test_simulate_tool_calls.py): Responses
``output_item.added`` of a ``function_call`` item, ``function_call_arguments.delta`` per piece,
``.done`` and ``output_item.done``, then ``response.completed`` with the calls as its output;
Anthropic a ``tool_use`` block per call (its start with an empty ``input_json_delta``, one
delta per piece, its stop; stop reason ``tool_use``); Ollama every call whole in one line at
the last step (its tool parser holds calls back until they parse). ``x-sim-cached-tokens``
fills Responses' ``input_tokens_details.cached_tokens`` and Anthropic's
``cache_read_input_tokens`` (taken out of its ``input_tokens``, as the API counts them).

Token counts: ``x-sim-tokens`` (or the drawn length) is the output the server reports,
reasoning included where the dialect has reasoning (Responses, Anthropic, Ollama); TGI's
closing ``</s>`` is one of them. Reasoning (``reasoning_tokens``, ``x-sim-reasoning``) is
served whatever the request asks, as a server with a reasoning parser would.

The engine's own timings (Ollama, llama.cpp) are the plan, so they are deterministic and
consistent with what the sidecar measures: of the planned TTFT, ``ENGINE_LOAD_SHARE`` is
reported as model load (Ollama only) and ``ENGINE_PREFILL_SHARE`` as prompt evaluation,
the rest being what a real server spends queueing and in HTTP; decode is the planned time
from the first token to the last.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from aiohttp import web

from .core import (
    ENGINE_FAILURE,
    SIM_STATE,
    TOOL_NAMES,
    BadRequest,
    Plan,
    SimState,
    ToolStep,
    abort,
    cached_tokens,
    chat_prompt_tokens,
    check_tool_calls,
    parse_overrides,
    sleep_until,
    text_tokens,
    tool_call_id,
    tool_steps,
    wait_whole,
)

__all__ = ["ENGINE_LOAD_SHARE", "ENGINE_PREFILL_SHARE", "add_dialect_routes"]

ENGINE_LOAD_SHARE = 0.05
"""Share of the planned TTFT that Ollama reports as ``load_duration``."""
ENGINE_PREFILL_SHARE = 0.85
"""Share of the planned TTFT reported as prompt evaluation (Ollama, llama.cpp)."""

_SSE_UTF8 = "text/event-stream; charset=utf-8"
_SSE = "text/event-stream"
_JSON = "application/json"
_JSON_UTF8 = "application/json; charset=utf-8"


@dataclass(slots=True)
class _Req:
    """What a dialect took from one request body."""

    stream: bool
    prompt_tokens: int
    max_tokens: int | None = None
    model: str = ""  # the model name to echo (Ollama echoes the request's, Triton the path's)
    prompt: str = ""
    details: bool = False  # TGI parameters.details
    full_text: bool = False  # TGI parameters.return_full_text
    seed: int | None = None
    version: str = "1"  # Triton model version
    instructions: str | None = None
    created: int = 0


# ---------------------------------------------------------------- request helpers


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise BadRequest(400, f"Invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "The request body must be a JSON object")
    return body


def _limit(body: dict[str, Any], name: str, negative_is_unlimited: bool = False) -> int | None:
    """An optional token limit (Ollama's and llama.cpp's ``-1`` means unlimited)."""
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int:
        raise BadRequest(400, f"{name} must be an integer, got {value!r}")
    if value < 0 and negative_is_unlimited:
        return None
    if value < 1:
        raise BadRequest(400, f"{name} must be >= 1, got {value!r}")
    return value


def _flag(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(400, f"{name} must be a boolean, got {value!r}")
    return value


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequest(400, f"{name} must be a non-empty string")
    return value


def _messages(value: Any, name: str = "messages") -> list[Any]:
    if not isinstance(value, list) or not value:
        raise BadRequest(400, f"{name}: a non-empty list is required")
    return value


def _sse(event: str, obj: Any) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (event.encode(), orjson.dumps(obj))


def _answered_with_500(plan: Plan, stream: bool) -> bool:
    """The request is answered with the simulated 500 (``stream`` on a whole body too)."""
    return plan.fail == "500" or (plan.fail == "stream" and not stream)


# ---------------------------------------------------------------- the dialect contract


class _Dialect:
    """One response of one dialect. Subclasses fill in the wire format."""

    content_type: ClassVar[str] = _SSE_UTF8  # of the stream
    json_type: ClassVar[str] = _JSON  # of whole and error bodies
    reasoning_ok: ClassVar[bool] = False
    tool_calls_ok: ClassVar[bool] = False  # the API streams tool calls (x-sim-tool-calls)

    def __init__(self, sim: SimState, plan: Plan, req: _Req) -> None:
        self.sim, self.plan, self.req = sim, plan, req
        self.reasoning = plan.reasoning
        self.steps = plan.reasoning + plan.counts[0]
        self.length = req.max_tokens is not None and plan.counts[0] >= req.max_tokens
        self.model = req.model or sim.config.model
        self.tools: list[ToolStep] | None = tool_steps(sim, plan) if plan.tool_calls else None
        self.cached = cached_tokens(plan, req.prompt_tokens)

    def tool_step(self, k: int) -> ToolStep | None:
        """The tool-call piece of step ``k``, None for a text or reasoning step."""
        if self.tools is None or k < self.reasoning:
            return None
        return self.tools[k - self.reasoning]

    def tool_name(self, call: int) -> str:
        return TOOL_NAMES[call % len(TOOL_NAMES)]

    def tool_arguments(self, call: int) -> str:
        assert self.tools is not None
        return "".join(s.arguments for s in self.tools if s.call == call)

    @staticmethod
    def parse(body: dict[str, Any], request: web.Request, sim: SimState) -> _Req:
        raise NotImplementedError

    @classmethod
    def error_response(cls, status: int, message: str) -> web.Response:
        raise NotImplementedError

    def text(self, k: int) -> str:
        return self.sim.text(self.plan, 0, k)

    def joined(self, lo: int, hi: int) -> str:
        return "".join(self.text(k) for k in range(lo, hi))

    def answer(self) -> str:
        return self.joined(self.reasoning, self.steps)

    def thinking(self) -> str:
        return self.joined(0, self.reasoning)

    def decode_seconds(self) -> float:
        """Planned time from the first token to the last."""
        return sum(self.sim.gap(self.plan, k) for k in range(1, self.steps))

    # stream
    def start(self) -> bytes:
        return b""

    def token(self, k: int) -> bytes:
        raise NotImplementedError

    def end(self) -> bytes:
        return b""

    def error(self) -> bytes:
        raise NotImplementedError

    # whole body
    def whole(self) -> bytes:
        raise NotImplementedError


async def _serve_stream(
    request: web.Request, d: _Dialect, start: float, headers: dict[str, str] | None = None
) -> web.StreamResponse:
    """Write one dialect's stream on the plan's schedule, as the core's OpenAI routes are."""
    loop = asyncio.get_running_loop()
    sim, plan = d.sim, d.plan
    stats = sim.stats
    steps = d.steps
    fail_at = steps // 2 if plan.fail in ("drop", "stream") else -1
    emitted = 0
    resp = web.StreamResponse(
        status=200, headers={"Content-Type": d.content_type, **(headers or {})}
    )
    try:
        await resp.prepare(request)
        head = d.start()
        if head:
            await resp.write(head)
        deadline = start + plan.ttft
        for k in range(steps):
            if k:
                deadline += sim.gap(plan, k)
            await sleep_until(loop, deadline, request)
            if k == fail_at:
                if plan.fail == "drop":
                    abort(request)
                    stats.dropped += 1
                else:
                    await resp.write(d.error())
                    await resp.write_eof()
                    stats.stream_errors += 1
                stats.completion_tokens += emitted
                return resp
            chunk = d.token(k)
            emitted += 1
            if k == steps - 1:
                chunk += d.end()
            if chunk:  # a step may write nothing (Ollama holds a tool call back until whole)
                await resp.write(chunk)
        await resp.write_eof()
    except asyncio.CancelledError:
        stats.cancelled += 1
        stats.completion_tokens += emitted
        raise
    except ConnectionError:
        stats.cancelled += 1
        stats.completion_tokens += emitted
        return resp
    stats.completed += 1
    stats.completion_tokens += emitted
    return resp


def _handler(
    cls: type[_Dialect], force_stream: bool | None = None, compat_list: bool = False
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An aiohttp handler for one dialect. ``force_stream``: the route decides, not the
    body (TGI's two routes, Triton's). ``compat_list``: TGI's ``/`` wraps whole bodies in a list."""

    async def handle(request: web.Request) -> web.StreamResponse:
        start = asyncio.get_running_loop().time()
        sim = request.app[SIM_STATE]
        try:
            req = cls.parse(await _json_object(request), request, sim)
            if force_stream is not None:
                req.stream = force_stream
            overrides = parse_overrides(request.headers)
            if overrides is not None and overrides.tool_calls:
                check_tool_calls(req.stream, cls.tool_calls_ok)
        except BadRequest as exc:
            return cls.error_response(exc.status, exc.message)
        req.created = int(time.time())
        plan = sim.plan(1, req.max_tokens, req.stream, overrides, reasoning_ok=cls.reasoning_ok)
        stats = sim.stats
        stats.started += 1
        stats.prompt_tokens += req.prompt_tokens
        if _answered_with_500(plan, req.stream):
            stats.failed += 1
            return cls.error_response(500, ENGINE_FAILURE)
        d = cls(sim, plan, req)
        if req.stream:
            return await _serve_stream(request, d, start)
        if not await wait_whole(request, sim, plan, start):
            return web.Response(status=499, reason="Client Closed Request")
        stats.completed += 1
        stats.completion_tokens += d.steps
        body = d.whole()
        if compat_list:
            body = b"[" + body + b"]"
        return web.Response(body=body, headers={"Content-Type": cls.json_type})

    return handle


# ---------------------------------------------------------------- OpenAI Responses


_ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


class _Responses(_Dialect):
    reasoning_ok = True
    tool_calls_ok = True

    def __init__(self, sim: SimState, plan: Plan, req: _Req) -> None:
        super().__init__(sim, plan, req)
        rid = plan.rid
        self.resp_id = f"resp_{rid}{rid[:16]}"
        self.msg_id = f"msg_{rid[16:]}{rid}"
        self.rs_id = f"rs_{rid[8:]}{rid[:24]}"
        self.seq = 0
        self.msg_index = 1 if self.reasoning else 0

    @staticmethod
    def parse(body: dict[str, Any], request: web.Request, sim: SimState) -> _Req:
        _check_openai_model(body, sim)
        raw = body.get("input")
        if isinstance(raw, str) and raw:
            messages: list[Any] = [{"role": "user", "content": raw}]
        else:
            messages = list(_messages(raw, "input"))
        instructions = body.get("instructions")
        if isinstance(instructions, str):
            messages.append({"role": "system", "content": instructions})
        return _Req(
            stream=_flag(body, "stream"),
            prompt_tokens=chat_prompt_tokens(messages),
            max_tokens=_limit(body, "max_output_tokens"),
            instructions=instructions if isinstance(instructions, str) else None,
        )

    @classmethod
    def error_response(cls, status: int, message: str) -> web.Response:
        kind = {404: "NotFoundError", 500: "InternalServerError"}.get(status, "BadRequestError")
        body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
        return web.Response(status=status, body=orjson.dumps(body), content_type=_JSON)

    # -- objects

    def _event(self, kind: str, **fields: Any) -> bytes:
        obj = {"type": kind, **fields, "sequence_number": self.seq}
        self.seq += 1
        return _sse(kind, obj)

    def _response(
        self, status: str, output: list[Any], usage: Any = None, error: Any = None
    ) -> dict[str, Any]:
        req = self.req
        done = status in ("completed", "incomplete")
        return {
            "id": self.resp_id,
            "object": "response",
            "created_at": req.created,
            "status": status,
            "background": False,
            "completed_at": int(time.time()) if done else None,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_tokens,
            "max_tool_calls": None,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "prompt_cache_key": None,
            "prompt_cache_retention": None,
            "reasoning": {"effort": None, "summary": None},
            "safety_identifier": None,
            "service_tier": "default" if done else "auto",
            "store": True,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": "auto",
            "tools": [],
            "top_logprobs": 0,
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": {},
        }

    def _reasoning_item(self, text: str | None) -> dict[str, Any]:
        content = [] if text is None else [{"type": "reasoning_text", "text": text}]
        status = "in_progress" if text is None else "completed"
        return {"id": self.rs_id, "type": "reasoning", "summary": [], "content": content,
                "encrypted_content": None, "status": status}  # fmt: skip

    def _message_item(self, text: str | None) -> dict[str, Any]:
        if text is None:
            return {"id": self.msg_id, "type": "message", "status": "in_progress", "content": [],
                    "role": "assistant"}  # fmt: skip
        return {"id": self.msg_id, "type": "message",
                "status": "incomplete" if self.length else "completed",
                "content": [_output_text(text)], "role": "assistant"}  # fmt: skip

    def _output(self) -> list[Any]:
        items = [self._reasoning_item(self.thinking())] if self.reasoning else []
        if self.tools is not None:
            return [*items, *(self._call_item(call, True) for call in range(self.plan.tool_calls))]
        return [*items, self._message_item(self.answer())]

    def _call_item(self, call: int, done: bool) -> dict[str, Any]:
        """A ``function_call`` output item (tests/fixtures/streams/responses/parallel_function_calls.txt)."""
        return {"id": f"fc_{tool_call_id(self.plan, call, 48)}", "type": "function_call",
                "status": "completed" if done else "in_progress",
                "arguments": self.tool_arguments(call) if done else "",
                "call_id": f"call_{tool_call_id(self.plan, call + 1000, 24, _ALNUM)}",
                "name": self.tool_name(call)}  # fmt: skip

    def _tool_events(self, step: ToolStep) -> bytes:
        index = step.call + (1 if self.reasoning else 0)
        if step.first:
            return self._event(
                "response.output_item.added",
                item=self._call_item(step.call, False),
                output_index=index,
            )
        item_id = f"fc_{tool_call_id(self.plan, step.call, 48)}"
        out = self._event("response.function_call_arguments.delta", delta=step.arguments, item_id=item_id,
                          output_index=index)  # fmt: skip
        if step.last:
            out += self._event("response.function_call_arguments.done", arguments=self.tool_arguments(step.call),
                               item_id=item_id, output_index=index)  # fmt: skip
            out += self._event(
                "response.output_item.done",
                item=self._call_item(step.call, True),
                output_index=index,
            )
        return out

    def _usage(self) -> dict[str, Any]:
        p, n = self.req.prompt_tokens, self.steps
        return {"input_tokens": p, "input_tokens_details": {"cached_tokens": self.cached or 0}, "output_tokens": n,
                "output_tokens_details": {"reasoning_tokens": self.reasoning}, "total_tokens": p + n}  # fmt: skip

    # -- stream

    def start(self) -> bytes:
        response = self._response("in_progress", [])
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def token(self, k: int) -> bytes:
        out = b""
        if k == 0 and self.reasoning:
            out += self._event(
                "response.output_item.added", item=self._reasoning_item(None), output_index=0
            )
            out += self._event("response.content_part.added", content_index=0, item_id=self.rs_id,
                               output_index=0, part={"type": "reasoning_text", "text": ""})  # fmt: skip
        step = self.tool_step(k)
        if step is not None:
            if k == self.reasoning and self.reasoning:
                out += self._reasoning_done()
            return out + self._tool_events(step)
        if k == self.reasoning:
            if self.reasoning:
                out += self._reasoning_done()
            out += self._event("response.output_item.added", item=self._message_item(None),
                               output_index=self.msg_index)  # fmt: skip
            out += self._event("response.content_part.added", content_index=0, item_id=self.msg_id,
                               output_index=self.msg_index,
                               part={"type": "output_text", "annotations": [], "logprobs": [], "text": ""})  # fmt: skip
        if k < self.reasoning:
            return out + self._event("response.reasoning_text.delta", content_index=0, delta=self.text(k),
                                     item_id=self.rs_id, output_index=0)  # fmt: skip
        return out + self._event("response.output_text.delta", content_index=0, delta=self.text(k),
                                 item_id=self.msg_id, logprobs=[], output_index=self.msg_index)  # fmt: skip

    def _reasoning_done(self) -> bytes:
        text = self.thinking()
        return (
            self._event("response.reasoning_text.done", content_index=0, item_id=self.rs_id,
                        output_index=0, text=text)
            + self._event("response.content_part.done", content_index=0, item_id=self.rs_id,
                          output_index=0, part={"type": "reasoning_text", "text": text})
            + self._event("response.output_item.done", item=self._reasoning_item(text), output_index=0)
        )  # fmt: skip

    def end(self) -> bytes:
        if self.tools is not None:
            return self._event(
                "response.completed",
                response=self._response("completed", self._output(), self._usage()),
            )
        text, i = self.answer(), self.msg_index
        status = "incomplete" if self.length else "completed"
        return (
            self._event("response.output_text.done", content_index=0, item_id=self.msg_id, logprobs=[],
                        output_index=i, text=text)
            + self._event("response.content_part.done", content_index=0, item_id=self.msg_id,
                          output_index=i, part=_output_text(text))
            + self._event("response.output_item.done", item=self._message_item(text), output_index=i)
            + self._event(f"response.{status}",
                          response=self._response(status, self._output(), self._usage()))
        )  # fmt: skip

    def error(self) -> bytes:
        err = {"code": "server_error", "message": ENGINE_FAILURE}
        return self._event("response.failed", response=self._response("failed", [], error=err))

    def whole(self) -> bytes:
        status = "incomplete" if self.length else "completed"
        obj = self._response(status, self._output(), self._usage())
        return orjson.dumps(obj, option=orjson.OPT_INDENT_2)


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _check_openai_model(body: dict[str, Any], sim: SimState) -> None:
    model = body.get("model")
    if model is None:
        raise BadRequest(400, "Field required: model")
    if model != sim.config.model:
        raise BadRequest(404, f"The model `{model}` does not exist.")


# ---------------------------------------------------------------- Anthropic Messages


class _Anthropic(_Dialect):
    reasoning_ok = True
    tool_calls_ok = True
    _PING = b'event: ping\ndata: {"type": "ping"}\n\n'
    _OVERLOADED = (
        b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", '
        b'"message": "Overloaded"}}\n\n'
    )

    def __init__(self, sim: SimState, plan: Plan, req: _Req) -> None:
        super().__init__(sim, plan, req)
        self.msg_id = f"msg_01{plan.rid[:22]}"
        self.signature = f"EqQBCkYIBhgCIkB{plan.rid}"
        self.text_index = 1 if self.reasoning else 0

    @staticmethod
    def parse(body: dict[str, Any], request: web.Request, sim: SimState) -> _Req:
        model = body.get("model")
        if not isinstance(model, str):
            raise BadRequest(400, "model: Field required")
        messages = list(_messages(body.get("messages")))
        if body.get("max_tokens") is None:
            raise BadRequest(400, "max_tokens: Field required")
        max_tokens = _limit(body, "max_tokens")
        system = body.get("system")
        if isinstance(system, (str, list)):
            messages.append({"role": "system", "content": system})
        if model != sim.config.model:
            raise BadRequest(404, f"model: {model}")
        return _Req(stream=_flag(body, "stream"), prompt_tokens=chat_prompt_tokens(messages),
                    max_tokens=max_tokens)  # fmt: skip

    @classmethod
    def error_response(cls, status: int, message: str) -> web.Response:
        kind = {404: "not_found_error", 500: "api_error"}.get(status, "invalid_request_error")
        body = {"type": "error", "error": {"type": kind, "message": message},
                "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"}  # fmt: skip
        return web.Response(status=status, body=orjson.dumps(body), content_type=_JSON)

    def _usage(self, output: int) -> dict[str, Any]:
        # Anthropic's input_tokens leaves out what was read from the cache.
        cached = self.cached or 0
        return {"input_tokens": self.req.prompt_tokens - cached, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": cached, "output_tokens": output}  # fmt: skip

    def _message(
        self, content: list[Any], stop: str | None, usage: dict[str, Any]
    ) -> dict[str, Any]:
        return {"id": self.msg_id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage}  # fmt: skip

    def _stop_reason(self) -> str:
        if self.tools is not None:
            return "tool_use"
        return "max_tokens" if self.length else "end_turn"

    @staticmethod
    def _block_start(index: int, block: dict[str, Any]) -> bytes:
        return _sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": block},
        )

    @staticmethod
    def _delta(index: int, delta: dict[str, Any]) -> bytes:
        return _sse(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )

    @staticmethod
    def _block_stop(index: int) -> bytes:
        return _sse("content_block_stop", {"type": "content_block_stop", "index": index})

    def start(self) -> bytes:
        message = self._message([], None, self._usage(1))
        if self.tools is not None and not self.reasoning:
            # The first block is the first tool_use, started when its name is generated
            # (tests/fixtures/streams/anthropic/parallel_tool_use.txt).
            return _sse("message_start", {"type": "message_start", "message": message})
        first = (
            {"type": "thinking", "thinking": ""} if self.reasoning else {"type": "text", "text": ""}
        )
        return (
            _sse("message_start", {"type": "message_start", "message": message})
            + self._block_start(0, first)
            + self._PING
        )

    def _tool_block(self, step: ToolStep) -> bytes:
        """A ``tool_use`` block: its start with the id and name and an empty
        ``input_json_delta``, then one ``input_json_delta`` per piece, stopped after the last."""
        index = step.call + (1 if self.reasoning else 0)
        if step.first:
            block = {"type": "tool_use", "id": f"toolu_01{tool_call_id(self.plan, step.call, 22, _ALNUM)}",
                     "name": self.tool_name(step.call), "input": {}}  # fmt: skip
            return self._block_start(index, block) + self._delta(
                index, {"type": "input_json_delta", "partial_json": ""}
            )
        out = self._delta(index, {"type": "input_json_delta", "partial_json": step.arguments})
        return out + self._block_stop(index) if step.last else out

    def token(self, k: int) -> bytes:
        if k < self.reasoning:
            return self._delta(0, {"type": "thinking_delta", "thinking": self.text(k)})
        step = self.tool_step(k)
        if step is not None:
            out = b""
            if k == self.reasoning and self.reasoning:
                out = self._delta(
                    0, {"type": "signature_delta", "signature": self.signature}
                ) + self._block_stop(0)
            return out + self._tool_block(step)
        out = b""
        if k == self.reasoning and self.reasoning:
            out = (
                self._delta(0, {"type": "signature_delta", "signature": self.signature})
                + self._block_stop(0)
                + self._block_start(1, {"type": "text", "text": ""})
            )
        return out + self._delta(self.text_index, {"type": "text_delta", "text": self.text(k)})

    def end(self) -> bytes:
        delta = {"type": "message_delta", "delta": {"stop_reason": self._stop_reason(), "stop_sequence": None},
                 "usage": {"output_tokens": self.steps}}  # fmt: skip
        return (
            (b"" if self.tools is not None else self._block_stop(self.text_index))
            + _sse("message_delta", delta)
            + _sse("message_stop", {"type": "message_stop"})
        )

    def error(self) -> bytes:
        return self._OVERLOADED

    def whole(self) -> bytes:
        content: list[Any] = []
        if self.reasoning:
            content.append(
                {"type": "thinking", "thinking": self.thinking(), "signature": self.signature}
            )
        content.append({"type": "text", "text": self.answer()})
        usage = {**self._usage(self.steps), "service_tier": "standard"}
        return orjson.dumps(self._message(content, self._stop_reason(), usage))


# ---------------------------------------------------------------- Hugging Face TGI

# Logprobs as TGI writes them (f32 through ryu), from its documented streams.
_TGI_LOGPROBS = (
    -0.12890625, -0.6171875, -0.0009765625, -0.010253906, -0.25585938, -0.05419922,
    -5.9604645e-7, -0.006591797, -1.1920929e-7, -0.40820312, -0.7402344, -0.9433594,
)  # fmt: skip
_TGI_EOS = {"id": 2, "text": "</s>", "logprob": -0.06982422, "special": True}


def _token_id(text: str) -> int:
    """A stable vocabulary id for a token's text (the same text, the same id)."""
    return 100 + zlib.crc32(text.encode()) % 32000


class _TGI(_Dialect):
    content_type = _SSE

    def __init__(self, sim: SimState, plan: Plan, req: _Req) -> None:
        super().__init__(sim, plan, req)
        self.eos = not self.length  # a generation that stops by itself ends with </s>

    @staticmethod
    def parse(body: dict[str, Any], request: web.Request, sim: SimState) -> _Req:
        inputs = body.get("inputs")
        if not isinstance(inputs, str) or not inputs:
            raise BadRequest(422, "Input validation error: `inputs` cannot be empty")
        params = body.get("parameters") or {}
        if not isinstance(params, dict):
            raise BadRequest(422, "Input validation error: `parameters` must be an object")
        seed = params.get("seed")
        try:
            return _Req(
                stream=_flag(body, "stream"),
                prompt_tokens=1 + text_tokens(inputs),
                max_tokens=_limit(params, "max_new_tokens"),
                prompt=inputs,
                details=_flag(params, "details"),
                full_text=_flag(params, "return_full_text"),
                seed=seed if type(seed) is int else None,
            )
        except BadRequest as exc:  # TGI answers every validation failure with 422
            raise BadRequest(422, f"Input validation error: {exc.message}") from None

    @classmethod
    def error_response(cls, status: int, message: str) -> web.Response:
        kind = "generation" if status >= 500 else "validation"
        return web.Response(status=status, body=orjson.dumps({"error": message, "error_type": kind}),
                            content_type=_JSON)  # fmt: skip

    def _token(self, k: int) -> dict[str, Any]:
        if self.eos and k == self.steps - 1:
            return _TGI_EOS
        text = self.text(k)
        return {"id": _token_id(text), "text": text, "logprob": _TGI_LOGPROBS[k % len(_TGI_LOGPROBS)],
                "special": False}  # fmt: skip

    def _generated_text(self) -> str:
        text = self.joined(0, self.steps - 1 if self.eos else self.steps)
        return self.req.prompt + text if self.req.full_text else text

    def _finish(self) -> str:
        return "eos_token" if self.eos else "length"

    def token(self, k: int) -> bytes:
        last = k == self.steps - 1
        details = None
        if last and self.req.details:
            details = {"finish_reason": self._finish(), "generated_tokens": self.steps, "seed": self.req.seed,
                       "input_length": self.req.prompt_tokens}  # fmt: skip
        obj = {"index": k + 1, "token": self._token(k),
               "generated_text": self._generated_text() if last else None, "details": details}  # fmt: skip
        return b"data:%s\n\n" % orjson.dumps(obj)

    def error(self) -> bytes:
        message = f"Request failed during generation: Server error: {ENGINE_FAILURE}"
        return b"data:%s\n\n" % orjson.dumps({"error": message, "error_type": "generation"})

    def whole(self) -> bytes:
        obj: dict[str, Any] = {"generated_text": self._generated_text()}
        if self.req.details:
            obj["details"] = {"finish_reason": self._finish(), "generated_tokens": self.steps,
                              "seed": self.req.seed, "prefill": [],
                              "tokens": [self._token(k) for k in range(self.steps)]}  # fmt: skip
        return orjson.dumps(obj)


# ---------------------------------------------------------------- Ollama


def _go_json(obj: Any) -> bytes:
    """Go's ``json.Marshal``: like orjson, but ``<``, ``>``, ``&``, U+2028 and U+2029 are
    escaped (they can only occur inside strings, so replacing in the output is exact)."""
    return (
        orjson.dumps(obj)
        .replace(b"<", b"\\u003c")
        .replace(b">", b"\\u003e")
        .replace(b"&", b"\\u0026")
        .replace("\u2028".encode(), b"\\u2028")
        .replace("\u2029".encode(), b"\\u2029")
    )


def _go_time() -> str:
    """``time.Now().UTC()`` as Go's RFC 3339 with nanoseconds, trailing zeros trimmed."""
    ns = time.time_ns()
    secs, frac = divmod(ns, 1_000_000_000)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    digits = f"{frac:09d}".rstrip("0")
    return f"{base}.{digits}Z" if digits else f"{base}Z"


class _Ollama(_Dialect):
    content_type = "application/x-ndjson"
    json_type = _JSON_UTF8
    reasoning_ok = True
    tool_calls_ok = True
    chat: ClassVar[bool] = True

    @classmethod
    def parse(cls, body: dict[str, Any], request: web.Request, sim: SimState) -> _Req:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest(400, "model is required")
        if cls.chat:
            messages = _messages(body.get("messages"))
            prompt = ""
        else:
            prompt = _text(body.get("prompt"), "prompt")
            messages = [{"role": "user", "content": prompt}]
        system = body.get("system")
        if isinstance(system, str) and system:
            messages = [*messages, {"role": "system", "content": system}]
        if model not in (sim.config.model, f"{sim.config.model}:latest"):
            raise BadRequest(404, f'model "{model}" not found, try pulling it first')
        options = body.get("options") or {}
        if not isinstance(options, dict):
            raise BadRequest(400, "options must be an object")
        return _Req(
            stream=_flag(body, "stream", default=True),  # Ollama streams unless told not to
            prompt_tokens=chat_prompt_tokens(messages),
            max_tokens=_limit(options, "num_predict", negative_is_unlimited=True),
            model=model,
            prompt=prompt,
        )

    @classmethod
    def error_response(cls, status: int, message: str) -> web.Response:
        return web.Response(status=status, body=_go_json({"error": message}),
                            headers={"Content-Type": _JSON_UTF8})  # fmt: skip

    def _line(self, text: str, thinking: str, final: dict[str, Any] | None) -> dict[str, Any]:
        obj: dict[str, Any] = {"model": self.model, "created_at": _go_time()}
        if self.chat:
            message = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            obj["message"] = message
            if final is not None:
                obj["done_reason"] = final.pop("done_reason")
            obj["done"] = final is not None
        else:
            obj["response"] = text
            if thinking:
                obj["thinking"] = thinking
            obj["done"] = final is not None
            if final is not None:
                obj["done_reason"] = final.pop("done_reason")
                obj["context"] = [
                    _token_id(str(i)) for i in range(self.req.prompt_tokens + self.steps)
                ]
        if final is not None:
            obj.update(final)
        return obj

    def _final(self) -> dict[str, Any]:
        ttft, decode = self.plan.ttft, self.decode_seconds()
        final: dict[str, Any] = {"done_reason": "length" if self.length else "stop"}
        # Go's omitempty: zero counts and durations are left out.
        for key, value in (
            ("total_duration", round((ttft + decode) * 1e9)),
            ("load_duration", round(ttft * ENGINE_LOAD_SHARE * 1e9)),
            ("prompt_eval_count", self.req.prompt_tokens),
            ("prompt_eval_duration", round(ttft * ENGINE_PREFILL_SHARE * 1e9)),
            ("eval_count", self.steps),
            ("eval_duration", round(decode * 1e9)),
        ):
            if value:
                final[key] = value
        return final

    def token(self, k: int) -> bytes:
        if self.tool_step(k) is not None:
            # Ollama's tool parser holds the call back until it is whole, then sends every
            # call in one line (tests/fixtures/streams/ollama/chat_parallel_tool_calls.ndjson).
            return self._tool_line() if k == self.steps - 1 else b""
        text = self.text(k)
        obj = self._line("", text, None) if k < self.reasoning else self._line(text, "", None)
        return _go_json(obj) + b"\n"

    def _tool_line(self) -> bytes:
        calls = [
            {"id": f"call_{tool_call_id(self.plan, call, 8, _ALNUM[10:36].lower() + _ALNUM[:10])}",
             "function": {"index": call, "name": self.tool_name(call),
                          "arguments": orjson.loads(self.tool_arguments(call))}}
            for call in range(self.plan.tool_calls)
        ]  # fmt: skip
        message = {"role": "assistant", "content": "", "tool_calls": calls}
        return (
            _go_json(
                {"model": self.model, "created_at": _go_time(), "message": message, "done": False}
            )
            + b"\n"
        )

    def end(self) -> bytes:
        return _go_json(self._line("", "", self._final())) + b"\n"

    def error(self) -> bytes:
        return (
            _go_json(
                {"error": f"an error was encountered while running the model: {ENGINE_FAILURE}"}
            )
            + b"\n"
        )

    def whole(self) -> bytes:
        return _go_json(self._line(self.answer(), self.thinking(), self._final()))


class _OllamaGenerate(_Ollama):
    chat = False
    tool_calls_ok = False  # /api/generate has no tools


# ---------------------------------------------------------------- llama.cpp


class _LlamaCpp(_Dialect):
    content_type = _SSE
    json_type = _JSON_UTF8

    @staticmethod
    def parse(body: dict[str, Any], request: web.Request, sim: SimState) -> _Req:
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            tokens = 1 + text_tokens(prompt)
        elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            tokens, prompt = len(prompt), ""
        else:
            raise BadRequest(400, '"prompt" must be provided')
        limit = _limit(body, "n_predict", negative_is_unlimited=True)
        if limit is None:
            limit = _limit(body, "max_tokens", negative_is_unlimited=True)
        return _Req(
            stream=_flag(body, "stream"), prompt_tokens=tokens, max_tokens=limit, prompt=prompt
        )

    @classmethod
    def error_response(cls, status: int, message: str) -> web.Response:
        kind = "server_error" if status >= 500 else "invalid_request_error"
        body = {"error": {"code": status, "message": message, "type": kind}}
        return web.Response(
            status=status, body=orjson.dumps(body), headers={"Content-Type": _JSON_UTF8}
        )

    def token(self, k: int) -> bytes:
        text = self.text(k)
        obj = {"index": 0, "content": text, "tokens": [_token_id(text)], "stop": False, "id_slot": 0,
               "tokens_predicted": k + 1, "tokens_evaluated": self.req.prompt_tokens}  # fmt: skip
        return b"data: %s\n\n" % orjson.dumps(obj)

    def _final(self, content: str, stream: bool) -> dict[str, Any]:
        p, n = self.req.prompt_tokens, self.steps
        prompt_ms = round(self.plan.ttft * ENGINE_PREFILL_SHARE * 1000, 3)
        predicted_ms = round(self.decode_seconds() * 1000, 3)
        limit = self.req.max_tokens if self.req.max_tokens is not None else -1
        return {
            "index": 0, "content": content, "tokens": [], "id_slot": 0, "stop": True,
            "model": self.model, "tokens_predicted": n, "tokens_evaluated": p,
            "generation_settings": {
                "n_predict": limit, "seed": 4294967295, "temperature": 0.800000011920929, "top_k": 40,
                "top_p": 0.949999988079071, "min_p": 0.05000000074505806, "stop": [], "max_tokens": limit,
                "stream": stream, "n_probs": 0, "timings_per_token": False,
            },
            "prompt": self.req.prompt, "has_new_line": "\n" in self.answer(), "truncated": False,
            "stop_type": "limit" if self.length else "eos", "stopping_word": "",
            "tokens_cached": p + n - 1,
            "timings": {
                "cache_n": 0, "prompt_n": p, "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / p,
                "prompt_per_second": 1e3 / prompt_ms * p if prompt_ms else None,
                "predicted_n": n, "predicted_ms": predicted_ms,
                "predicted_per_token_ms": predicted_ms / n,
                "predicted_per_second": 1e3 / predicted_ms * n if predicted_ms else None,
            },
        }  # fmt: skip

    def end(self) -> bytes:
        return b"data: %s\n\n" % orjson.dumps(self._final("", True))

    def error(self) -> bytes:
        body = {"error": {"code": 500, "message": ENGINE_FAILURE, "type": "server_error"}}
        return b"data: %s\n\n" % orjson.dumps(body)

    def whole(self) -> bytes:
        return orjson.dumps(self._final(self.answer(), False))


# ---------------------------------------------------------------- Triton / TensorRT-LLM


class _Triton(_Dialect):
    """The TensorRT-LLM ``ensemble`` layout: its extra output tensors, alphabetical keys,
    ``output_log_probs`` a scalar in the first event and then one entry per token so far."""

    @staticmethod
    def parse(body: dict[str, Any], request: web.Request, sim: SimState) -> _Req:
        model = request.match_info["model"]
        if model != sim.config.model:
            raise BadRequest(400, f"Request for unknown model: '{model}' is not found")
        prompt = _text(body.get("text_input"), "text_input")
        return _Req(
            stream=False,  # the route decides
            prompt_tokens=1 + text_tokens(prompt),
            max_tokens=_limit(body, "max_tokens"),
            model=model,
            version=request.match_info.get("version", "1"),
        )

    @classmethod
    def error_response(cls, status: int, message: str) -> web.Response:
        return web.Response(
            status=status, body=orjson.dumps({"error": message}), content_type=_JSON
        )

    def _object(self, log_probs: Any, text: str) -> dict[str, Any]:
        return {"context_logits": 0.0, "cum_log_probs": 0.0, "generation_logits": 0.0,
                "model_name": self.model, "model_version": self.req.version, "output_log_probs": log_probs,
                "sequence_end": False, "sequence_id": 0, "sequence_start": False, "text_output": text}  # fmt: skip

    def token(self, k: int) -> bytes:
        log_probs = 0.0 if k == 0 else [0.0] * (k + 1)
        return b"data: %s\n\n" % orjson.dumps(self._object(log_probs, self.text(k)))

    def error(self) -> bytes:
        message = (
            f"in ensemble '{self.model}', Executor failed process requestId 1 due to the following "
            f"error: {ENGINE_FAILURE}"
        )
        return b"data: %s\n\n" % orjson.dumps({"error": message})

    def whole(self) -> bytes:
        return orjson.dumps(self._object([0.0] * self.steps, self.answer()))


# ---------------------------------------------------------------- routes


def add_dialect_routes(app: web.Application) -> None:
    """Register every non-vLLM dialect on the simulator app (which holds the ``SIM_STATE`` state)."""
    r = app.router
    r.add_post("/v1/responses", _handler(_Responses))
    r.add_post("/v1/messages", _handler(_Anthropic))
    r.add_post("/generate_stream", _handler(_TGI, force_stream=True))
    r.add_post("/generate", _handler(_TGI, force_stream=False))
    r.add_post("/", _handler(_TGI, compat_list=True))
    r.add_post("/api/chat", _handler(_Ollama))
    r.add_post("/api/generate", _handler(_OllamaGenerate))
    r.add_post("/completion", _handler(_LlamaCpp))
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        r.add_post(prefix + "/generate_stream", _handler(_Triton, force_stream=True))
        r.add_post(prefix + "/generate", _handler(_Triton, force_stream=False))
