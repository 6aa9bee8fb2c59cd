// The Agents SDK example against a real `tollgate dev` and a scripted
// OpenAI-compatible chat-completions endpoint: the model's write_file call
// waits for alice's decision, runs once approved (its result goes back to
// the model), and does not run when denied.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { randomUUID } from "node:crypto";

import { Client } from "@tollgate/client";
import { startDev, eventually } from "../../../clients/typescript/test/devserver.js";
import { runAgent } from "../agent.js";

let dev, model;
const requests = [];

// The scripted model: asks for write_file first, then answers with what the tool said.
function scriptedModel() {
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      const r = JSON.parse(body);
      requests.push({ url: req.url, body: r });
      const last = r.messages.at(-1);
      const message = last.role === "tool"
        ? { role: "assistant", content: `The tool said: ${last.content}` }
        : { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function",
            function: { name: "write_file", arguments: JSON.stringify({ path: last.content.includes("deny") ? "denied.txt" : "note.txt", content: "buy milk" }) } }] };
      res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify({
        id: "chatcmpl-" + requests.length, object: "chat.completion", created: Math.floor(Date.now() / 1000), model: r.model,
        choices: [{ index: 0, message, finish_reason: message.tool_calls ? "tool_calls" : "stop" }],
        usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
      }));
    });
  });
  return new Promise((r) => server.listen(0, "127.0.0.1", () => r(server)));
}

before(async () => {
  dev = await startDev(); // the built-in policy: write_file needs an approval
  model = await scriptedModel();
});
after(async () => {
  await dev?.stop();
  model?.close();
});

async function agentTurn(prompt, decide) {
  const session = "agent-" + randomUUID().slice(0, 8);
  const tg = new Client({ url: dev.url, key: dev.key, sessionId: session, sender: "alice" });
  const logs = [];
  const out = runAgent({ prompt, tg, baseURL: `http://127.0.0.1:${model.address().port}/v1`, model: "scripted", log: (m) => logs.push(m) });
  const [a] = await eventually("the write_file approval", async () => { const l = await tg.approvals({ session }); return l.length ? l : null; });
  assert.equal(a.tool, "write_file");
  assert.deepEqual(JSON.parse(a.args), { path: JSON.parse(a.args).path, content: "buy milk" });
  // The agent logs after its submit's answer came back, which can be
  // after the approval is listed: wait for the line, then compare.
  await eventually("the agent's pending line", async () => (logs.length ? logs : null));
  assert.deepEqual(logs, [`write_file waits for a decision: tollgate approve ${a.approval_id}`]);
  await decide(tg, a);
  return { out: await out, a };
}

test("the agent's write_file runs once alice approves, and the model gets its result", async () => {
  const { out } = await agentTurn("save a note saying buy milk", (tg, a) => tg.approve(a, "alice"));
  assert.equal(out, "The tool said: wrote 8 bytes to note.txt");
  assert.equal(readFileSync(join(dev.data, "sandbox", "note.txt"), "utf8"), "buy milk");
  assert.ok(requests.every((r) => r.url === "/v1/chat/completions"));
});

test("a denied write_file does not run, and the model is told why", async () => {
  const { out } = await agentTurn("save a note, deny it", (tg, a) => tg.deny(a, "alice"));
  assert.match(out, /^The tool said: not done: APPROVAL_DENIED: /);
  assert.equal(existsSync(join(dev.data, "sandbox", "denied.txt")), false);
});
