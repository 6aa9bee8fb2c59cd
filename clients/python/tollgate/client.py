"""The Tollgate HTTP API client (docs/api.md), standard library only."""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

from .errors import APIError, DecisionPending, NotApproved, TollgateError, UnavailableError
from .types import Approval, ApprovalPage, Call, Decision, Event, Submitted, Turn, decode

DEFAULT_URL = "http://127.0.0.1:8080"

#: The longest long poll the gateway serves (``GET /v1/turns/{id}?wait=``).
MAX_POLL = 60.0

CallSpec = Union[Mapping[str, Any], tuple]
Who = Union[str, Mapping[str, Any]]


class Client:
    """A client of one gateway with one API key.

    ``url`` defaults to ``$TOLLGATE_URL`` or ``http://127.0.0.1:8080``,
    ``key`` to ``$TOLLGATE_KEY``. ``session_id`` and ``sender`` are the
    defaults of :meth:`submit` and :meth:`gated`. A ``429 RATE_LIMITED``
    answer is retried after its ``Retry-After`` (at most ``retries`` times;
    a refused request published nothing, so a retry is safe); every other
    refusal raises :class:`APIError` with the problem's code.
    """

    def __init__(self, url: Optional[str] = None, key: Optional[str] = None, *,
                 session_id: Optional[str] = None, sender: Optional[Who] = None,
                 timeout: float = 30.0, retries: int = 3) -> None:
        self.url = (url or os.environ.get("TOLLGATE_URL") or DEFAULT_URL).rstrip("/")
        self.key = key if key is not None else os.environ.get("TOLLGATE_KEY", "")
        if not self.key:
            raise TollgateError("UNAUTHENTICATED", "no API key: pass key= or set TOLLGATE_KEY")
        self.session_id = session_id
        self.sender = sender
        self.timeout = timeout
        self.retries = retries

    # -- turns -----------------------------------------------------------

    def submit(self, calls: Optional[Iterable[CallSpec]] = None, *, session_id: Optional[str] = None,
               sender: Optional[Who] = None, text: Optional[str] = None,
               channel: Optional[Mapping[str, Any]] = None,
               idempotency_key: Optional[str] = None) -> Submitted:
        """Submits a turn (``POST /v1/turns``). ``calls`` are ``(tool, args)``
        pairs or ``{"tool": ..., "args": ...}``; ``sender`` an id or a Sender
        object. The same ``idempotency_key`` again returns the same turn
        (``duplicate`` true)."""
        body: dict[str, Any] = {"session_id": self._session(session_id), "sender": _who(self._sender(sender))}
        if channel is not None:
            body["channel"] = dict(channel)
        if text is not None:
            body["text"] = text
        if calls is not None:
            body["calls"] = [_call(c) for c in calls]
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return decode(Submitted, self._json("POST", "/v1/turns", body, headers))

    def turn(self, turn_id: str) -> Turn:
        """Reads a turn (``GET /v1/turns/{id}``)."""
        return decode(Turn, self._json("GET", "/v1/turns/" + _seg(turn_id)))

    def wait(self, turn_id: str, timeout: float = MAX_POLL) -> Turn:
        """Long-polls the turn until it is terminal or ``timeout`` seconds
        have passed, and returns it as it is then (``terminal`` says which)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            wait_ms = max(0, int(min(left, MAX_POLL) * 1000))
            t = decode(Turn, self._json("GET", f"/v1/turns/{_seg(turn_id)}?wait={wait_ms}ms",
                                        timeout=wait_ms / 1000 + self.timeout))
            if t.terminal or time.monotonic() >= deadline:
                return t

    def events(self, turn_id: str, last_event_id: Optional[str] = None) -> Iterator[Event]:
        """Iterates a turn's events (``GET /v1/turns/{id}/events``) from its
        first, or from after ``last_event_id`` (the :attr:`Event.id` of the
        last event seen: an opaque cursor string, sent back as it is; an
        int, an id of an earlier version, is sent as ``str(id)``), and ends
        after its ``turn.outcome``. A connection that drops is resumed with
        ``Last-Event-ID``: nothing missed, nothing twice."""
        return self._stream("/v1/turns/" + _seg(turn_id) + "/events", last_event_id, until_outcome=True)

    def session_events(self, session_id: str, last_event_id: Optional[str] = None) -> Iterator[Event]:
        """Iterates the new events of a session's turns (``GET
        /v1/events?session=``), or those after ``last_event_id`` (an
        :attr:`Event.id`, as for :meth:`events`), resuming after a
        disconnect like :meth:`events`; it does not end by itself."""
        q = urllib.parse.urlencode({"session": session_id})
        return self._stream("/v1/events?" + q, last_event_id, until_outcome=False)

    # -- approvals -------------------------------------------------------

    def approvals(self, status: str = "pending", session: Optional[str] = None) -> list[Approval]:
        """Lists approvals (``GET /v1/approvals``): ``status`` pending,
        approved, denied, expired, abandoned or all; every page, oldest
        request first (see :meth:`iter_approvals` to read them as they
        come, :meth:`approvals_page` for one page)."""
        return list(self.iter_approvals(status, session))

    def iter_approvals(self, status: str = "pending", session: Optional[str] = None, *,
                       limit: int = 200) -> Iterator[Approval]:
        """Yields the approvals of ``GET /v1/approvals`` page by page
        (``limit`` a page, at most 200), following ``next_cursor`` until
        the last page: each approval once, oldest request first."""
        cursor: Optional[str] = None
        while True:
            page = self.approvals_page(status, session, limit=limit, cursor=cursor)
            yield from page.approvals
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def approvals_page(self, status: str = "pending", session: Optional[str] = None, *,
                       limit: Optional[int] = None, cursor: Optional[str] = None) -> ApprovalPage:
        """One page of ``GET /v1/approvals``: ``limit`` approvals at most
        (1 to 200; the gateway's default is 50), after ``cursor`` (the
        ``next_cursor`` of the page before, with the same ``status`` and
        ``session``). A bad cursor raises :class:`APIError`
        ``CURSOR_INVALID``, a bad limit ``INVALID_INPUT``."""
        q: dict[str, Any] = {"status": status}
        if session is not None:
            q["session"] = session
        if limit is not None:
            q["limit"] = limit
        if cursor is not None:
            q["cursor"] = cursor
        return decode(ApprovalPage, self._json("GET", "/v1/approvals?" + urllib.parse.urlencode(q)))

    def approval(self, approval_id: str) -> Approval:
        """Reads one approval (``GET /v1/approvals/{id}``)."""
        return decode(Approval, self._json("GET", "/v1/approvals/" + _seg(approval_id)))

    def decide(self, approval: Union[Approval, Call, str], option: str, decider: Who, *,
               args_digest: Optional[str] = None, note: Optional[str] = None,
               channel: Optional[Mapping[str, Any]] = None,
               idempotency_key: Optional[str] = None) -> Decision:
        """Decides an approval (``POST /v1/approvals/{id}/decisions``) with the
        digest of the arguments the decider saw: that of ``approval`` (an
        :class:`Approval`, or a pending :class:`Call`), or ``args_digest``,
        which is required when ``approval`` is an id. A refused decision
        raises :class:`APIError` (``ARGS_DIGEST_MISMATCH``,
        ``DECIDER_NOT_AUTHORIZED``, ``APPROVAL_ALREADY_DECIDED``, ...)."""
        if isinstance(approval, Call):
            if not approval.approval_id:
                raise TollgateError("APPROVAL_NOT_FOUND", f"call {approval.call_id} has no approval")
            approval_id, digest = approval.approval_id, approval.args_digest
        elif isinstance(approval, Approval):
            approval_id, digest = approval.approval_id, approval.args_digest
        else:
            approval_id, digest = approval, ""
        digest = args_digest or digest
        if not digest:
            raise TollgateError("INVALID_INPUT", "args_digest is required: the digest of the arguments the decider saw")
        body: dict[str, Any] = {"option": option, "args_digest": digest, "decider": _who(decider)}
        if note is not None:
            body["note"] = note
        if channel is not None:
            body["channel"] = dict(channel)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return decode(Decision, self._json("POST", f"/v1/approvals/{_seg(approval_id)}/decisions", body, headers))

    def approve(self, approval: Union[Approval, Call, str], decider: Who, **kw: Any) -> Decision:
        """:meth:`decide` with option ``approve``."""
        return self.decide(approval, "approve", decider, **kw)

    def deny(self, approval: Union[Approval, Call, str], decider: Who, **kw: Any) -> Decision:
        """:meth:`decide` with option ``deny``."""
        return self.decide(approval, "deny", decider, **kw)

    # -- gating ----------------------------------------------------------

    def gate(self, tool: str, args: Mapping[str, Any], *, session_id: Optional[str] = None,
             sender: Optional[Who] = None, channel: Optional[Mapping[str, Any]] = None,
             timeout: float = 3600.0, idempotency_key: Optional[str] = None,
             on_submitted: Optional[Callable[[Submitted], None]] = None) -> Call:
        """Sends one call of ``tool`` with ``args`` through Tollgate and waits
        for its outcome. Returns the call when it has the approved outcome:
        Tollgate let it through (policy ``never``, a grant, or a person's
        approval) and ran ``tool``, with result ``ok``. Otherwise raises
        :class:`NotApproved` with the result's code (``APPROVAL_DENIED``,
        ``POLICY_DENIED``, ``APPROVAL_EXPIRED``, ``TOOL_NOT_FOUND``, ...), or
        :class:`DecisionPending` when no outcome came within ``timeout``.
        ``on_submitted`` is called with the submit's answer before the wait
        (to show the pending approval, say)."""
        sub = self.submit([(tool, args)], session_id=session_id, sender=sender, channel=channel,
                          idempotency_key=idempotency_key)
        if on_submitted is not None:
            on_submitted(sub)
        call = sub.calls[0] if sub.calls else None
        if call is None or call.result is None:
            turn = self.wait(sub.turn_id, timeout)
            call = turn.calls[0] if turn.calls else None
            if call is None or call.result is None:
                raise DecisionPending(sub.turn_id, (call.approval_id or "") if call else "")
        if call.result.status != "ok":
            r = call.result
            raise NotApproved(r.code or call.disposition.upper(),
                              f"{tool} did not get the approved outcome: {r.status}" + (f": {r.reason}" if r.reason else ""),
                              call=call, turn_id=sub.turn_id)
        return call

    def gated(self, tool: str, **kw: Any):
        """Decorator: see :func:`tollgate.gated`; uses this client."""
        from .gated import gated
        return gated(tool, client=self, **kw)

    # -- transport -------------------------------------------------------

    def _session(self, session_id: Optional[str]) -> str:
        s = session_id or self.session_id
        if not s:
            raise TollgateError("INVALID_INPUT", "session_id is required (or set Client(session_id=...))")
        return s

    def _sender(self, sender: Optional[Who]) -> Who:
        s = sender or self.sender
        if not s:
            raise TollgateError("INVALID_INPUT", "sender is required (or set Client(sender=...))")
        return s

    def _request(self, method: str, path: str, body: Any = None, headers: Optional[Mapping[str, str]] = None,
                 timeout: Optional[float] = None) -> http.client.HTTPResponse:
        h = {"Authorization": "Bearer " + self.key, "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
            try:
                return urllib.request.urlopen(req, timeout=timeout or self.timeout)
            except urllib.error.HTTPError as e:
                err = _problem(e)
                if err.code == "RATE_LIMITED" and attempt < self.retries:
                    time.sleep(min(err.retry_after or 1.0, 5.0))
                    continue
                raise err from None
            except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
                raise UnavailableError(f"{method} {self.url}{path}: {getattr(e, 'reason', e)}") from e
        raise AssertionError("unreachable")

    def _json(self, method: str, path: str, body: Any = None, headers: Optional[Mapping[str, str]] = None,
              timeout: Optional[float] = None) -> Any:
        with self._request(method, path, body, headers, timeout) as r:
            try:
                return json.load(r)
            except (OSError, http.client.HTTPException) as e:
                raise UnavailableError(f"{method} {path}: {e}") from e

    def _stream(self, path: str, last_event_id: Optional[str], until_outcome: bool) -> Iterator[Event]:
        # The id of the last event seen: an opaque cursor, sent back as
        # Last-Event-ID exactly as it came (an int from a caller of an
        # earlier version as its decimal).
        last = None if last_event_id is None else str(last_event_id)
        failures = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if last is not None:
                headers["Last-Event-ID"] = last
            try:
                # Heartbeats come every 15 s: a read silent for longer is a dead connection.
                resp = self._request("GET", path, headers=headers, timeout=max(self.timeout, 45.0))
            except UnavailableError:
                failures += 1
                if failures > self.retries:
                    raise
                time.sleep(0.2 * 2 ** failures)
                continue
            failures = 0
            try:
                for ev in _parse_sse(resp):
                    last = ev.id
                    yield ev
                    if until_outcome and ev.type == "turn.outcome":
                        return
            except (OSError, http.client.HTTPException, ValueError):
                pass  # cut off: resume after the last event seen
            finally:
                resp.close()


def _parse_sse(resp: Any) -> Iterator[Event]:
    """Reads Server-Sent Events (the subset the gateway sends: id, event,
    data; comments are heartbeats) until the response ends. An id is kept
    as the string it came as (an opaque cursor), never parsed."""
    ev_id: Optional[str] = None
    ev_type = "message"
    data: list[str] = []
    for raw in resp:
        line = raw.decode("utf-8").rstrip("\r\n")
        if line == "":
            if data and ev_id is not None:
                yield Event(id=ev_id, type=ev_type, data=json.loads("\n".join(data)))
            ev_id, ev_type, data = None, "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            ev_id = value
        elif name == "event":
            ev_type = value
        elif name == "data":
            data.append(value)


def _problem(e: urllib.error.HTTPError) -> APIError:
    try:
        body = json.load(e)
    except Exception:  # not problem+json: a proxy's page, say
        body = {}
    finally:
        e.close()
    if not isinstance(body, dict):
        body = {}
    ra = e.headers.get("Retry-After") if e.headers else None
    try:
        retry_after = float(ra) if ra else None
    except ValueError:
        retry_after = None
    return APIError(e.code, str(body.get("code") or f"HTTP_{e.code}"), str(body.get("title", "")),
                    str(body.get("detail", "")), body, retry_after)


def _who(who: Who) -> dict[str, Any]:
    return {"id": who} if isinstance(who, str) else dict(who)


def _call(c: CallSpec) -> dict[str, Any]:
    if isinstance(c, tuple):
        tool, args = c
        return {"tool": tool, "args": dict(args)}
    return dict(c)


def _seg(s: str) -> str:
    return urllib.parse.quote(s, safe="")
