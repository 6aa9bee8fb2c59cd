// The TypeScript client against a real `tollgate dev` (test/devserver.js).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer as createHTTPServer } from "node:http";
import { createServer as createTCPServer, connect } from "node:net";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { randomUUID } from "node:crypto";

import { Client, APIError, NotApproved, DecisionPending, UnavailableError, TollgateError, WebhookVerificationError, verifyWebhook } from "../src/index.js";
import { startDev, eventually, freePort } from "./devserver.js";

// echo and write_file need a person's approval; schedule_followup is denied by policy.
const POLICY = {
  version: "clients-test",
  default_approval: "required",
  tools: {
    echo: { approval: "required" },
    write_file: { approval: "required" },
    schedule_followup: { approval: "deny" },
  },
  default_transport: { trust_boundary: "external", interactive: true },
};
const SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

let dev, receiver;
const received = [];

before(async () => {
  receiver = createHTTPServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      received.push({ headers: req.headers, body: Buffer.concat(chunks) });
      res.writeHead(204).end();
    });
  });
  await new Promise((r) => receiver.listen(0, "127.0.0.1", r));
  dev = await startDev({
    policy: POLICY,
    webhooks: {
      retry: { attempts: 3, base: "100ms", max: "1s" },
      subscribers: [{ id: "tsclient", url: `http://127.0.0.1:${receiver.address().port}/hook`, secret: SECRET,
        sessions: ["webhook-session"], events: ["approval.requested"] }],
    },
  });
});

after(async () => {
  await dev?.stop();
  receiver?.close();
});

const session = () => "ts-" + randomUUID().slice(0, 12);
const client = (opts = {}) => new Client({ url: dev.url, key: dev.key, ...opts });

async function rejectsWith(p, code, status) {
  const e = await p.then(() => assert.fail(`resolved; want ${code}`), (e) => e);
  assert.ok(e instanceof TollgateError, `${e}`);
  assert.equal(e.code, code, e.message);
  if (status !== undefined) assert.equal(e.status, status);
  return e;
}

/** An event as two reads of it agree on: an id is the stream's position
 *  after the event, so another read of the same event may carry another id. */
const what = (e) => JSON.stringify([e.type, e.data]);

/** Reads an event iterator until it ends, n events, or one of type until; fails if that takes too long. */
async function collect(it, { n, until, timeoutMs = 20_000 } = {}) {
  const out = [];
  const read = (async () => {
    for await (const ev of it) {
      out.push(ev);
      if (out.length === n || ev.type === until) break;
    }
  })();
  let timer;
  const late = new Promise((_, rej) => { timer = setTimeout(() => rej(new Error(`the event stream did not end; got ${JSON.stringify(out.map((e) => [e.id, e.type]))}`)), timeoutMs); });
  try {
    await Promise.race([read, late]);
  } finally {
    clearTimeout(timer);
  }
  return out;
}

test("a gated call is pending until approved with the digest, then runs", async () => {
  const tg = client({ sessionId: session(), sender: "alice" });
  const sub = await tg.submit([["write_file", { path: "ts.txt", content: "hi" }]]);
  const call = sub.calls[0];
  assert.equal(call.disposition, "pending");
  assert.match(call.args_digest, /^sha256:/);
  const listed = await tg.approvals({ session: sub.session_id });
  assert.deepEqual(listed.map((a) => a.approval_id), [call.approval_id]);
  const a = listed[0];
  assert.equal(a.args_digest, call.args_digest);
  assert.equal(a.requester, "gateway:alice");
  assert.equal((await tg.approval(a.approval_id)).args, a.args);

  await rejectsWith(tg.approve(a, "alice", { argsDigest: "sha256:" + "0".repeat(64) }), "ARGS_DIGEST_MISMATCH", 409);
  await rejectsWith(tg.approve(a, "mallory"), "DECIDER_NOT_AUTHORIZED", 403);
  assert.equal((await tg.turn(sub.turn_id)).terminal, false, "a refused decision ran the call");

  const d = await tg.approve(a, "alice", { note: "looks right" });
  assert.equal(d.status, "approved");
  assert.equal(d.decision.principal, "gateway:alice");
  const done = await tg.wait(sub.turn_id, { timeoutMs: 20_000 });
  assert.equal(done.terminal, true);
  assert.equal(done.state, "completed");
  assert.deepEqual([done.calls[0].result.status, done.calls[0].result.output], ["ok", "wrote 2 bytes to ts.txt"]);
  assert.equal(readFileSync(join(dev.data, "sandbox", "ts.txt"), "utf8"), "hi");
  await rejectsWith(tg.deny(a, "alice"), "APPROVAL_ALREADY_DECIDED", 409);
});

test("wait returns the current state when its time runs out", async () => {
  const tg = client({ sessionId: session(), sender: "alice" });
  const sub = await tg.submit([["echo", { text: "later" }]]);
  const t = await tg.wait(sub.turn_id, { timeoutMs: 300 });
  assert.equal(t.terminal, false);
  assert.equal(t.calls[0].disposition, "pending");
});

test("the same Idempotency-Key is the same turn", async () => {
  const tg = client({ sessionId: session(), sender: "alice" });
  const idempotencyKey = "ts-" + randomUUID();
  const first = await tg.submit([["echo", { text: "once" }]], { idempotencyKey });
  const again = await tg.submit([["echo", { text: "once" }]], { idempotencyKey });
  assert.deepEqual([first.duplicate, again.duplicate, again.turn_id], [false, true, first.turn_id]);
  await rejectsWith(tg.submit([["echo", { text: "other" }]], { idempotencyKey }), "IDEMPOTENCY_KEY_REUSED", 409);
});

test("approvals come page by page, each once", async () => {
  const tg = client({ sessionId: session(), sender: "alice" });
  const sub = await tg.submit([0, 1, 2, 3, 4].map((i) => ["write_file", { path: `page${i}.txt`, content: "x" }]));
  const want = sub.calls.map((c) => c.approval_id).sort();
  assert.equal(want.length, 5);
  const first = await tg.approvalsPage({ session: sub.session_id, limit: 2 });
  assert.equal(first.approvals.length, 2);
  assert.ok(first.next_cursor);
  const ids = first.approvals.map((a) => a.approval_id);
  let pages = 1;
  for (let cursor = first.next_cursor; cursor; pages++) {
    const page = await tg.approvalsPage({ session: sub.session_id, limit: 2, cursor });
    assert.ok(page.approvals.length <= 2);
    ids.push(...page.approvals.map((a) => a.approval_id));
    cursor = page.next_cursor;
  }
  assert.equal(pages, 3);
  assert.deepEqual([...ids].sort(), want, "a duplicate or a gap");
  const iterated = [];
  for await (const a of tg.iterApprovals({ session: sub.session_id, limit: 2 })) iterated.push(a.approval_id);
  assert.deepEqual(iterated, ids);
  assert.deepEqual((await tg.approvals({ session: sub.session_id })).map((a) => a.approval_id), ids);
  await rejectsWith(tg.approvalsPage({ session: sub.session_id, cursor: "not-a-cursor" }), "CURSOR_INVALID", 400);
  await rejectsWith(tg.approvalsPage({ status: "all", session: sub.session_id, cursor: first.next_cursor }), "CURSOR_INVALID", 400);
  await rejectsWith(tg.approvalsPage({ limit: 201 }), "INVALID_INPUT", 400);
});

test("refusals carry the problem's code", async () => {
  await rejectsWith(new Client({ url: dev.url, key: "tg_000000000000_nope" }).approvals(), "UNAUTHENTICATED", 401);
  await rejectsWith(client().turn("t-00000000000000000000"), "TURN_NOT_FOUND", 404);
  const e = await rejectsWith(client().submit([{ tool: "echo", args: { text: "x" }, Tool: "echo" }], { sessionId: session(), sender: "alice" }), "INVALID_INPUT", 400);
  assert.ok(e instanceof APIError);
  assert.match(e.detail, /Tool/);
  const u = await rejectsWith(new Client({ url: `http://127.0.0.1:${await freePort()}`, key: "tg_x_y" }).approvals(), "UNAVAILABLE");
  assert.ok(u instanceof UnavailableError);
  await rejectsWith(client().approve("a-1", "alice"), "INVALID_INPUT");
});

test("a turn's events resume after the last id and end with its outcome", async () => {
  const tg = client({ sessionId: session(), sender: "alice" });
  const sub = await tg.submit([["write_file", { path: "ev.txt", content: "x" }]]);
  const first = await collect(tg.events(sub.turn_id), { n: 1 });
  assert.equal(first[0].type, "approval.requested");
  assert.equal(first[0].data.approval_id, sub.calls[0].approval_id);
  await tg.approve(sub.calls[0], "alice");
  // An id is an opaque cursor string, sent back as it came.
  assert.equal(typeof first[0].id, "string");
  const rest = await collect(tg.events(sub.turn_id, { lastEventId: first[0].id }));
  assert.equal(rest.at(-1).type, "turn.outcome");
  assert.ok(rest.some((e) => e.type === "approval.decided"));
  assert.ok(rest.every((e) => typeof e.id === "string"));
  assert.ok(!rest.some((e) => e.type === "approval.requested"), "an event came twice");
  const whole = await collect(tg.events(sub.turn_id));
  assert.deepEqual(whole.map(what), [...first, ...rest].map(what), "resuming missed or repeated an event");
});

test("a stream cut off is resumed with Last-Event-ID", async () => {
  const proxy = await cuttingProxy(Number(new URL(dev.url).port));
  try {
    const tg = new Client({ url: `http://127.0.0.1:${proxy.port}`, key: dev.key, sessionId: session(), sender: "alice" });
    const sub = await tg.submit([["write_file", { path: "cut.txt", content: "x" }], ["echo", { text: "y" }]]);
    for (const c of sub.calls) await tg.approve(c, "alice");
    proxy.cut = true;
    const got = await collect(tg.events(sub.turn_id));
    const whole = await collect(client().events(sub.turn_id));
    assert.deepEqual(got.map(what), whole.map(what));
    assert.equal(got.at(-1).type, "turn.outcome");
    assert.deepEqual(proxy.lastEventIds, [null, got[0].id], "the reconnect did not send Last-Event-ID");
  } finally {
    proxy.close();
  }
});

test("session events resume and follow the session's turns", async () => {
  const s = session();
  const tg = client({ sessionId: s, sender: "alice" });
  // An id is an opaque cursor: the test resumes only after ids the gateway
  // sent, never after one computed from them. A session's turns run one
  // after another: the first ends (denied) before the second is submitted.
  const before = await tg.submit([["echo", { text: "before" }]]);
  await tg.deny(before.calls[0], "alice");
  const earlier = (await collect(tg.events(before.turn_id))).at(-1);
  assert.equal(earlier.type, "turn.outcome");
  const sub = await tg.submit([["echo", { text: "s" }]]);
  const [requested] = await collect(tg.sessionEvents(s, { lastEventId: earlier.id }), { n: 1 });
  assert.equal(typeof requested.id, "string");
  assert.deepEqual([requested.type, requested.data.turn_id, requested.data.approval_id],
    ["approval.requested", sub.turn_id, sub.calls[0].approval_id]);
  const it = tg.sessionEvents(s, { lastEventId: requested.id });
  await tg.approve(sub.calls[0], "alice");
  const later = await collect(it, { until: "turn.outcome" });
  assert.ok(later.some((e) => e.type === "approval.decided"));
  assert.ok(!later.some((e) => e.type === "approval.requested"), "an event came twice");
  assert.deepEqual([...new Set(later.map((e) => e.data.turn_id))], [sub.turn_id]);
});

test("an event id is an opaque string, sent back verbatim to resume", async () => {
  // A fake gateway: each connection to a stream sends the event after
  // Last-Event-ID and is then cut off; the client must reconnect with exactly
  // the id it saw. "5" is an id of an earlier version (a bare decimal), which
  // must come and go back as the string "5"; the dotted ids are cursors of
  // this version.
  const ids = ["5", "5.1.0.0.2", "5.1.0.0.10", "6.1.0.0.10"];
  const seen = [];
  const fake = createHTTPServer((req, res) => {
    const last = req.headers["last-event-id"] ?? null;
    seen.push(last);
    if (last !== null && !ids.slice(0, -1).includes(last)) return res.writeHead(400).end();
    const i = last === null ? 0 : ids.indexOf(last) + 1;
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    res.write(": tollgate events\n\n");
    const type = i === ids.length - 1 ? "turn.outcome" : "approval.requested";
    res.end(`id: ${ids[i]}\nevent: ${type}\ndata: {"turn_id":"t-1","n":${i}}\n\n`);
  });
  await new Promise((r) => fake.listen(0, "127.0.0.1", r));
  try {
    const tg = new Client({ url: `http://127.0.0.1:${fake.address().port}`, key: "tg_x_y" });
    const got = await collect(tg.events("t-1"));
    assert.deepEqual(got.map((e) => [e.id, e.type, e.data.n]),
      [["5", "approval.requested", 0], ["5.1.0.0.2", "approval.requested", 1],
        ["5.1.0.0.10", "approval.requested", 2], ["6.1.0.0.10", "turn.outcome", 3]]);
    assert.deepEqual(seen, [null, "5", "5.1.0.0.2", "5.1.0.0.10"]);
    // lastEventId goes out exactly as given, a dotted cursor or an old bare decimal.
    seen.length = 0;
    assert.deepEqual((await collect(tg.events("t-1", { lastEventId: "5.1.0.0.2" }))).map((e) => e.id), ["5.1.0.0.10", "6.1.0.0.10"]);
    assert.deepEqual(seen, ["5.1.0.0.2", "5.1.0.0.10"]);
    seen.length = 0;
    const [ev] = await collect(tg.sessionEvents("s", { lastEventId: "5.1.0.0.10" }), { n: 1 });
    assert.deepEqual(ev, { id: "6.1.0.0.10", type: "turn.outcome", data: { turn_id: "t-1", n: 3 } });
    assert.deepEqual(seen, ["5.1.0.0.10"]);
    seen.length = 0;
    assert.equal((await collect(tg.events("t-1", { lastEventId: "5" }), { n: 1 }))[0].id, "5.1.0.0.2");
    assert.deepEqual(seen, ["5"]);
  } finally {
    fake.close();
  }
});

test("gated: the function runs only once a person approved, with the approved arguments", async () => {
  const s = session();
  const tg = client({ sessionId: s, sender: "alice" });
  const ran = [];
  const shout = tg.gated("echo", ({ text }) => { ran.push(text); return text.toUpperCase(); });
  assert.equal(shout.tollgateTool, "echo");
  const result = shout({ text: "hi" });
  const [a] = await eventually("the gated call's approval", async () => { const l = await tg.approvals({ session: s }); return l.length ? l : null; });
  assert.deepEqual([a.tool, JSON.parse(a.args)], ["echo", { text: "hi" }]);
  assert.deepEqual(ran, [], "the function ran before anyone approved it");
  await tg.approve(a, "alice");
  assert.equal(await result, "HI");
  assert.deepEqual(ran, ["hi"]);
});

test("gated: a denied call does not run and rejects with the code", async () => {
  const s = session();
  const tg = client({ sessionId: s, sender: "alice" });
  const ran = [];
  // Handled from the start: the call can reject (its wait answered)
  // before deny's own answer comes back.
  const rejected = rejectsWith(tg.gated("echo", ({ text }) => ran.push(text))({ text: "no" }), "APPROVAL_DENIED");
  const [a] = await eventually("the approval", async () => { const l = await tg.approvals({ session: s }); return l.length ? l : null; });
  await tg.deny(a, "alice");
  const e = await rejected;
  assert.ok(e instanceof NotApproved);
  assert.equal(e.call.result.status, "denied");
  assert.deepEqual(ran, []);
});

test("gated: policy denials and unknown tools reject at once without running", async () => {
  const tg = client({ sessionId: session(), sender: "alice" });
  const ran = [];
  await rejectsWith(tg.gated("schedule_followup", (a) => ran.push(a))({ tool: "echo", args: { text: "x" } }), "POLICY_DENIED");
  await rejectsWith(tg.gated("no_such_tool", (a) => ran.push(a))({ x: 1 }), "TOOL_NOT_FOUND");
  assert.deepEqual(ran, []);
});

test("gated: no outcome within the wait is DECISION_PENDING", async () => {
  const s = session();
  const tg = client({ sessionId: s, sender: "alice" });
  const e = await rejectsWith(tg.gated("echo", () => assert.fail("ran without a decision"), { timeoutMs: 500 })({ text: "wait" }), "DECISION_PENDING");
  assert.ok(e instanceof DecisionPending);
  assert.equal(e.approvalId, (await tg.approvals({ session: s }))[0].approval_id);
});

test("a delivered webhook verifies, a tampered or replayed one does not", async () => {
  const tg = client({ sessionId: "webhook-session", sender: "alice" });
  const sub = await tg.submit([["echo", { text: "hook" }]]);
  const { headers, body } = await eventually("the webhook", () => received[0]);
  const payload = await verifyWebhook(SECRET, headers, body);
  assert.equal(payload.type, "approval.requested");
  assert.equal(payload.data.turn_id, sub.turn_id);
  const bad = async (p, code) => {
    const e = await p.then(() => assert.fail("verified"), (e) => e);
    assert.ok(e instanceof WebhookVerificationError);
    assert.equal(e.code, code);
  };
  await bad(verifyWebhook(SECRET, headers, Buffer.from(body.toString().replace("hook", "hack"))), "WEBHOOK_SIGNATURE_INVALID");
  await bad(verifyWebhook("whsec_" + "A".repeat(32), headers, body), "WEBHOOK_SIGNATURE_INVALID");
  await bad(verifyWebhook(SECRET, headers, body, { now: Number(headers["webhook-timestamp"]) + 301 }), "WEBHOOK_TIMESTAMP_INVALID");
  await bad(verifyWebhook(SECRET, { ...headers, "webhook-signature": undefined }, body), "WEBHOOK_SIGNATURE_INVALID");
  // Headers objects (fetch, browsers) work too.
  assert.equal((await verifyWebhook(SECRET, new Headers(headers), new Uint8Array(body))).type, "approval.requested");
});

/** A loopback TCP proxy that records each event stream's Last-Event-ID and,
 *  once `cut` is set, ends the next response after its first event. */
function cuttingProxy(upstream) {
  const p = { cut: false, lastEventIds: [] };
  const server = createTCPServer((conn) => {
    const up = connect(upstream, "127.0.0.1");
    // Requests on a kept-alive connection come one at a time; each starts with its request line.
    let seen = "", cut = false;
    conn.on("data", (b) => {
      const text = b.toString("latin1");
      const m = /^[A-Z]+ (\S+) HTTP\/1\.1\r\n/.exec(text);
      if (m && m[1].split("?")[0].endsWith("/events")) {
        const h = text.split("\r\n\r\n")[0].split("\r\n").find((l) => l.toLowerCase().startsWith("last-event-id:"));
        p.lastEventIds.push(h ? h.split(":")[1].trim() : null);
        cut = p.cut;
        p.cut = false;
      }
      up.write(b);
    });
    up.on("data", (b) => {
      if (!cut) return conn.write(b);
      seen += b.toString("latin1");
      const i = seen.indexOf("\nid: ");
      const j = i >= 0 ? seen.indexOf("\n\n", i) : -1;
      if (j < 0) return conn.write(b);
      conn.end(b.subarray(0, b.length - (seen.length - (j + 2))));
      up.destroy();
    });
    const close = () => { conn.destroy(); up.destroy(); };
    up.on("error", close); conn.on("error", close); up.on("end", () => conn.end()); conn.on("end", () => up.end());
  });
  return new Promise((r) => server.listen(0, "127.0.0.1", () => r(Object.assign(p, { port: server.address().port, close: () => server.close() }))));
}
