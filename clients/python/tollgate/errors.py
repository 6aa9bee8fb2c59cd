"""Exceptions of the Tollgate client. Each carries Tollgate's reason code."""

from __future__ import annotations

from typing import Any, Optional


class TollgateError(Exception):
    """An error with Tollgate's reason code.

    ``code`` is the stable reason code: one the gateway answered
    (``ARGS_DIGEST_MISMATCH``, ``RATE_LIMITED``, ...; docs/api.md "Errors"),
    a call's result code (``APPROVAL_DENIED``, ``POLICY_DENIED``, ...) or
    one of the client's own (``UNAVAILABLE``, ``DECISION_PENDING``,
    ``WEBHOOK_SIGNATURE_INVALID``, ``WEBHOOK_TIMESTAMP_INVALID``).
    """

    def __init__(self, code: str, message: str = "") -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}" if message else code)


class APIError(TollgateError):
    """The gateway refused a request: its problem+json (RFC 9457) answer.

    ``status`` is the HTTP status, ``code`` the problem's reason code,
    ``detail`` its detail, ``problem`` the whole decoded body, and
    ``retry_after`` the seconds of a ``Retry-After`` header (429), if any.
    """

    def __init__(self, status: int, code: str, title: str = "", detail: str = "",
                 problem: Optional[dict[str, Any]] = None, retry_after: Optional[float] = None) -> None:
        self.status = status
        self.title = title
        self.detail = detail
        self.problem = problem or {}
        self.retry_after = retry_after
        super().__init__(code, f"{status} {detail or title}".strip())


class UnavailableError(TollgateError):
    """The gateway could not be reached, or the connection failed (code ``UNAVAILABLE``)."""

    def __init__(self, message: str) -> None:
        super().__init__("UNAVAILABLE", message)


class NotApproved(TollgateError):
    """A gated call did not get the approved outcome, so the function did not run.

    ``code`` is the call's result code (``APPROVAL_DENIED``,
    ``POLICY_DENIED``, ``APPROVAL_EXPIRED``, ``TOOL_NOT_FOUND``,
    ``ARGS_INVALID``, ...), ``call`` the call as Tollgate reports it, with
    its ``result``, and ``turn_id`` its turn.
    """

    def __init__(self, code: str, message: str, call: Any = None, turn_id: str = "") -> None:
        self.call = call
        self.turn_id = turn_id
        super().__init__(code, message)


class DecisionPending(TollgateError):
    """No outcome came within the wait (code ``DECISION_PENDING``).

    The turn goes on: ``turn_id`` and ``approval_id`` say what is still
    waiting; wait for it again with :meth:`tollgate.Client.wait`.
    """

    def __init__(self, turn_id: str, approval_id: str = "") -> None:
        self.turn_id = turn_id
        self.approval_id = approval_id
        what = f"approval {approval_id}" if approval_id else f"turn {turn_id}"
        super().__init__("DECISION_PENDING", f"no outcome yet: waiting for {what}")


class WebhookVerificationError(TollgateError):
    """A webhook request failed verification; do not act on it.

    ``code`` is ``WEBHOOK_SIGNATURE_INVALID`` (missing headers, a bad
    secret, no matching ``v1`` signature) or ``WEBHOOK_TIMESTAMP_INVALID``
    (outside the tolerance: a replay, or a clock far off).
    """
