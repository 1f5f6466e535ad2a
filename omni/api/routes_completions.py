"""POST /v1/completions: OpenAI's text completions (the prompt continued as it is, no chat
template), whole or streamed, `n` per prompt. The same kernel requests and sampler as chat
(`routes_chat.kernel_requests`); choice `p * n + i` is prompt p's i-th answer, as OpenAI numbers them.

An /v1/embeddings request gets OpenAI's 400 saying no served model embeds, not a "no such route".
"""

from __future__ import annotations

import json
import time
import uuid

from aiohttp import web

from omni.api.choices import Choices
from omni.api.connections import read_body
from omni.api.errors import as_api_error, bad_request
from omni.api.generation import Finish, TextPiece
from omni.api.params import check_model, completion_params, stop_strings
from omni.api.prompt_bounds import check_prompt_chars
from omni.api.routes_chat import kernel_requests, usage
from omni.api.schemas import CompletionRequest, decode_body
from omni.api.sse import SseStream
from omni.api.state import STATE

ROUTE = "/v1/completions"
EMBEDDINGS_ROUTE = "/v1/embeddings"


async def completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    req = decode_body(await read_body(request), CompletionRequest)
    prompts = completion_params(state, req)
    for params in prompts:
        check_prompt_chars(state.info, len(params["prompt"]), "prompt")
    meta = {"id": "cmpl-" + uuid.uuid4().hex, "created": int(time.time()), "model": req.model}
    stops = stop_strings(req.stop)
    gens = [gen for params in prompts for gen in kernel_requests(state, params, req.n, ROUTE, stops).gens]
    echoed = [p["prompt"] if req.echo else "" for p in prompts for _ in range(req.n)]
    async with Choices(gens) as choices:
        if req.stream:
            return await _stream(request, choices, req, meta, echoed)
        outs = await choices.collect()
        body = {**meta, "object": "text_completion",
                "choices": [{"index": i, "text": echoed[i] + "".join(out.text), "logprobs": None,
                             "finish_reason": out.finish.reason if out.finish else "stop"}
                            for i, out in enumerate(outs)],
                "usage": _usage([out.finish for out in outs], req.n)}
        return web.json_response(body)


def _usage(finishes: list[Finish | None], n: int) -> dict:
    """Every prompt once (each prompt's n choices share it), every choice's completion."""
    per_prompt = [usage(finishes[i:i + n]) for i in range(0, len(finishes), n)]
    prompt = sum(u["prompt_tokens"] for u in per_prompt)
    completion = sum(u["completion_tokens"] for u in per_prompt)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _stream(request: web.Request, choices: Choices, req: CompletionRequest, meta: dict,
                  echoed: list[str]) -> web.StreamResponse:
    sse = SseStream(request)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def chunk(index: int, text: str, finish_reason: str | None = None) -> dict:
        body = {**meta, "object": "text_completion",
                "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}]}
        if include_usage:
            body["usage"] = None
        return body

    finishes: list[Finish | None] = [None] * len(choices.gens)
    try:
        async for index, piece in choices.pieces():
            if echoed[index]:
                await sse.send(chunk(index, echoed[index]))
                echoed[index] = ""
            if isinstance(piece, TextPiece):
                if piece.text:
                    await sse.send(chunk(index, piece.text))
            elif isinstance(piece, Finish):
                finishes[index] = piece
                await sse.send(chunk(index, "", piece.reason))
    except ConnectionResetError:
        raise
    except Exception as exc:  # after the first byte the status is sent: report in-band, then end
        if not sse.started:
            raise
        return await sse.fail(as_api_error(exc))
    if include_usage:
        await sse.send({**meta, "object": "text_completion", "choices": [], "usage": _usage(finishes, req.n)})
    return await sse.done()


async def embeddings(request: web.Request) -> web.Response:
    """OpenAI's shape of "this model cannot": a 404 for a model not served, else a 400."""
    state = request.app[STATE]
    try:
        body = json.loads(await read_body(request) or b"{}")
    except ValueError:
        body = {}
    model = body.get("model") if isinstance(body, dict) else None
    if isinstance(model, str) and model:
        check_model(state, model, main_only=False)
    raise bad_request(f"embeddings are not supported by {'model ' + repr(model) if model else 'any model served here'}"
                      f" (served: {state.info.id!r}); no served model embeds text", param="model",
                      code="model_not_supported")


def install(app: web.Application) -> None:
    app.router.add_post(ROUTE, completions)
    app.router.add_post(EMBEDDINGS_ROUTE, embeddings)
