// One tools/call through Tollgate's /mcp with the official TypeScript MCP
// client: node gated_call.mjs <url> <token> <tool> <json args> [session],
// the session sent as Tollgate-Session.
// Prints {"result": <CallToolResult>, "progress": [<messages>]} on stdout.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token, tool, args, session] = process.argv.slice(2);
const headers = { Authorization: `Bearer ${token}` };
if (session) headers["Tollgate-Session"] = session;
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
const client = new Client({ name: "tollgate-gateway-test", version: "1" });
await client.connect(transport);
const progress = [];
const result = await client.callTool({ name: tool, arguments: JSON.parse(args) }, undefined, {
  timeout: 120000,
  resetTimeoutOnProgress: true,
  onprogress: (p) => progress.push(p.message ?? ""),
});
console.log(JSON.stringify({ result, progress }));
await client.close();
