#!/usr/bin/env node
// The model-as-user evaluation's harness. See README.md in this folder for the procedure.
//
//   node evals/model-as-user/eval.mjs list                     the task ids
//   node evals/model-as-user/eval.mjs prompt TASK              the whole prompt for a fresh session
//   node evals/model-as-user/eval.mjs check TASK REPLY [--record FILE --session NAME --try N]
//                                                              runs the script and checks its answer
//   node evals/model-as-user/eval.mjs table FILE               the results table of a record file
//   node evals/model-as-user/eval.mjs tokens                   the description's token count
//   node evals/model-as-user/eval.mjs selftest [TASK...]       our own scripts in selftest/ must pass,
//                                                              the *.wrong.js ones must fail
//
// Every `prompt` and `check` sets the task's environment up afresh under
// $EVAL_ROOT/<task> (default /tmp/codemode-eval/<task>): a copy of the fixture project, the
// memory server's starting graph, an empty configuration directory (your own ~/.config/codemode
// is never read), the testbed's three MCP servers and a policy that lets every tool run.
// The codemode binary is $CODEMODE_BIN, else the newer of target/release and target/debug.

import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { appendFileSync, copyFileSync, cpSync, existsSync, mkdirSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { findTask, memoryGraph, tasks } from "./tasks.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../..");
const testbed = join(repo, "testbed/node_modules/@modelcontextprotocol");
const RUN_TIMEOUT_MS = 180_000;

class Usage extends Error {}

function codemodeBinary() {
  if (process.env.CODEMODE_BIN) return process.env.CODEMODE_BIN;
  const built = ["release", "debug"]
    .map((p) => join(repo, "target", p, "codemode"))
    .filter((p) => existsSync(p))
    .sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs);
  if (built.length === 0) {
    throw new Usage("no codemode binary: run `cargo build --release -p codemode-cli` or set CODEMODE_BIN");
  }
  return built[0];
}

/** A fresh environment for `task`; the same task always gets the same paths. */
function setUp(task) {
  for (const server of ["server-everything", "server-filesystem", "server-memory"]) {
    if (!existsSync(join(testbed, server, "dist/index.js"))) {
      throw new Usage(`the npm testbed is missing (${server}): run \`npm ci --prefix ${join(repo, "testbed")}\``);
    }
  }
  const root = resolve(process.env.EVAL_ROOT ?? join(tmpdir(), "codemode-eval"), task.id);
  rmSync(root, { recursive: true, force: true });
  const project = join(root, "project");
  const state = join(root, "state");
  const config = join(root, "config");
  cpSync(join(here, "fixture"), project, { recursive: true });
  mkdirSync(state, { recursive: true });
  mkdirSync(config, { recursive: true });
  const memoryFile = join(state, "memory.jsonl");
  copyFileSync(join(here, "memory.jsonl"), memoryFile);
  const marker = randomBytes(8).toString("hex");
  const servers = {
    mcpServers: {
      everything: {
        command: "node",
        args: [join(testbed, "server-everything/dist/index.js"), "stdio"],
        env: { EVAL_MARKER: marker },
        // One tool is left out of the description, so finding tools is part of the task set.
        toolExposure: { "get-tiny-image": "deferred" },
      },
      filesystem: {
        command: "node",
        args: [join(testbed, "server-filesystem/dist/index.js"), project],
        toolExposure: { move_file: "deferred" },
      },
      memory: {
        command: "node",
        args: [join(testbed, "server-memory/dist/index.js")],
        env: { MEMORY_FILE_PATH: memoryFile },
      },
    },
  };
  const mcpConfig = join(root, "mcp.json");
  writeFileSync(mcpConfig, JSON.stringify(servers, null, 2));
  const policy = join(root, "policy.cedar");
  writeFileSync(
    policy,
    '// The evaluation measures scripts, not approvals: every tool may run.\n@id("eval-every-tool")\npermit (principal, action == Action::"tool_call", resource);\n',
  );
  const common = ["--mode", "only", "--workdir", project, "--config-dir", config, "--mcp-config", mcpConfig, "--policy", policy];
  return { root, project, memoryFile, marker, common };
}

function codemode(args, input) {
  const r = spawnSync(codemodeBinary(), args, {
    encoding: "utf8",
    input,
    timeout: RUN_TIMEOUT_MS,
    maxBuffer: 64 * 1024 * 1024,
  });
  if (r.error) throw r.error;
  return r;
}

function description(env) {
  const r = codemode(["tools", "--describe", ...env.common]);
  if (r.status !== 0) throw new Error(`codemode tools --describe failed:\n${r.stderr}`);
  return r.stdout;
}

/** The script in a reply: the first fenced code block if there is one, else the whole text. */
function scriptOf(reply) {
  const fenced = reply.match(/```[a-zA-Z]*\n([\s\S]*?)```/);
  return (fenced ? fenced[1] : reply).trim() + "\n";
}

function promptFor(task) {
  const env = setUp(task);
  return `You have one tool, \`codemode\`. Its description is below, between <description> tags, exactly as the tool declares it. You know nothing else about the system.

Solve the task at the end by writing one script: the exact input you would give the \`codemode\` tool. You cannot run it yourself; it will be run for you, and the value the script returns is compared with the expected answer, so return exactly what the task asks for. Reply with the script only, in one \`\`\`js code block.

The project directory is ${env.project}. The built-in file tools work there, and the filesystem MCP server may read and write inside it.

<description>
${description(env).trimEnd()}
</description>

Task: ${task.prompt}
`;
}

function retryPrompt(modelText) {
  return `The script ran. This is what the \`codemode\` tool returned:

<result>
${modelText.trimEnd()}
</result>

If this does not answer the task, reply with a corrected script in one \`\`\`js code block. If it does, reply DONE.
`;
}

async function check(task, replyFile) {
  const env = setUp(task);
  const script = join(env.root, "script.js");
  writeFileSync(script, scriptOf(readFileSync(replyFile, "utf8")));
  const log = join(env.root, "run.jsonl");
  const r = codemode(["run", "--json", "--record", log, ...env.common, script]);
  let run;
  try {
    run = JSON.parse(r.stdout);
  } catch {
    throw new Error(`codemode run did not print a JSON result (exit ${r.status}):\n${r.stdout}\n${r.stderr}`);
  }
  // What the model reads, from the recorded log: the replay calls no tool again.
  const replay = codemode(["run", "--replay", log, ...env.common, script]);
  const modelText = replay.stdout || replay.stderr;

  const fixture = join(here, "fixture");
  const ctx = {
    value: run.value,
    run,
    calls: (run.calls || []).map((c) => c.name),
    project: env.project,
    memoryFile: env.memoryFile,
    marker: env.marker,
    original: (path) => readFileSync(join(fixture, path), "utf8"),
    initialMemory: () => memoryGraph(join(here, "memory.jsonl")),
    async reference(code) {
      const file = join(env.root, `reference-${randomBytes(4).toString("hex")}.js`);
      writeFileSync(file, code);
      const ref = codemode(["run", "--json", ...env.common, file]);
      const out = JSON.parse(ref.stdout);
      if (!out.ok) throw new Error(`the checker's own script failed: ${out.error?.message}`);
      return out.value;
    },
  };
  let reason;
  if (!run.ok) {
    reason = `the script failed: ${run.error?.message ?? "no message"}`;
  } else {
    try {
      reason = await task.check(ctx);
    } catch (e) {
      reason = `the answer could not be checked: ${e.message}`;
    }
  }
  return { pass: reason === null, reason, error: run.ok ? null : run.error?.message ?? null, modelText };
}

function table(file) {
  const rows = readFileSync(file, "utf8")
    .split("\n")
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l));
  const byRun = new Map();
  for (const row of rows) {
    const key = `${row.session}\u0000${row.task}`;
    if (!byRun.has(key)) byRun.set(key, []);
    byRun.get(key).push(row);
  }
  const lines = ["| session | task | first try | tries | error text of failed tries |", "|---|---|---|---|---|"];
  let firstTry = 0;
  for (const attempts of byRun.values()) {
    attempts.sort((a, b) => a.try - b.try);
    const passedAt = attempts.find((a) => a.pass);
    const first = attempts[0].try === 1 && attempts[0].pass;
    if (first) firstTry += 1;
    const errors = attempts
      .filter((a) => !a.pass)
      .map((a) => `try ${a.try}: ${(a.error ?? a.reason ?? "").replace(/\s+/g, " ").replace(/\|/g, "\\|").slice(0, 160)}`)
      .join("; ");
    const tries = passedAt ? String(passedAt.try) : `not solved in ${attempts.length}`;
    lines.push(`| ${attempts[0].session} | ${attempts[0].task} | ${first ? "yes" : "no"} | ${tries} | ${errors} |`);
  }
  lines.push("", `First try: ${firstTry} of ${byRun.size}.`);
  return lines.join("\n");
}

/** Checks the checkers: each task's script in selftest/ passes, each `.wrong.js` one fails. */
async function selftest(ids) {
  const dir = join(here, "selftest");
  const chosen = ids.length ? ids.map(taskArg) : tasks;
  let bad = 0;
  for (const task of chosen) {
    const cases = [[`${task.id}.js`, true], [`${task.id}.wrong.js`, false]].filter(([f]) => existsSync(join(dir, f)));
    if (cases.length === 0 || !cases[0][1]) {
      console.log(`MISSING  ${task.id}: no selftest/${task.id}.js`);
      bad += 1;
    }
    for (const [file, shouldPass] of cases) {
      const result = await check(task, join(dir, file));
      const ok = result.pass === shouldPass;
      if (!ok) bad += 1;
      const verdict = result.pass ? "passed" : `failed: ${result.reason}`;
      console.log(`${ok ? "ok      " : "WRONG   "} ${file.padEnd(26)} ${verdict}`);
    }
  }
  const known = new Set(tasks.map((t) => t.id));
  for (const file of readdirSync(dir)) {
    if (!known.has(file.replace(/(\.wrong)?\.js$/, ""))) {
      console.log(`UNKNOWN  selftest/${file} belongs to no task`);
      bad += 1;
    }
  }
  console.log(bad === 0 ? "selftest passed" : `selftest: ${bad} problem(s)`);
  return bad === 0 ? 0 : 1;
}

function option(args, name) {
  const i = args.indexOf(name);
  if (i < 0) return undefined;
  if (i + 1 >= args.length) throw new Usage(`${name} needs a value`);
  return args[i + 1];
}

function taskArg(id) {
  const task = id && findTask(id);
  if (!task) throw new Usage(`unknown task ${JSON.stringify(id)}; \`eval.mjs list\` shows the ${tasks.length} tasks`);
  return task;
}

async function main(args) {
  const [command, ...rest] = args;
  switch (command) {
    case "list":
      for (const t of tasks) console.log(`${t.id.padEnd(20)} ${t.area.padEnd(16)} ${t.prompt}`);
      return 0;
    case "prompt":
      process.stdout.write(promptFor(taskArg(rest[0])));
      return 0;
    case "tokens": {
      const env = setUp(tasks[0]);
      const r = codemode(["tools", "--tokens", ...env.common]);
      process.stdout.write(r.stdout + r.stderr);
      return r.status ?? 1;
    }
    case "check": {
      const task = taskArg(rest[0]);
      const reply = rest[1];
      if (!reply || !existsSync(reply)) throw new Usage("check needs a task id and the file holding the session's reply (or script)");
      const result = await check(task, reply);
      console.log(`task    ${task.id}`);
      console.log(`result  ${result.pass ? "PASS" : `FAIL: ${result.reason}`}`);
      if (result.error) console.log(`error   ${result.error}`);
      if (!result.pass) {
        console.log("\n--- for the next try, give the session this message ---\n");
        console.log(retryPrompt(result.modelText));
      }
      const record = option(rest, "--record");
      if (record) {
        const row = {
          time: new Date().toISOString(),
          session: option(rest, "--session") ?? "unnamed",
          task: task.id,
          try: Number(option(rest, "--try") ?? 1),
          pass: result.pass,
          reason: result.reason,
          error: result.error,
        };
        appendFileSync(record, JSON.stringify(row) + "\n");
      }
      return result.pass ? 0 : 1;
    }
    case "selftest":
      return selftest(rest);
    case "table":
      if (!rest[0]) throw new Usage("table needs the record file");
      console.log(table(rest[0]));
      return 0;
    default:
      throw new Usage("usage: eval.mjs list | prompt TASK | check TASK REPLY [--record FILE --session NAME --try N] | table FILE | tokens | selftest [TASK...]");
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (e) => {
    console.error(e instanceof Usage ? e.message : e.stack || String(e));
    process.exit(2);
  },
);
