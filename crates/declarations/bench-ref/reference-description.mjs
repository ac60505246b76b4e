// Prints the reference's codemode description (pi-coding-agent 1.6.0, createCodemodeDescription)
// for the tools given on stdin as {tools: [ToolSpec JSON], namespaces: [NamespaceSpec], inlineBudget}
// (a null budget lists every tool).
// The package is looked up in $PI_REF_DIR/node_modules, then in ./node_modules next to this file.
// Exit code 3 means the reference is not installed.
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const tail = "node_modules/@earendil-works/pi-coding-agent/dist/extensions/codemode/tool.js";
const candidates = [process.env.PI_REF_DIR && join(process.env.PI_REF_DIR, tail), join(here, tail)].filter(Boolean);
const entry = candidates.find((path) => existsSync(path));
if (!entry) {
  console.error(`reference not installed; run: npm install --prefix ${here}`);
  process.exit(3);
}
const { createCodemodeDescription } = await import(pathToFileURL(entry).href);
// Read stdin as a stream: readFileSync(0) fails with EAGAIN on a non-blocking pipe.
const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const input = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const byName = new Map((input.namespaces ?? []).map((ns) => [ns.name, ns]));
const tools = input.tools.map((t) => ({
  name: t.name,
  description: t.description ?? "",
  parameters: t.inputSchema,
  ...(t.outputSchema ? { outputSchema: t.outputSchema } : {}),
}));
const namespaces = new Map(
  input.tools.filter((t) => t.namespace).map((t) => [t.name, byName.get(t.namespace) ?? { name: t.namespace }]),
);
process.stdout.write(
  createCodemodeDescription(tools, { models: false, namespaces, inlineBudget: input.inlineBudget ?? undefined }),
);
