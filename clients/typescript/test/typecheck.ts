// Compiled by test/types.test.js with tsc --noEmit: the client's
// declarations hold together with the generated openapi.d.ts, and a
// program written against them type-checks.
import { Client, NotApproved, verifyWebhook, type Approval, type Turn, type TollgateEvent, type Sender } from "../src/index.js";

export async function demo(): Promise<string> {
  const alice: Sender = { id: "alice" };
  const tg = new Client({ url: "http://127.0.0.1:8080", key: "tg_x_y", sessionId: "demo", sender: alice });
  const sub = await tg.submit([["write_file", { path: "hello.txt", content: "hi" }]], { idempotencyKey: "k" });
  const c = sub.calls[0];
  if (c.disposition === "pending" && c.approval) {
    const a: Approval = c.approval;
    const d = await tg.approve(a, "alice", { note: "ok" });
    d.status satisfies "approved" | "denied" | "expired" | "abandoned" | "submitted";
  }
  const done: Turn = await tg.wait(sub.turn_id, { timeoutMs: 30_000 });
  let last: string | undefined;
  for await (const ev of tg.events(sub.turn_id, { lastEventId: "42.7.0.13.2" })) {
    const e: TollgateEvent = ev;
    void e.data;
    last = e.id; // an opaque cursor string
    // @ts-expect-error an event id is not a number
    const n: number = e.id;
    void n;
    // An earlier version's turn still sends batch.awaiting and
    // redrive.started: the type keeps them.
    if (e.type === "batch.awaiting" || e.type === "redrive.started" || e.type === "approval.requested") void e.id;
  }
  for await (const ev of tg.sessionEvents("demo", { lastEventId: last })) void ev.id.length;
  const write = tg.gated("write_file", (args: { path: string; content: string }) => args.path.length);
  try {
    const n: number = await write({ path: "a", content: "b" });
    void n;
  } catch (e) {
    if (e instanceof NotApproved) return e.code + (e.call.result?.status ?? "");
  }
  const body = await verifyWebhook("whsec_x", new Headers(), "{}");
  return done.state + body.type;
}
