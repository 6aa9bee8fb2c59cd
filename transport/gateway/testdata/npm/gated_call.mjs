// One tools/call through Tollgate's /mcp with the official TypeScript MCP
// client: node gated_call.mjs <url> <token> <tool> <json args>.
// Prints {"result": <CallToolResult>, "progress": [<messages>]} on stdout.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token, tool, args] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
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
