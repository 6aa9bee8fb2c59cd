// An OpenAI Agents SDK agent whose write_file tool runs behind Tollgate:
// the model proposes the call, Tollgate asks a person (the policy wants an
// approval for write_file), runs it once approved, and the tool returns
// the result to the model; a denied call returns its reason code instead.
//
//   export TOLLGATE_KEY=$(cat .tollgate/gateway-dev-key)         # tollgate dev running
//   OPENAI_BASE_URL=http://127.0.0.1:11434/v1 OPENAI_MODEL=qwen2.5:7b node agent.js "save a note saying buy milk"
//   tollgate approve a-…   (in another terminal, as the session's sender)
import { Agent, OpenAIProvider, Runner, setTracingDisabled, tool } from "@openai/agents";
import { z } from "zod";
import { Client, DecisionPending, NotApproved } from "@tollgate/client";

/** The write_file tool, sent through Tollgate with client tg. */
export function writeFileTool(tg, { log = console.error } = {}) {
  return tool({
    name: "write_file",
    description: "Write a text file (path relative to the sandbox). A person approves each call.",
    parameters: z.object({ path: z.string(), content: z.string() }),
    async execute(args) {
      try {
        const call = await tg.gate("write_file", args, {
          onSubmitted: (sub) => {
            const c = sub.calls[0];
            if (c?.disposition === "pending") log(`write_file waits for a decision: tollgate approve ${c.approval_id}`);
          },
        });
        return call.result.output ?? "";
      } catch (e) {
        // The model learns why nothing happened; it must not retry as if it had.
        if (e instanceof NotApproved || e instanceof DecisionPending) return `not done: ${e.message}`;
        throw e;
      }
    },
  });
}

/** Runs one agent turn on prompt and resolves with its final output. */
export async function runAgent({ prompt, tg, baseURL, apiKey = "unused", model, log }) {
  setTracingDisabled(true); // no trace export: everything stays on this machine
  const agent = new Agent({
    name: "assistant",
    instructions: "You help the user. To save a note, call write_file.",
    tools: [writeFileTool(tg, { log })],
    model,
  });
  const runner = new Runner({ modelProvider: new OpenAIProvider({ baseURL, apiKey, useResponses: false }) });
  const result = await runner.run(agent, prompt);
  return result.finalOutput;
}

if (process.argv[1] && import.meta.url === new URL(`file://${process.argv[1]}`).href) {
  const out = await runAgent({
    prompt: process.argv.slice(2).join(" ") || "save a note saying buy milk",
    tg: new Client({ sessionId: process.env.TOLLGATE_SESSION ?? "agent-demo", sender: process.env.TOLLGATE_SENDER ?? "alice" }),
    baseURL: process.env.OPENAI_BASE_URL ?? "http://127.0.0.1:11434/v1",
    apiKey: process.env.OPENAI_API_KEY ?? "unused",
    model: process.env.OPENAI_MODEL ?? "qwen2.5:7b",
  });
  console.log(out);
}
