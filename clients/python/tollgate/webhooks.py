"""Verifying Tollgate's outgoing webhooks (Standard Webhooks, docs/api.md "Webhooks")."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from typing import Any, Mapping, Optional, Union

from .errors import WebhookVerificationError

#: How far ``webhook-timestamp`` may be from now, in seconds.
TOLERANCE = 300


def verify_webhook(secret: str, headers: Mapping[str, str], body: Union[bytes, str], *,
                   tolerance: float = TOLERANCE, now: Optional[float] = None) -> dict[str, Any]:
    """Verifies a webhook request and returns its decoded body
    (``{"type", "timestamp", "data"}``).

    ``secret`` is the subscriber's ``whsec_…`` secret, ``headers`` the
    request's headers (any case), ``body`` its raw bytes as received.
    Raises :class:`WebhookVerificationError`: ``WEBHOOK_SIGNATURE_INVALID``
    when a header is missing or no ``v1`` signature matches,
    ``WEBHOOK_TIMESTAMP_INVALID`` when ``webhook-timestamp`` is more than
    ``tolerance`` seconds from ``now`` (a replay). Dedupe by
    ``webhook-id``: delivery is at least once.
    """
    h = {k.lower(): v for k, v in headers.items()}
    raw = body.encode() if isinstance(body, str) else bytes(body)
    msg_id, ts, sigs = h.get("webhook-id"), h.get("webhook-timestamp"), h.get("webhook-signature")
    if not msg_id or not ts or not sigs:
        raise WebhookVerificationError("WEBHOOK_SIGNATURE_INVALID", "missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        stamp = int(ts)
    except ValueError:
        raise WebhookVerificationError("WEBHOOK_TIMESTAMP_INVALID", f"webhook-timestamp {ts!r} is not Unix seconds") from None
    if abs((time.time() if now is None else now) - stamp) > tolerance:
        raise WebhookVerificationError("WEBHOOK_TIMESTAMP_INVALID", f"webhook-timestamp {stamp} is more than {tolerance:g}s from now")
    try:
        key = base64.b64decode(secret[len("whsec_"):] if secret.startswith("whsec_") else secret, validate=True)
    except binascii.Error:
        raise WebhookVerificationError("WEBHOOK_SIGNATURE_INVALID", "the secret is not whsec_ + base64") from None
    mac = hmac.new(key, f"{msg_id}.{stamp}.".encode() + raw, hashlib.sha256).digest()
    want = base64.b64encode(mac).decode()
    if not any(hmac.compare_digest(s[3:], want) for s in sigs.split(" ") if s.startswith("v1,")):
        raise WebhookVerificationError("WEBHOOK_SIGNATURE_INVALID", "no v1 signature matches")
    try:
        return json.loads(raw)
    except ValueError:
        raise WebhookVerificationError("WEBHOOK_SIGNATURE_INVALID", "the signed body is not JSON") from None
