"""Typed results of the Tollgate HTTP API (docs/api.md; the wire names of
transport/gateway/openapi.json). Fields the server adds later are ignored,
so an older client keeps working against a newer gateway."""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class Result:
    """A call's result: ``status`` ok, error, denied, failed, expired,
    abandoned or needs_attention; ``code`` says why when it is not ok."""
    status: str
    finished_at: str = ""
    output: Optional[str] = None
    code: Optional[str] = None
    reason: Optional[str] = None


@dataclass(frozen=True)
class DecisionInfo:
    """Who decided (``principal``, ``transport:sender id``), with which option."""
    decision_id: str
    principal: str
    option: str
    decided_at: str = ""
    note: Optional[str] = None


@dataclass(frozen=True)
class Preview:
    """What a call would change, as of ``at`` (advisory: a decision binds
    ``args_digest``, never the preview). ``status`` ok, failed or
    timed_out; show ``text_visible`` and ``summary``, and say so when
    ``flagged``. A key without scope ``decide`` gets the summary only:
    ``redacted`` is true, there is no text nor reason, and ``added``,
    ``removed`` and ``lines`` give the counts."""
    status: str
    at: str = ""
    summary: str = ""
    text: str = ""
    text_visible: str = ""
    flagged: bool = False
    kind: Optional[str] = None
    reason: Optional[str] = None
    truncated: bool = False
    added: int = 0
    removed: int = 0
    lines: int = 0
    redacted: bool = False


@dataclass(frozen=True)
class Approval:
    """An approval. ``args`` is the canonical JSON the ``args_digest``
    covers; show a person ``args_visible`` and say so when ``args_flagged``."""
    approval_id: str
    turn_id: str
    call_id: str
    session_id: str
    transport: str
    requester: str
    tool: str
    args: str
    args_digest: str
    args_flagged: bool
    args_visible: str
    options: list[str]
    status: str
    requested_at: str = ""
    quorum: int = 1
    votes: list[DecisionInfo] = field(default_factory=list)
    expires_at: Optional[str] = None
    decision: Optional[DecisionInfo] = None
    preview: Optional[Preview] = None

    @property
    def arguments(self) -> Any:
        """``args`` decoded."""
        return json.loads(self.args)


@dataclass(frozen=True)
class Call:
    """One call of a turn and its ``disposition``: queued, pending, ran,
    denied, failed, expired, abandoned or needs_attention."""
    call_id: str
    index: int
    tool: str
    args: str
    args_digest: str
    disposition: str
    approval_id: Optional[str] = None
    approval: Optional[Approval] = None
    result: Optional[Result] = None

    @property
    def arguments(self) -> Any:
        """``args`` (the canonical JSON the digest covers) decoded."""
        return json.loads(self.args)

    @property
    def ok(self) -> bool:
        """The tool ran and its result is ``ok``."""
        return self.result is not None and self.result.status == "ok"


@dataclass(frozen=True)
class Turn:
    """A turn as ``GET /v1/turns/{id}`` reads it."""
    turn_id: str
    session_id: str
    transport: str
    state: str
    terminal: bool
    calls: list[Call] = field(default_factory=list)
    created_at: str = ""
    updated_at: str = ""
    code: Optional[str] = None
    reason: Optional[str] = None
    text: Optional[str] = None


@dataclass(frozen=True)
class Submitted:
    """The answer to a submit: the turn id and each call's disposition
    after the gateway's short wait for the executor."""
    turn_id: str
    message_id: str
    session_id: str
    transport: str
    duplicate: bool
    state: str
    calls: list[Call] = field(default_factory=list)


@dataclass(frozen=True)
class Decision:
    """The answer to a decision: ``status`` approved, denied, expired,
    abandoned, or submitted (stored, not applied yet: a quorum vote, or no
    verdict within the gateway's wait)."""
    decision_id: str
    approval_id: str
    status: str
    decision: Optional[DecisionInfo] = None


@dataclass(frozen=True)
class ApprovalPage:
    """One page of ``GET /v1/approvals``: its approvals, and the cursor of
    the next page (``None`` on the last one)."""
    approvals: list[Approval] = field(default_factory=list)
    next_cursor: Optional[str] = None


@dataclass(frozen=True)
class Event:
    """One Server-Sent Event: ``id`` its id, ``type`` its kind
    (``approval.requested``, ``turn.outcome``, ...), ``data`` its record.

    ``id`` is an opaque cursor string (dot-separated decimals such as
    ``"42.7.0.13.2"``; a gateway of an earlier version sends a bare decimal
    such as ``"42"``): keep the last one seen as it is and send it back as
    ``last_event_id`` to resume. Do not parse it, order events by it or
    compute with it. An int given for ``id`` (an id of an earlier version)
    is stored as ``str(id)``.

    ``batch.awaiting`` and ``redrive.started`` come only for turns of
    earlier versions (a turn of this version waits and starts in its turn's
    log, which the event streams do not carry): ``approval.requested`` says
    that a turn waits, :meth:`Client.wait` (a long poll of ``GET
    /v1/turns/{id}``), :meth:`Client.turn` or ``turn.outcome`` that it moved
    on. ``type`` is any string, so those kinds still decode."""
    id: str
    type: str
    data: dict[str, Any]

    def __post_init__(self) -> None:
        if isinstance(self.id, int) and not isinstance(self.id, bool):
            object.__setattr__(self, "id", str(self.id))


T = typing.TypeVar("T")


def decode(cls: type[T], data: Any) -> T:
    """Builds dataclass ``cls`` from a decoded JSON object, recursively;
    unknown keys are ignored."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__}: want a JSON object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls, vars(sys.modules[__name__]))
    kw = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kw[f.name] = _value(hints[f.name], data[f.name])
    return cls(**kw)


def _value(tp: Any, v: Any) -> Any:
    if v is None:
        return None
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
        origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp)
        return [_value(item, x) for x in v]
    if dataclasses.is_dataclass(tp):
        return decode(tp, v)  # type: ignore[arg-type]
    return v
