"""The plain-loop example against a real `tollgate dev` and a scripted
OpenAI-compatible endpoint: the model's write_file call waits for alice's
decision, runs once approved (its result goes back to the model), and does
not run when denied."""

from __future__ import annotations

import http.server
import json
import sys
import threading
import unittest
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "clients" / "python"))
sys.path.insert(0, str(HERE))

import tollgate  # noqa: E402
from agent import run_agent  # noqa: E402
from tests.devserver import DevServer, eventually  # noqa: E402

requests: list = []


class ScriptedModel(http.server.BaseHTTPRequestHandler):
    """Asks for write_file first, then answers with what the tool said."""

    def do_POST(self) -> None:  # noqa: N802
        r = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        requests.append((self.path, r))
        last = r["messages"][-1]
        if last["role"] == "tool":
            msg = {"role": "assistant", "content": "The tool said: " + last["content"]}
        else:
            path = "denied.txt" if "deny" in last["content"] else "note.txt"
            msg = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "write_file", "arguments": json.dumps({"path": path, "content": "buy milk"})}}]}
        body = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "model": r["model"],
                           "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def setUpModule() -> None:
    global dev, model
    dev = DevServer()  # the built-in policy: write_file needs an approval
    model = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ScriptedModel)
    threading.Thread(target=model.serve_forever, daemon=True).start()


def tearDownModule() -> None:
    dev.stop()
    model.shutdown()


class AgentLoop(unittest.TestCase):
    def turn(self, prompt: str, option: str) -> tuple[str, tollgate.Approval]:
        session = "agent-" + uuid.uuid4().hex[:8]
        tg = tollgate.Client(dev.url, dev.key, session_id=session, sender="alice")
        logs: list = []
        box: list = []
        th = threading.Thread(target=lambda: box.append(run_agent(
            prompt, tg, f"http://127.0.0.1:{model.server_address[1]}/v1", "scripted", log=logs.append)), daemon=True)
        th.start()
        a = eventually("the write_file approval", lambda: tg.approvals(session=session))[0]
        self.assertEqual((a.tool, a.arguments["content"]), ("write_file", "buy milk"))
        # The agent logs after its submit's answer came back, which can be
        # after the approval is listed: wait for the line, then compare.
        eventually("the agent's pending line", lambda: logs)
        self.assertEqual(logs, [f"write_file waits for a decision: tollgate approve {a.approval_id}"])
        tg.decide(a, option, "alice")
        th.join(20)
        self.assertTrue(box, "the agent gave no answer")
        return box[0], a

    def test_write_file_runs_once_alice_approves_and_the_model_gets_its_result(self):
        out, _ = self.turn("save a note saying buy milk", "approve")
        self.assertEqual(out, "The tool said: wrote 8 bytes to note.txt")
        self.assertEqual((dev.data / "sandbox" / "note.txt").read_text(), "buy milk")
        self.assertEqual({p for p, _ in requests}, {"/v1/chat/completions"})

    def test_a_denied_write_file_does_not_run_and_the_model_is_told_why(self):
        out, _ = self.turn("save a note, deny it", "deny")
        self.assertTrue(out.startswith("The tool said: not done: APPROVAL_DENIED: "), out)
        self.assertFalse((dev.data / "sandbox" / "denied.txt").exists())


if __name__ == "__main__":
    unittest.main()
