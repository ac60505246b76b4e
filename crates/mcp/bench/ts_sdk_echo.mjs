// Times `echo` calls to server-everything over stdio through the official TypeScript MCP SDK
// (the copy pinned in testbed/, 1.32.2). Run by scripts/bench-mcp:
//
//   node ts_sdk_echo.mjs TESTBED_DIR [N] [WARMUP]
//
// Prints two JSON lines: N sequential calls (each timed by the caller with performance.now(),
// as the script in mcp_latency times its own) and N calls started at once (the total).
import { createRequire } from "node:module";
import { join } from "node:path";

const [testbed, nArg, warmArg] = process.argv.slice(2);
if (!testbed) {
  console.error("usage: node ts_sdk_echo.mjs TESTBED_DIR [N] [WARMUP]");
  process.exit(2);
}
const n = Number(nArg ?? 1000);
const warmup = Number(warmArg ?? 50);
const require = createRequire(join(testbed, "package.json"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = require("@modelcontextprotocol/sdk/client/stdio.js");
const server = require.resolve("@modelcontextprotocol/server-everything/dist/index.js");

function summary(mode, samples, total) {
  const s = [...samples].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return {
    client: "ts-sdk",
    mode,
    n: s.length,
    median_ms: s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2,
    mean_ms: total / s.length,
    p99_ms: s[Math.min(s.length - 1, Math.floor(s.length * 0.99))],
    total_ms: total,
  };
}

const transport = new StdioClientTransport({ command: "node", args: [server], stderr: "ignore" });
const client = new Client({ name: "bench", version: "1" });
await client.connect(transport);
const echo = async (message) => {
  const result = await client.callTool({ name: "echo", arguments: { message } });
  if (result.isError) throw new Error(`echo failed: ${JSON.stringify(result)}`);
};
for (let i = 0; i < warmup; i++) await echo(`w${i}`);

const samples = [];
let start = performance.now();
for (let i = 0; i < n; i++) {
  const t = performance.now();
  await echo(`m${i}`);
  samples.push(performance.now() - t);
}
console.log(JSON.stringify(summary("sequential", samples, performance.now() - start)));

// Parallel: every call started at once; only the total means something here.
start = performance.now();
await Promise.all(Array.from({ length: n }, (_, i) => echo(`p${i}`)));
const total = performance.now() - start;
console.log(JSON.stringify({ client: "ts-sdk", mode: "parallel", n, mean_ms: total / n, total_ms: total }));
await client.close();
