"""Tollgate's Python client: the HTTP API of docs/api.md, standard library only.

    import tollgate
    tg = tollgate.Client(session_id="demo", sender="alice")   # $TOLLGATE_URL, $TOLLGATE_KEY
    turn = tg.submit([("write_file", {"path": "hello.txt", "content": "hi"})])
    print(tg.wait(turn.turn_id).calls[0].result)
"""

from .client import DEFAULT_URL, Client
from .errors import (APIError, DecisionPending, NotApproved, TollgateError, UnavailableError,
                     WebhookVerificationError)
from .gated import gated
from .types import Approval, ApprovalPage, Call, Decision, DecisionInfo, Event, Result, Submitted, Turn
from .webhooks import verify_webhook

__all__ = [
    "Client", "DEFAULT_URL", "gated", "verify_webhook",
    "Approval", "ApprovalPage", "Call", "Decision", "DecisionInfo", "Event", "Result", "Submitted", "Turn",
    "TollgateError", "APIError", "UnavailableError", "NotApproved", "DecisionPending", "WebhookVerificationError",
]
__version__ = "0.1.0"
