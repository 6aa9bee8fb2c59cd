// A Tollgate tool service in Node, written with @nats-io/services: a NATS
// service whose endpoints carry tollgate metadata, so that Tollgate
// discovers them as tools (see docs/tools.md). It offers one tool of a
// pretend ticket system:
//
//   tickets.create {"title","body"?}: opens a ticket. Not safe to re-run
//   blindly (no "tollgate.retry_safe"), but idempotent on the call id: a
//   request with a call id it has already handled returns the first
//   answer and opens nothing.
//
// Each reply carries the request's Tollgate-Call-Id header back; a bad
// request gets a service error (Nats-Service-Error headers), which Tollgate
// reports as the tool's error.
//
// Environment:
//
//   NATS_URL              the server (default 127.0.0.1:4222)
//   NATS_USER, NATS_PASSWORD  credentials (e.g. the toolsvc user of
//                         deploy/nats/least-privilege.conf)
//   TOOLSERVICE_JOURNAL   a file to which every request received is
//                         appended as "<tool> <call id>" (for demos and tests)
//   TOOLSERVICE_DELAY_MS  a delay before each answer (to see a timeout
//                         become EXECUTION_UNCERTAIN)
//
// Run: npm ci && node index.js. It stops on SIGINT or SIGTERM.

import { appendFileSync } from "node:fs";
import { connect, headers } from "@nats-io/transport-node";
import { Svcm } from "@nats-io/services";

const CALL_ID = "Tollgate-Call-Id";

const createSchema = {
  type: "object",
  properties: {
    title: { type: "string", minLength: 1, maxLength: 200 },
    body: { type: "string", maxLength: 10000 },
  },
  required: ["title"],
  additionalProperties: false,
};

const journal = process.env.TOOLSERVICE_JOURNAL || "";
const delayMs = Number(process.env.TOOLSERVICE_DELAY_MS || 0);

const nc = await connect({
  servers: process.env.NATS_URL || "127.0.0.1:4222",
  user: process.env.NATS_USER,
  pass: process.env.NATS_PASSWORD,
  name: "toolservice-node",
  maxReconnectAttempts: -1,
});

const service = await new Svcm(nc).add({
  name: "tickets",
  version: "1.0.0",
  description: "A pretend ticket system, as Tollgate tools",
});

// Endpoints live under tollgate.tool.<service>: the only subjects a tool
// service's user may answer on (deploy/nats/least-privilege.conf).
const tools = service.addGroup("tollgate.tool.tickets");

const tickets = []; // the pretend system
const answered = new Map(); // call id -> the answer given

tools.addEndpoint("create", {
  metadata: {
    "tollgate.name": "tickets.create",
    "tollgate.description": "Open a ticket.",
    "tollgate.schema": JSON.stringify(createSchema),
  },
  handler: async (err, msg) => {
    if (err) {
      console.error("endpoint stopped:", err);
      return;
    }
    // Every reply carries the call id back, errors included.
    const h = headers();
    h.set(CALL_ID, msg.headers?.get(CALL_ID) ?? "");
    let req;
    try {
      req = msg.json();
      if (journal) appendFileSync(journal, `tickets.create ${req.call_id}\n`);
      if (typeof req.args?.title !== "string" || req.args.title === "") {
        throw new Error("args: title is required");
      }
    } catch (e) {
      msg.respondError(400, String(e.message || e), undefined, { headers: h });
      return;
    }
    if (delayMs > 0) await new Promise((r) => setTimeout(r, delayMs));
    // The call id is the idempotency key.
    let out = answered.get(req.call_id);
    if (out === undefined) {
      tickets.push({ title: req.args.title, body: req.args.body ?? "", by: req.context.requester.principal });
      out = `ticket T-${tickets.length} "${req.args.title}" opened for ${req.context.requester.principal}`;
      answered.set(req.call_id, out);
    }
    msg.respond(out, { headers: h });
  },
});

console.error(`serving tickets (id ${service.info().id}) on ${nc.getServer()}`);

for (const s of ["SIGINT", "SIGTERM"]) {
  process.on(s, async () => {
    await service.stop();
    await nc.drain();
    process.exit(0);
  });
}
