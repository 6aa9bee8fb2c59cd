"""A plain agent loop over an OpenAI-compatible chat-completions endpoint,
standard library only, whose write_file tool runs behind Tollgate: the
model proposes the call, Tollgate asks a person (the built-in policy wants
an approval for write_file), runs it once approved, and the result goes
back to the model; a denied call sends its reason code instead.

    export TOLLGATE_KEY=$(cat .tollgate/gateway-dev-key)        # tollgate dev running
    PYTHONPATH=clients/python OPENAI_BASE_URL=http://127.0.0.1:11434/v1 OPENAI_MODEL=qwen2.5:7b \\
        python3 examples/agent-python/agent.py "save a note saying buy milk"
    tollgate approve a-…   # in another terminal, as the session's sender
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from typing import Any, Callable

import tollgate

TOOLS = [{
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write a text file (path relative to the sandbox). A person approves each call.",
        "parameters": {"type": "object", "required": ["path", "content"], "additionalProperties": False,
                       "properties": {"path": {"type": "string"}, "content": {"type": "string"}}},
    },
}]


def chat(base_url: str, api_key: str, model: str, messages: list[dict]) -> dict:
    """One chat-completions request; returns the assistant's message."""
    req = urllib.request.Request(base_url.rstrip("/") + "/chat/completions", method="POST",
                                 data=json.dumps({"model": model, "messages": messages, "tools": TOOLS}).encode(),
                                 headers={"Authorization": "Bearer " + api_key, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)["choices"][0]["message"]


def run_tool(tg: tollgate.Client, name: str, arguments: str, log: Callable[[str], None]) -> str:
    """Runs the model's tool call through Tollgate; the text goes back to the model."""
    def pending(sub: tollgate.Submitted) -> None:
        c = sub.calls[0]
        if c.disposition == "pending":
            log(f"{name} waits for a decision: tollgate approve {c.approval_id}")
    try:
        call = tg.gate(name, json.loads(arguments), on_submitted=pending)
    except (tollgate.NotApproved, tollgate.DecisionPending) as e:
        return f"not done: {e}"  # the model learns why nothing happened
    return call.result.output or ""


def run_agent(prompt: str, tg: tollgate.Client, base_url: str, model: str, api_key: str = "unused",
              max_steps: int = 8, log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> str:
    """The loop: ask the model; run each tool call it makes through
    Tollgate and give it the results; stop at its first answer without
    tool calls, and return that answer."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You help the user. To save a note, call write_file."},
        {"role": "user", "content": prompt},
    ]
    for _ in range(max_steps):
        msg = chat(base_url, api_key, model, messages)
        messages.append(msg)
        calls = msg.get("tool_calls") or []
        if not calls:
            return msg.get("content") or ""
        for c in calls:
            out = run_tool(tg, c["function"]["name"], c["function"]["arguments"], log)
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": out})
    raise RuntimeError(f"no answer after {max_steps} model steps")


if __name__ == "__main__":
    print(run_agent(
        " ".join(sys.argv[1:]) or "save a note saying buy milk",
        tollgate.Client(session_id=os.environ.get("TOLLGATE_SESSION", "agent-demo"),
                        sender=os.environ.get("TOLLGATE_SENDER", "alice")),
        base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1"),
        model=os.environ.get("OPENAI_MODEL", "qwen2.5:7b"),
        api_key=os.environ.get("OPENAI_API_KEY", "unused"),
    ))
