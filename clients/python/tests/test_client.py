"""The Python client against a real `tollgate dev` (tests/devserver.py)."""

from __future__ import annotations

import http.server
import queue
import socket
import sys
import threading
import time
import unittest
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tollgate  # noqa: E402
from tollgate import APIError, Client, DecisionPending, NotApproved, TollgateError, UnavailableError  # noqa: E402

from tests.devserver import DevServer, eventually, free_port  # noqa: E402

# echo and write_file need a person's approval; schedule_followup is denied by policy.
POLICY = {
    "version": "clients-test",
    "default_approval": "required",
    "tools": {
        "echo": {"approval": "required"},
        "write_file": {"approval": "required"},
        "schedule_followup": {"approval": "deny"},
    },
    "default_transport": {"trust_boundary": "external", "interactive": True},
}
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

dev: DevServer
received: "queue.Queue[tuple[dict, bytes]]" = queue.Queue()
receiver: http.server.ThreadingHTTPServer


class _Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        received.put(({k: v for k, v in self.headers.items()}, body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def setUpModule() -> None:
    global dev, receiver
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    webhooks = {"retry": {"attempts": 3, "base": "100ms", "max": "1s"}, "subscribers": [{
        "id": "pyclient", "url": f"http://127.0.0.1:{receiver.server_address[1]}/hook",
        "secret": SECRET, "sessions": ["webhook-session"], "events": ["approval.requested"]}]}
    dev = DevServer(policy=POLICY, webhooks=webhooks)


def tearDownModule() -> None:
    dev.stop()
    receiver.shutdown()


def session() -> str:
    return "py-" + uuid.uuid4().hex[:12]


def client(**kw) -> Client:
    return Client(dev.url, dev.key, **kw)


class SubmitWaitDecide(unittest.TestCase):
    def test_a_gated_call_is_pending_until_approved_with_the_digest_then_runs(self):
        tg = client(session_id=session(), sender="alice")
        sub = tg.submit([("write_file", {"path": "py.txt", "content": "hi"})])
        self.assertIsInstance(sub, tollgate.Submitted)
        call = sub.calls[0]
        self.assertEqual((call.disposition, call.tool), ("pending", "write_file"))
        self.assertTrue(call.args_digest.startswith("sha256:"))
        self.assertEqual(call.arguments, {"path": "py.txt", "content": "hi"})

        listed = tg.approvals(session=sub.session_id)
        self.assertEqual([a.approval_id for a in listed], [call.approval_id])
        a = listed[0]
        self.assertIsInstance(a, tollgate.Approval)
        self.assertEqual((a.args_digest, a.requester, a.options), (call.args_digest, "gateway:alice", ["approve", "deny"]))
        self.assertEqual(tg.approval(a.approval_id).args, a.args)

        with self.assertRaises(APIError) as e:
            tg.approve(a, "alice", args_digest="sha256:" + "0" * 64)
        self.assertEqual((e.exception.status, e.exception.code), (409, "ARGS_DIGEST_MISMATCH"))
        with self.assertRaises(APIError) as e:
            tg.approve(a, "mallory")
        self.assertEqual((e.exception.status, e.exception.code), (403, "DECIDER_NOT_AUTHORIZED"))
        self.assertFalse(tg.turn(sub.turn_id).terminal, "a refused decision ran the call")

        d = tg.approve(a, "alice", note="looks right")
        self.assertIsInstance(d, tollgate.Decision)
        self.assertEqual((d.status, d.decision.principal, d.decision.option), ("approved", "gateway:alice", "approve"))

        done = tg.wait(sub.turn_id, timeout=20)
        self.assertTrue(done.terminal)
        self.assertEqual(done.state, "completed")
        r = done.calls[0].result
        self.assertIsInstance(r, tollgate.Result)
        self.assertEqual((r.status, r.output), ("ok", "wrote 2 bytes to py.txt"))
        self.assertEqual(done.calls[0].approval.decision.principal, "gateway:alice")
        self.assertEqual((dev.data / "sandbox" / "py.txt").read_text(), "hi")
        self.assertEqual(tg.approvals(session=sub.session_id), [])
        with self.assertRaises(APIError) as e:
            tg.deny(a, "alice")
        self.assertEqual(e.exception.code, "APPROVAL_ALREADY_DECIDED")

    def test_wait_returns_the_current_state_when_the_time_runs_out(self):
        tg = client(session_id=session(), sender="alice")
        sub = tg.submit([("echo", {"text": "later"})])
        t = tg.wait(sub.turn_id, timeout=0.3)
        self.assertFalse(t.terminal)
        self.assertEqual(t.calls[0].disposition, "pending")

    def test_the_same_idempotency_key_is_the_same_turn(self):
        tg = client(session_id=session(), sender="alice")
        k = "py-" + uuid.uuid4().hex
        first = tg.submit([("echo", {"text": "once"})], idempotency_key=k)
        again = tg.submit([("echo", {"text": "once"})], idempotency_key=k)
        self.assertEqual((first.duplicate, again.duplicate, again.turn_id), (False, True, first.turn_id))
        with self.assertRaises(APIError) as e:
            tg.submit([("echo", {"text": "other"})], idempotency_key=k)
        self.assertEqual((e.exception.status, e.exception.code), (409, "IDEMPOTENCY_KEY_REUSED"))


class Paging(unittest.TestCase):
    def test_approvals_come_page_by_page_each_once(self):
        tg = client(session_id=session(), sender="alice")
        sub = tg.submit([("write_file", {"path": f"page{i}.txt", "content": "x"}) for i in range(5)])
        want = sorted(c.approval_id for c in sub.calls)
        self.assertEqual(len(want), 5)

        first = tg.approvals_page(session=sub.session_id, limit=2)
        self.assertIsInstance(first, tollgate.ApprovalPage)
        self.assertEqual(len(first.approvals), 2)
        self.assertTrue(first.next_cursor)
        ids, cursor, pages = [a.approval_id for a in first.approvals], first.next_cursor, 1
        while cursor:
            page = tg.approvals_page(session=sub.session_id, limit=2, cursor=cursor)
            self.assertLessEqual(len(page.approvals), 2)
            ids += [a.approval_id for a in page.approvals]
            cursor, pages = page.next_cursor, pages + 1
        self.assertEqual(pages, 3)
        self.assertEqual(sorted(ids), want, "a duplicate or a gap")
        self.assertEqual([a.approval_id for a in tg.iter_approvals(session=sub.session_id, limit=2)], ids)
        self.assertEqual([a.approval_id for a in tg.approvals(session=sub.session_id)], ids)

        with self.assertRaises(APIError) as e:
            tg.approvals_page(session=sub.session_id, cursor="not-a-cursor")
        self.assertEqual((e.exception.status, e.exception.code), (400, "CURSOR_INVALID"))
        with self.assertRaises(APIError) as e:
            tg.approvals_page(status="all", session=sub.session_id, cursor=first.next_cursor)
        self.assertEqual((e.exception.status, e.exception.code), (400, "CURSOR_INVALID"))
        with self.assertRaises(APIError) as e:
            tg.approvals_page(limit=201)
        self.assertEqual((e.exception.status, e.exception.code), (400, "INVALID_INPUT"))


class Errors(unittest.TestCase):
    def test_refusals_carry_the_problems_code(self):
        with self.assertRaises(APIError) as e:
            Client(dev.url, "tg_000000000000_nope").approvals()
        self.assertEqual((e.exception.status, e.exception.code), (401, "UNAUTHENTICATED"))
        with self.assertRaises(APIError) as e:
            client().turn("t-00000000000000000000")
        self.assertEqual((e.exception.status, e.exception.code), (404, "TURN_NOT_FOUND"))
        with self.assertRaises(APIError) as e:
            client().submit([{"tool": "echo", "args": {"text": "x"}, "Tool": "echo"}], session_id=session(), sender="alice")
        self.assertEqual((e.exception.status, e.exception.code), (400, "INVALID_INPUT"))
        self.assertIn("Tool", e.exception.detail)
        self.assertIsInstance(e.exception, TollgateError)

    def test_an_unreachable_gateway_is_unavailable(self):
        with self.assertRaises(UnavailableError) as e:
            Client(f"http://127.0.0.1:{free_port()}", "tg_x_y").approvals()
        self.assertEqual(e.exception.code, "UNAVAILABLE")

    def test_a_digest_is_required_to_decide(self):
        with self.assertRaises(TollgateError) as e:
            client().approve("a-1", "alice")
        self.assertEqual(e.exception.code, "INVALID_INPUT")


def what(e: tollgate.Event) -> tuple:
    """An event as two reads of it agree on: an id is the stream's position
    after the event, so another read of the same event may carry another id."""
    return (e.type, e.data)


class Events(unittest.TestCase):
    def collect(self, it, n=None, timeout=20.0, until=None):
        """Reads it in a thread; fails if it has not ended (or given n
        events, or one of type until) in time."""
        out: list = []

        def run():
            for ev in it:
                out.append(ev)
                if (n is not None and len(out) == n) or ev.type == until:
                    it.close()
                    return
        th = threading.Thread(target=run, daemon=True)
        th.start()
        th.join(timeout)
        self.assertFalse(th.is_alive(), f"the event stream did not end; got {[(e.id, e.type) for e in out]}")
        return out

    def test_a_turns_events_resume_after_the_last_id_and_end_with_its_outcome(self):
        tg = client(session_id=session(), sender="alice")
        sub = tg.submit([("write_file", {"path": "ev.txt", "content": "x"})])
        first = self.collect(tg.events(sub.turn_id), n=1)
        self.assertEqual(first[0].type, "approval.requested")
        self.assertEqual(first[0].data["approval_id"], sub.calls[0].approval_id)
        tg.approve(sub.calls[0], "alice")
        # An id is an opaque cursor string, sent back as it came.
        self.assertIsInstance(first[0].id, str)
        rest = self.collect(tg.events(sub.turn_id, last_event_id=first[0].id))
        self.assertEqual(rest[-1].type, "turn.outcome")
        self.assertEqual(rest[-1].data["turn_id"], sub.turn_id)
        self.assertIn("approval.decided", [e.type for e in rest])
        self.assertTrue(all(isinstance(e.id, str) for e in rest))
        self.assertNotIn("approval.requested", [e.type for e in rest], "an event came twice")
        whole = self.collect(tg.events(sub.turn_id))
        self.assertEqual([what(e) for e in whole], [what(e) for e in first + rest], "resuming missed or repeated an event")

    def test_a_stream_cut_off_is_resumed_with_last_event_id(self):
        proxy = CuttingProxy(int(dev.url.rsplit(":", 1)[1]))
        tg = Client(f"http://127.0.0.1:{proxy.port}", dev.key, session_id=session(), sender="alice")
        sub = tg.submit([("write_file", {"path": "cut.txt", "content": "x"}), ("echo", {"text": "y"})])
        for c in sub.calls:
            tg.approve(c, "alice")
        proxy.cut = True  # the next stream is cut after its first event
        got = self.collect(tg.events(sub.turn_id))
        whole = self.collect(client().events(sub.turn_id))
        self.assertEqual([what(e) for e in got], [what(e) for e in whole])
        self.assertEqual(got[-1].type, "turn.outcome")
        self.assertEqual(proxy.last_event_ids, [None, got[0].id], "the reconnect did not send Last-Event-ID")

    def test_session_events_resume_and_follow_the_sessions_turns(self):
        s = session()
        tg = client(session_id=s, sender="alice")
        # An id is an opaque cursor: the test resumes only after ids the
        # gateway sent, never after one computed from them. A session's turns
        # run one after another: the first ends (denied) before the second is
        # submitted.
        before = tg.submit([("echo", {"text": "before"})])
        tg.deny(before.calls[0], "alice")
        earlier = self.collect(tg.events(before.turn_id))[-1]
        self.assertEqual(earlier.type, "turn.outcome")
        sub = tg.submit([("echo", {"text": "s"})])
        it = tg.session_events(s, last_event_id=earlier.id)
        requested = self.collect(it, n=1)[0]  # closes it
        self.assertIsInstance(requested.id, str)
        self.assertEqual((requested.type, requested.data["turn_id"], requested.data["approval_id"]),
                         ("approval.requested", sub.turn_id, sub.calls[0].approval_id))
        it = tg.session_events(s, last_event_id=requested.id)
        tg.approve(sub.calls[0], "alice")
        after = self.collect(it, until="turn.outcome")
        self.assertIn("approval.decided", [e.type for e in after])
        self.assertEqual({e.data["turn_id"] for e in after}, {sub.turn_id})
        self.assertNotIn("approval.requested", [e.type for e in after], "an event came twice")

    def test_an_event_id_is_an_opaque_string_sent_back_verbatim_to_resume(self):
        # A fake gateway: each connection to a stream sends the event after
        # Last-Event-ID and is then cut off; the client must reconnect with
        # exactly the id it saw. "5" is an id of an earlier version (a bare
        # decimal), which must come and go back as the string "5"; the dotted
        # ids are cursors of this version.
        ids = ["5", "5.1.0.0.2", "5.1.0.0.10", "6.1.0.0.10"]
        seen: list = []

        class Fake(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the response ends when the connection closes

            def do_GET(self) -> None:  # noqa: N802
                last = self.headers.get("Last-Event-ID")
                seen.append(last)
                if last is not None and last not in ids[:-1]:
                    self.send_error(400)
                    return
                i = 0 if last is None else ids.index(last) + 1
                kind = "turn.outcome" if i == len(ids) - 1 else "approval.requested"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.wfile.write(f': tollgate events\n\nid: {ids[i]}\nevent: {kind}\ndata: {{"turn_id":"t-1","n":{i}}}\n\n'.encode())

            def log_message(self, *args) -> None:
                pass

        fake = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fake)
        threading.Thread(target=fake.serve_forever, daemon=True).start()
        try:
            tg = Client(f"http://127.0.0.1:{fake.server_address[1]}", "tg_x_y")
            got = self.collect(tg.events("t-1"))
            self.assertEqual([(e.id, e.type, e.data["n"]) for e in got], [
                ("5", "approval.requested", 0), ("5.1.0.0.2", "approval.requested", 1),
                ("5.1.0.0.10", "approval.requested", 2), ("6.1.0.0.10", "turn.outcome", 3)])
            self.assertEqual(seen, [None, "5", "5.1.0.0.2", "5.1.0.0.10"])
            # last_event_id goes out exactly as given (a dotted cursor), or
            # as str() of an int from a caller of an earlier version.
            seen.clear()
            self.assertEqual([e.id for e in self.collect(tg.events("t-1", last_event_id="5.1.0.0.2"))],
                             ["5.1.0.0.10", "6.1.0.0.10"])
            self.assertEqual(seen, ["5.1.0.0.2", "5.1.0.0.10"])
            seen.clear()
            ev = self.collect(tg.session_events("s", last_event_id="5.1.0.0.10"), n=1)[0]
            self.assertEqual(ev, tollgate.Event(id="6.1.0.0.10", type="turn.outcome", data={"turn_id": "t-1", "n": 3}))
            self.assertEqual(seen, ["5.1.0.0.10"])
            seen.clear()
            self.assertEqual(self.collect(tg.events("t-1", last_event_id=5), n=1)[0].id, "5.1.0.0.2")
            self.assertEqual(seen, ["5"])
            self.assertEqual(tollgate.Event(id=5, type="x", data={}).id, "5")
        finally:
            fake.shutdown()
            fake.server_close()


class CuttingProxy:
    """A loopback TCP proxy that records each request's Last-Event-ID and,
    once `cut` is set, ends the next response after its first SSE event."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.cut = False
        self.last_event_ids: list = []
        self.ln = socket.create_server(("127.0.0.1", 0))
        self.port = self.ln.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            conn, _ = self.ln.accept()
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        up = socket.create_connection(("127.0.0.1", self.upstream))
        req = b""
        while b"\r\n\r\n" not in req:
            req += conn.recv(65536)
        head = req.split(b"\r\n\r\n", 1)[0].decode()
        if " /v1/turns/" in head.split("\r\n", 1)[0] and head.split("\r\n", 1)[0].split(" ")[1].endswith("/events"):
            lei = [line.split(":", 1)[1].strip() for line in head.split("\r\n") if line.lower().startswith("last-event-id:")]
            self.last_event_ids.append(lei[0] if lei else None)
        cut, self.cut = self.cut, False
        up.sendall(req)
        threading.Thread(target=pump, args=(conn, up), daemon=True).start()
        seen = b""
        try:
            while True:
                b = up.recv(65536)
                if not b:
                    break
                if cut:
                    seen += b
                    i = seen.find(b"\nid: ")
                    j = seen.find(b"\n\n", i) if i >= 0 else -1
                    if j >= 0:
                        conn.sendall(b[: len(b) - (len(seen) - (j + 2))])
                        break
                conn.sendall(b)
        except OSError:
            pass
        finally:
            for s in (conn, up):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            b = src.recv(65536)
            if not b:
                break
            dst.sendall(b)
    except OSError:
        pass


class Gated(unittest.TestCase):
    def test_the_function_runs_only_once_a_person_approved_and_with_the_approved_arguments(self):
        s = session()
        tg = client(session_id=s, sender="alice")
        ran: list = []

        @tg.gated("echo")
        def shout(text: str) -> str:
            ran.append(text)
            return text.upper()

        self.assertEqual(shout.tollgate_tool, "echo")
        box: list = []
        th = threading.Thread(target=lambda: box.append(shout("hi")), daemon=True)
        th.start()
        a = eventually("the gated call's approval", lambda: tg.approvals(session=s))[0]
        self.assertEqual((a.tool, a.arguments), ("echo", {"text": "hi"}))
        self.assertEqual(ran, [], "the function ran before anyone approved it")
        tg.approve(a, "alice")
        th.join(20)
        self.assertEqual((box, ran), (["HI"], ["hi"]))

    def test_a_denied_call_does_not_run_and_raises_the_code(self):
        s = session()
        tg = client(session_id=s, sender="alice")
        ran: list = []

        @tollgate.gated("echo", client=tg)
        def shout(text):
            ran.append(text)

        box: list = []

        def call():
            try:
                shout(text="no")
            except Exception as e:  # noqa: BLE001
                box.append(e)
        th = threading.Thread(target=call, daemon=True)
        th.start()
        tg.deny(eventually("the approval", lambda: tg.approvals(session=s))[0], "alice")
        th.join(20)
        self.assertEqual(ran, [])
        self.assertIsInstance(box[0], NotApproved)
        self.assertEqual(box[0].code, "APPROVAL_DENIED")
        self.assertEqual(box[0].call.result.status, "denied")

    def test_policy_denials_and_unknown_tools_raise_at_once_without_running(self):
        tg = client(session_id=session(), sender="alice")
        ran: list = []

        @tg.gated("schedule_followup")
        def later(tool, args):
            ran.append(tool)

        @tg.gated("no_such_tool")
        def nothing(x=1):
            ran.append(x)

        with self.assertRaises(NotApproved) as e:
            later("echo", {"text": "x"})
        self.assertEqual(e.exception.code, "POLICY_DENIED")
        with self.assertRaises(NotApproved) as e:
            nothing()
        self.assertEqual(e.exception.code, "TOOL_NOT_FOUND")
        self.assertEqual(ran, [])

    def test_no_outcome_within_the_wait_is_decision_pending(self):
        s = session()
        tg = client(session_id=s, sender="alice")

        @tg.gated("echo", timeout=0.5)
        def shout(text):
            raise AssertionError("ran without a decision")

        with self.assertRaises(DecisionPending) as e:
            shout("wait")
        self.assertEqual(e.exception.code, "DECISION_PENDING")
        self.assertEqual(e.exception.approval_id, tg.approvals(session=s)[0].approval_id)

    def test_parameters_without_names_are_refused(self):
        with self.assertRaises(TypeError):
            @tollgate.gated("echo")
            def f(*args):
                pass


class Webhooks(unittest.TestCase):
    def test_a_delivered_webhook_verifies_and_a_tampered_or_replayed_one_does_not(self):
        tg = client(session_id="webhook-session", sender="alice")
        sub = tg.submit([("echo", {"text": "hook"})])
        got, body = received.get(timeout=20)
        headers = {k.lower(): v for k, v in got.items()}
        payload = tollgate.verify_webhook(SECRET, headers, body)
        self.assertEqual(payload["type"], "approval.requested")
        self.assertEqual(payload["data"]["turn_id"], sub.turn_id)

        with self.assertRaises(tollgate.WebhookVerificationError) as e:
            tollgate.verify_webhook(SECRET, headers, body.replace(b"hook", b"hack"))
        self.assertEqual(e.exception.code, "WEBHOOK_SIGNATURE_INVALID")
        with self.assertRaises(tollgate.WebhookVerificationError) as e:
            tollgate.verify_webhook("whsec_" + "A" * 32, headers, body)
        self.assertEqual(e.exception.code, "WEBHOOK_SIGNATURE_INVALID")
        with self.assertRaises(tollgate.WebhookVerificationError) as e:
            tollgate.verify_webhook(SECRET, headers, body, now=int(headers["webhook-timestamp"]) + 301)
        self.assertEqual(e.exception.code, "WEBHOOK_TIMESTAMP_INVALID")
        lower = dict(headers)
        del lower["webhook-signature"]
        with self.assertRaises(tollgate.WebhookVerificationError):
            tollgate.verify_webhook(SECRET, lower, body)


if __name__ == "__main__":
    unittest.main()
