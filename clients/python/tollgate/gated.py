"""The ``gated`` decorator: a function that runs only on the approved outcome."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Mapping, Optional, TypeVar

from .client import Client, Who

F = TypeVar("F", bound=Callable[..., Any])


def gated(tool: str, *, client: Optional[Client] = None, session_id: Optional[str] = None,
          sender: Optional[Who] = None, channel: Optional[Mapping[str, Any]] = None,
          timeout: float = 3600.0) -> Callable[[F], F]:
    """Puts a function behind Tollgate.

    Each call of the decorated function is sent to Tollgate as one call of
    ``tool`` whose arguments are the function's arguments by name (JSON
    values), and waits for its outcome (:meth:`Client.gate`). The function
    runs only on the approved outcome, the call's result ``ok``: Tollgate
    let it through (policy ``never``, a standing grant, or a person's
    approval of exactly these arguments) and ran ``tool``. It then runs
    with the arguments as Tollgate recorded and the decider saw them (the
    canonical JSON the digest covers, decoded), and its return value is
    returned. Otherwise it does not run: :class:`NotApproved` is raised
    with the result's code (``APPROVAL_DENIED``, ``POLICY_DENIED``,
    ``APPROVAL_EXPIRED``, ``TOOL_NOT_FOUND``, ``ARGS_INVALID``, ...), or
    :class:`DecisionPending` when no outcome came within ``timeout``
    seconds.

    ``tool`` must be a tool Tollgate knows (``tollgate tools``) whose
    policy rule is the one to apply: a gate whose own run does nothing
    (a NATS tool service endpoint that only answers, docs/tools.md), or
    a tool whose run is the first half of the work. ``client`` defaults to
    ``Client()`` (``$TOLLGATE_URL``, ``$TOLLGATE_KEY``); ``session_id``
    and ``sender`` to the client's.
    """

    def wrap(fn: F) -> F:
        sig = inspect.signature(fn)
        for p in sig.parameters.values():
            if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL):
                raise TypeError(f"gated({tool!r}): {fn.__name__} has a parameter without a name ({p}): "
                                "the call's arguments are a JSON object by name")

        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            call_args: dict[str, Any] = {}
            for name, value in bound.arguments.items():
                if sig.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                    call_args.update(value)
                else:
                    call_args[name] = value
            c = client or Client()
            call = c.gate(tool, call_args, session_id=session_id, sender=sender, channel=channel, timeout=timeout)
            return fn(**call.arguments)

        inner.tollgate_tool = tool  # type: ignore[attr-defined]
        return inner  # type: ignore[return-value]

    return wrap
