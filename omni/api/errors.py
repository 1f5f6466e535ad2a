"""OpenAI-shaped errors: one exception type for every refusal, and the middleware that renders it.

Every failure a client can see leaves as `{"error": {"message", "type", "param", "code"}}` with a
4xx/5xx status. Kernel errors map to statuses here, in one table, so routes never pick codes.
"""

from __future__ import annotations

import logging
import re

import msgspec
from aiohttp import web

from omni.kernel.errors import (
    DeadlineExceeded,
    InvalidRequest,
    KernelClosed,
    OmniError,
    Overloaded,
    PayloadTooLarge,
    RequestCancelled,
    StageDown,
    StageFailed,
)

log = logging.getLogger("omni.api")

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    499: "cancelled",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


# an object's repr with its address (`<_io.BytesIO object at 0x7f...>`), as a library's exception
# text may carry it: it says nothing to a client and shows the server's memory layout
_OBJECT_REPR = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+>")


def without_object_reprs(message: str) -> str:
    return _OBJECT_REPR.sub("an object", message)


class ApiError(Exception):
    """A refusal with its HTTP status; `param` names the offending field when there is one. Its
    message never carries an object's repr (every error a client sees, HTTP, SSE or Realtime, is one)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None) -> None:
        message = without_object_reprs(str(message))
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPE_BY_STATUS.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.headers: dict[str, str] = {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unknown_voice(voice: str, known: str, param: str = "voice") -> ApiError:
    """The one refusal of a voice a model does not have, whatever the model: 400 `unknown_voice`."""
    return ApiError(400, f"unknown voice {voice!r}; {known}", param=param, code="unknown_voice")


def too_large(message: str, param: str | None = None) -> ApiError:
    return ApiError(413, message, param=param, code="too_large")


_INTERNAL_PREFIX = re.compile(r"^(stage \S+: )?((InvalidRequest|PayloadTooLarge): )?")


def client_message(exc: OmniError) -> str:
    """A stage's refusal in the client's terms: without the kernel's "stage NAME: " and the error
    class in front (the server log keeps them)."""
    text = str(exc)
    trimmed = _INTERNAL_PREFIX.sub("", text, count=1)
    if trimmed != text:
        log.info("refused by a stage: %s", text)
    return trimmed or text


def from_kernel_error(exc: OmniError) -> ApiError:
    """The one mapping of kernel errors to HTTP statuses."""
    if isinstance(exc, Overloaded):
        return ApiError(429, f"server is at capacity, retry later ({exc})", code="overloaded")
    if isinstance(exc, PayloadTooLarge):
        return too_large(client_message(exc))
    if isinstance(exc, InvalidRequest):
        return ApiError(400, client_message(exc), code="invalid_request")
    if isinstance(exc, StageDown):
        return ApiError(503, f"a stage this request needs is down: {exc}", code="stage_down")
    if isinstance(exc, StageFailed):
        return ApiError(503, f"a stage failed while serving this request: {exc}", code="stage_failed")
    if isinstance(exc, DeadlineExceeded):
        return ApiError(504, f"request deadline exceeded: {exc}", code="deadline_exceeded")
    if isinstance(exc, RequestCancelled):
        return ApiError(499, f"request cancelled: {exc}", code="cancelled")
    if isinstance(exc, KernelClosed):
        return ApiError(503, "server is shutting down", code="shutting_down")
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal")


def as_api_error(exc: BaseException) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, OmniError):
        return from_kernel_error(exc)
    return ApiError(500, f"internal error: {type(exc).__name__}", code="internal")


def error_response(err: ApiError) -> web.Response:
    headers = {"Retry-After": "1"} if err.status in (429, 503) else {}
    headers.update(err.headers)
    response = web.Response(status=err.status, body=msgspec.json.encode(err.body()),
                            content_type="application/json", headers=headers)
    if err.status in (408, 431):  # the rest of the request was never read: this connection is done
        response.force_close()
    return response


def _from_http_exception(exc: web.HTTPException) -> ApiError:
    status = exc.status
    if status == 404:
        return ApiError(404, "no such route", code="not_found")
    if status == 405:
        allowed = sorted(getattr(exc, "allowed_methods", ()))
        err = ApiError(405, f"method not allowed; allowed: {allowed}", code="method_not_allowed")
        err.headers["Allow"] = ", ".join(allowed)
        return err
    if status == 413:
        return too_large(f"request body too large: {exc.text or ''}".strip())
    return ApiError(status, exc.text or exc.reason, code=exc.reason.lower().replace(" ", "_"))


@web.middleware
async def error_middleware(request: web.Request, handler):
    """Render every error as an OpenAI error body; only our own bugs are 500s, and they are logged."""
    try:
        return await handler(request)
    except ApiError as err:
        return error_response(err)
    except OmniError as exc:
        return error_response(from_kernel_error(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(_from_http_exception(exc))
    except (ConnectionResetError,) as exc:  # the client left; nothing to answer
        log.debug("client went away on %s: %s", request.path, exc)
        raise
    except Exception as exc:  # a bug in omni: log it whole, tell the client little
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(as_api_error(exc))
