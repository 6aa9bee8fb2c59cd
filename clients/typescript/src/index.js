// Tollgate's TypeScript/JavaScript client: the HTTP API of docs/api.md.
// ESM, no runtime dependencies: fetch, ReadableStream, TextDecoder and
// WebCrypto, so it runs on Node 20+ and in browsers. Types: index.d.ts,
// generated from the gateway's openapi.json (openapi.d.ts).

export const DEFAULT_URL = "http://127.0.0.1:8080";
/** The longest long poll the gateway serves (GET /v1/turns/{id}?wait=), in ms. */
export const MAX_POLL_MS = 60_000;
/** How far webhook-timestamp may be from now, in seconds. */
export const WEBHOOK_TOLERANCE_SEC = 300;

const env = (name) => globalThis.process?.env?.[name];

/** An error with Tollgate's reason code (`code`). */
export class TollgateError extends Error {
  constructor(code, message = "") {
    super(message ? `${code}: ${message}` : code);
    this.name = "TollgateError";
    this.code = code;
  }
}

/** The gateway refused a request: its problem+json (RFC 9457) answer. */
export class APIError extends TollgateError {
  constructor(status, problem, retryAfter) {
    const code = typeof problem?.code === "string" && problem.code ? problem.code : `HTTP_${status}`;
    super(code, `${status} ${problem?.detail || problem?.title || ""}`.trim());
    this.name = "APIError";
    this.status = status;
    this.title = problem?.title ?? "";
    this.detail = problem?.detail ?? "";
    this.problem = problem ?? {};
    this.retryAfter = retryAfter;
  }
}

/** The gateway could not be reached, or the connection failed (code UNAVAILABLE). */
export class UnavailableError extends TollgateError {
  constructor(message, cause) {
    super("UNAVAILABLE", message);
    this.name = "UnavailableError";
    if (cause !== undefined) this.cause = cause;
  }
}

/** A gated call did not get the approved outcome: the function did not run. */
export class NotApproved extends TollgateError {
  constructor(code, message, call, turnId) {
    super(code, message);
    this.name = "NotApproved";
    this.call = call;
    this.turnId = turnId;
  }
}

/** No outcome came within the wait (code DECISION_PENDING); the turn goes on. */
export class DecisionPending extends TollgateError {
  constructor(turnId, approvalId = "") {
    super("DECISION_PENDING", `no outcome yet: waiting for ${approvalId ? "approval " + approvalId : "turn " + turnId}`);
    this.name = "DecisionPending";
    this.turnId = turnId;
    this.approvalId = approvalId;
  }
}

/** A webhook request failed verification (WEBHOOK_SIGNATURE_INVALID or WEBHOOK_TIMESTAMP_INVALID). */
export class WebhookVerificationError extends TollgateError {
  constructor(code, message) {
    super(code, message);
    this.name = "WebhookVerificationError";
  }
}

const sleep = (ms, signal) =>
  new Promise((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => { clearTimeout(t); reject(signal.reason); }, { once: true });
  });

const seg = (s) => encodeURIComponent(s);
const who = (w) => (typeof w === "string" ? { id: w } : { ...w });
const callSpec = (c) => (Array.isArray(c) ? { tool: c[0], args: c[1] } : { ...c });

/** A client of one gateway with one API key (see index.d.ts). */
export class Client {
  constructor(opts = {}) {
    this.url = (opts.url ?? env("TOLLGATE_URL") ?? DEFAULT_URL).replace(/\/+$/, "");
    this.key = opts.key ?? env("TOLLGATE_KEY") ?? "";
    if (!this.key) throw new TollgateError("UNAUTHENTICATED", "no API key: pass key or set TOLLGATE_KEY");
    this.sessionId = opts.sessionId;
    this.sender = opts.sender;
    this.retries = opts.retries ?? 3;
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.fetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
  }

  // -- turns ----------------------------------------------------------------

  async submit(calls, opts = {}) {
    const sessionId = opts.sessionId ?? this.sessionId;
    const sender = opts.sender ?? this.sender;
    if (!sessionId) throw new TollgateError("INVALID_INPUT", "sessionId is required (or set it on the Client)");
    if (!sender) throw new TollgateError("INVALID_INPUT", "sender is required (or set it on the Client)");
    const body = { session_id: sessionId, sender: who(sender) };
    if (opts.channel !== undefined) body.channel = opts.channel;
    if (opts.text !== undefined) body.text = opts.text;
    if (calls != null) body.calls = calls.map(callSpec);
    return this.#json("POST", "/v1/turns", body, idem(opts.idempotencyKey));
  }

  turn(turnId) {
    return this.#json("GET", `/v1/turns/${seg(turnId)}`);
  }

  async wait(turnId, opts = {}) {
    const deadline = Date.now() + (opts.timeoutMs ?? MAX_POLL_MS);
    for (;;) {
      const waitMs = Math.max(0, Math.min(deadline - Date.now(), MAX_POLL_MS));
      const t = await this.#json("GET", `/v1/turns/${seg(turnId)}?wait=${waitMs}ms`, undefined, {}, waitMs + this.timeoutMs, opts.signal);
      if (t.terminal || Date.now() >= deadline) return t;
    }
  }

  events(turnId, opts = {}) {
    return this.#stream(`/v1/turns/${seg(turnId)}/events`, opts, true);
  }

  sessionEvents(sessionId, opts = {}) {
    return this.#stream(`/v1/events?session=${seg(sessionId)}`, opts, false);
  }

  // -- approvals --------------------------------------------------------------

  // Every approval of the list, following next_cursor to the last page.
  async approvals(opts = {}) {
    const out = [];
    for await (const a of this.iterApprovals(opts)) out.push(a);
    return out;
  }

  // The approvals page by page (opts.limit a page, default 200), each once,
  // oldest request first.
  async *iterApprovals(opts = {}) {
    let cursor;
    do {
      const page = await this.approvalsPage({ ...opts, limit: opts.limit ?? 200, cursor });
      yield* page.approvals ?? [];
      cursor = page.next_cursor;
    } while (cursor);
  }

  // One page: opts.limit (1-200; the gateway's default 50) after opts.cursor
  // (the previous page's next_cursor, with the same status and session).
  approvalsPage(opts = {}) {
    const q = new URLSearchParams({ status: opts.status ?? "pending" });
    if (opts.session !== undefined) q.set("session", opts.session);
    if (opts.limit !== undefined) q.set("limit", String(opts.limit));
    if (opts.cursor !== undefined) q.set("cursor", opts.cursor);
    return this.#json("GET", `/v1/approvals?${q}`);
  }

  approval(approvalId) {
    return this.#json("GET", `/v1/approvals/${seg(approvalId)}`);
  }

  async decide(approval, option, decider, opts = {}) {
    let id, digest;
    if (typeof approval === "string") {
      id = approval;
    } else if ("approval_id" in approval && approval.approval_id) {
      id = approval.approval_id;
      digest = approval.args_digest;
    } else {
      throw new TollgateError("APPROVAL_NOT_FOUND", `call ${approval.call_id} has no approval`);
    }
    digest = opts.argsDigest ?? digest;
    if (!digest) throw new TollgateError("INVALID_INPUT", "argsDigest is required: the digest of the arguments the decider saw");
    const body = { option, args_digest: digest, decider: who(decider) };
    if (opts.note !== undefined) body.note = opts.note;
    if (opts.channel !== undefined) body.channel = opts.channel;
    return this.#json("POST", `/v1/approvals/${seg(id)}/decisions`, body, idem(opts.idempotencyKey));
  }

  approve(approval, decider, opts) {
    return this.decide(approval, "approve", decider, opts);
  }

  deny(approval, decider, opts) {
    return this.decide(approval, "deny", decider, opts);
  }

  // -- gating -------------------------------------------------------------------

  async gate(tool, args, opts = {}) {
    const sub = await this.submit([[tool, args]], opts);
    opts.onSubmitted?.(sub);
    let call = sub.calls[0];
    if (!call?.result) {
      const t = await this.wait(sub.turn_id, { timeoutMs: opts.timeoutMs ?? 3_600_000, signal: opts.signal });
      call = t.calls[0];
      if (!call?.result) throw new DecisionPending(sub.turn_id, call?.approval_id ?? "");
    }
    const r = call.result;
    if (r.status !== "ok") {
      throw new NotApproved(r.code || call.disposition.toUpperCase(),
        `${tool} did not get the approved outcome: ${r.status}${r.reason ? ": " + r.reason : ""}`, call, sub.turn_id);
    }
    return call;
  }

  gated(tool, fn, opts = {}) {
    const run = async (args) => {
      const call = await this.gate(tool, args, opts);
      return fn(JSON.parse(call.args), call);
    };
    run.tollgateTool = tool;
    return run;
  }

  // -- transport ------------------------------------------------------------------

  async #request(method, path, body, headers = {}, timeoutMs = this.timeoutMs, signal) {
    const h = { Authorization: `Bearer ${this.key}`, Accept: "application/json", ...headers };
    if (body !== undefined) h["Content-Type"] = "application/json";
    for (let attempt = 0; ; attempt++) {
      const ctl = new AbortController();
      const timer = timeoutMs > 0 ? setTimeout(() => ctl.abort(new Error(`no answer in ${timeoutMs} ms`)), timeoutMs) : undefined;
      const onAbort = () => ctl.abort(signal.reason);
      signal?.addEventListener("abort", onAbort, { once: true });
      let r;
      try {
        r = await this.fetch(this.url + path, {
          method, headers: h, body: body === undefined ? undefined : JSON.stringify(body), signal: ctl.signal,
        });
      } catch (e) {
        clearTimeout(timer);
        if (signal?.aborted) throw signal.reason;
        throw new UnavailableError(`${method} ${this.url}${path}: ${e?.cause?.message ?? e?.message ?? e}`, e);
      } finally {
        signal?.removeEventListener("abort", onAbort);
      }
      if (r.ok) return { r, timer, ctl };
      clearTimeout(timer);
      let problem = {};
      try { problem = await r.json(); } catch { /* not problem+json */ }
      const ra = Number(r.headers.get("Retry-After"));
      const err = new APIError(r.status, problem, Number.isFinite(ra) && ra > 0 ? ra : undefined);
      if (err.code === "RATE_LIMITED" && attempt < this.retries) {
        await sleep(Math.min((err.retryAfter ?? 1) * 1000, 5000), signal);
        continue;
      }
      throw err;
    }
  }

  async #json(method, path, body, headers, timeoutMs, signal) {
    const { r, timer } = await this.#request(method, path, body, headers, timeoutMs, signal);
    try {
      return await r.json();
    } catch (e) {
      throw new UnavailableError(`${method} ${path}: ${e?.message ?? e}`, e);
    } finally {
      clearTimeout(timer);
    }
  }

  // The events of path, resumed after a disconnect with Last-Event-ID: the
  // id of the last event seen, an opaque cursor sent back as it came
  // (opts.lastEventId first; a number, an earlier version's id, is sent as
  // its decimal).
  async *#stream(path, opts, untilOutcome) {
    let last = opts.lastEventId === undefined || opts.lastEventId === null ? undefined : String(opts.lastEventId);
    let failures = 0;
    for (;;) {
      const headers = { Accept: "text/event-stream" };
      if (last !== undefined) headers["Last-Event-ID"] = last;
      let conn;
      try {
        conn = await this.#request("GET", path, undefined, headers, 0, opts.signal);
      } catch (e) {
        if (!(e instanceof UnavailableError) || ++failures > this.retries) throw e;
        await sleep(200 * 2 ** failures, opts.signal);
        continue;
      }
      failures = 0;
      const { r, ctl } = conn;
      // Heartbeats come every 15 s: a stream silent for longer is dead.
      let idle;
      const touch = () => { clearTimeout(idle); idle = setTimeout(() => ctl.abort(new Error("stream silent")), 45_000); };
      const onAbort = () => ctl.abort(opts.signal.reason);
      opts.signal?.addEventListener("abort", onAbort, { once: true });
      try {
        touch();
        for await (const ev of parseSSE(r.body, touch)) {
          last = ev.id;
          yield ev;
          if (untilOutcome && ev.type === "turn.outcome") return;
        }
      } catch (e) {
        if (opts.signal?.aborted) throw opts.signal.reason;
        // cut off: resume after the last event seen
      } finally {
        clearTimeout(idle);
        opts.signal?.removeEventListener("abort", onAbort);
        ctl.abort();
      }
    }
  }
}

function idem(key) {
  return key ? { "Idempotency-Key": key } : {};
}

/**
 * Parses the Server-Sent Events the gateway sends (id, event, data; comments are heartbeats).
 * An event's id is an opaque cursor (e.g. "42.7.0.13.2", or "42" from an earlier
 * version): kept as the string it came as, never parsed.
 */
async function* parseSSE(body, onData) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  let id, type = "message", data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      onData();
      buf += dec.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
        if (line === "") {
          if (data.length && id !== undefined) yield { id, type, data: JSON.parse(data.join("\n")) };
          id = undefined; type = "message"; data = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const i = line.indexOf(":");
        const name = i < 0 ? line : line.slice(0, i);
        let v = i < 0 ? "" : line.slice(i + 1);
        if (v.startsWith(" ")) v = v.slice(1);
        if (name === "id") id = v;
        else if (name === "event") type = v;
        else if (name === "data") data.push(v);
      }
    }
  } finally {
    reader.releaseLock?.();
  }
}

/**
 * Verifies a Tollgate webhook request (Standard Webhooks) and returns its
 * decoded body. Throws WebhookVerificationError.
 */
export async function verifyWebhook(secret, headers, body, opts = {}) {
  const get = (name) => {
    if (typeof headers.get === "function") return headers.get(name) ?? undefined;
    for (const [k, v] of Object.entries(headers)) if (k.toLowerCase() === name) return Array.isArray(v) ? v.join(" ") : v;
    return undefined;
  };
  const raw = typeof body === "string" ? new TextEncoder().encode(body) : new Uint8Array(body);
  const msgId = get("webhook-id"), ts = get("webhook-timestamp"), sigs = get("webhook-signature");
  if (!msgId || !ts || !sigs) throw new WebhookVerificationError("WEBHOOK_SIGNATURE_INVALID", "missing webhook-id, webhook-timestamp or webhook-signature");
  if (!/^\d+$/.test(ts)) throw new WebhookVerificationError("WEBHOOK_TIMESTAMP_INVALID", `webhook-timestamp ${JSON.stringify(ts)} is not Unix seconds`);
  const now = opts.now ?? Date.now() / 1000;
  const tolerance = opts.toleranceSec ?? WEBHOOK_TOLERANCE_SEC;
  if (Math.abs(now - Number(ts)) > tolerance) throw new WebhookVerificationError("WEBHOOK_TIMESTAMP_INVALID", `webhook-timestamp ${ts} is more than ${tolerance}s from now`);
  let key;
  try {
    key = Uint8Array.from(atob(secret.startsWith("whsec_") ? secret.slice(6) : secret), (c) => c.charCodeAt(0));
  } catch {
    throw new WebhookVerificationError("WEBHOOK_SIGNATURE_INVALID", "the secret is not whsec_ + base64");
  }
  const prefix = new TextEncoder().encode(`${msgId}.${ts}.`);
  const msg = new Uint8Array(prefix.length + raw.length);
  msg.set(prefix);
  msg.set(raw, prefix.length);
  const k = await crypto.subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign", "verify"]);
  let ok = false;
  for (const s of sigs.split(" ")) {
    if (!s.startsWith("v1,")) continue;
    let sig;
    try { sig = Uint8Array.from(atob(s.slice(3)), (c) => c.charCodeAt(0)); } catch { continue; }
    // verify compares in constant time
    if (await crypto.subtle.verify("HMAC", k, sig, msg)) ok = true;
  }
  if (!ok) throw new WebhookVerificationError("WEBHOOK_SIGNATURE_INVALID", "no v1 signature matches");
  try {
    return JSON.parse(new TextDecoder().decode(raw));
  } catch {
    throw new WebhookVerificationError("WEBHOOK_SIGNATURE_INVALID", "the signed body is not JSON");
  }
}
