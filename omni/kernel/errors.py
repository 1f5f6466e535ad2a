"""Typed errors a client of the kernel can catch; `kind` travels in RequestError messages."""

from __future__ import annotations


class OmniError(Exception):
    """Base of every error omni raises on purpose."""
    kind = "internal"


class GraphError(OmniError, ValueError):
    """The graph spec or an override is invalid (names the stage or field)."""
    kind = "graph"


class StageStartError(OmniError):
    """A stage did not become ready; the message names it and says why."""
    kind = "stage_start"


class Overloaded(OmniError):
    """Admission is full: the caller should retry later (HTTP 429)."""
    kind = "overloaded"


class InvalidRequest(OmniError, ValueError):
    """The request's parameters or inputs are invalid (HTTP 400)."""
    kind = "invalid_request"


class PayloadTooLarge(InvalidRequest):
    """One of the request's payloads can never fit where it must go (an edge's arena): HTTP 413.
    Only that request fails; the stage that refused it goes on."""
    kind = "too_large"


class RequestCancelled(OmniError):
    kind = "cancelled"


class DeadlineExceeded(OmniError):
    kind = "deadline"


class StageFailed(OmniError):
    """A stage raised while serving the request, or its process died (HTTP 503 / 500)."""
    kind = "stage_failed"


class StageDown(OmniError):
    """A stage needed by the request is down past its restart budget (HTTP 503)."""
    kind = "stage_down"


class KernelClosed(OmniError):
    kind = "closed"


class BackendUnavailable(OmniError):
    """An optional engine a stage asked for (e.g. `backend="sglang"`) cannot be imported here;
    the message says what is missing, the version found and how to install it."""
    kind = "backend_unavailable"


_BY_KIND = {cls.kind: cls for cls in (OmniError, GraphError, Overloaded, InvalidRequest, PayloadTooLarge,
                                      RequestCancelled, DeadlineExceeded, StageFailed, StageDown, KernelClosed,
                                      BackendUnavailable)}


def error_from_kind(kind: str, message: str) -> OmniError:
    """Rebuild the typed error a stage reported by kind."""
    return _BY_KIND.get(kind, StageFailed)(message)
