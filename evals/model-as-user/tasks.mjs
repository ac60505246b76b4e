// The task set of the model-as-user evaluation.
//
// Each task is an ordinary request a user could make, written before (and independently of) any
// change to the codemode description. `prompt` is what the model reads; `check(ctx)` decides
// whether the script's result is right, computing the expected answer from the environment it
// ran in (the fixture project, the memory file, the servers' own answers) rather than comparing
// with a stored string. It returns `null` for a pass, or a sentence saying what was wrong.
//
// ctx = {
//   value,            // what the script returned (`value` of `codemode run --json`)
//   run,              // the whole `codemode run --json` object (ok, output, calls, error, ...)
//   calls,            // names of the tools the script called, in order, including refused ones
//   project,          // absolute path of the project the script ran against
//   memoryFile,       // the memory server's JSON Lines file
//   marker,           // the EVAL_MARKER environment value of this run
//   reference(code),  // runs a script of ours in the same environment, resolves to its value
//   original(path),   // a project file's content as the fixture had it, before the script ran
//   initialMemory(),  // the memory graph as it was before the script ran
// }

import { createHash } from "node:crypto";
import { readFileSync, readdirSync, statSync, existsSync } from "node:fs";
import { join, relative } from "node:path";

// ---- helpers for checkers ----

/** Every file under `dir` (recursively), as paths relative to `root`, sorted. */
function walk(root, dir = root) {
  const out = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const full = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...walk(root, full));
    else out.push(relative(root, full));
  }
  return out.sort();
}

function read(project, path) {
  return readFileSync(join(project, path), "utf8");
}

function same(actual, expected) {
  return JSON.stringify(canonical(actual)) === JSON.stringify(canonical(expected));
}

/** JSON with object keys sorted, so key order does not matter. */
function canonical(v) {
  if (Array.isArray(v)) return v.map(canonical);
  if (v !== null && typeof v === "object") {
    const out = {};
    for (const k of Object.keys(v).sort()) out[k] = canonical(v[k]);
    return out;
  }
  return v;
}

function expectEqual(actual, expected, what = "the result") {
  if (same(actual, expected)) return null;
  return `${what} is ${JSON.stringify(actual)}, expected ${JSON.stringify(expected)}`;
}

function expectCalled(ctx, prefix, atLeast = 1) {
  const n = ctx.calls.filter((c) => c.startsWith(prefix)).length;
  if (n >= atLeast) return null;
  return `the script made ${n} call(s) of ${prefix}*, the task needs at least ${atLeast}`;
}

function first(...checks) {
  for (const c of checks) if (c) return c;
  return null;
}

function memoryGraph(file) {
  const graph = { entities: [], relations: [] };
  if (!existsSync(file)) return graph;
  for (const line of readFileSync(file, "utf8").split("\n")) {
    if (!line.trim()) continue;
    const item = JSON.parse(line);
    if (item.type === "entity") graph.entities.push(item);
    if (item.type === "relation") graph.relations.push(item);
  }
  return graph;
}

function rustFiles(project) {
  return walk(project, join(project, "src")).filter((p) => p.endsWith(".rs"));
}

// ---- the tasks ----

export const tasks = [
  // Built-in tools over the fixture project.
  {
    id: "rs-line-count",
    area: "builtin",
    prompt:
      "How many lines do the Rust source files under src/ contain in total (every .rs file, recursively)? Return the total as a number.",
    check(ctx) {
      const total = rustFiles(ctx.project)
        .map((p) => read(ctx.project, p).split("\n").length - 1)
        .reduce((a, b) => a + b, 0);
      return expectEqual(ctx.value, total);
    },
  },
  {
    id: "pub-fns",
    area: "builtin",
    prompt:
      "List the public functions (declared with `pub fn`, not `pub(crate) fn`) of each Rust file under src/. Return an object that maps each file's path relative to the project root (such as \"src/lib.rs\") to the array of its function names in the order they appear. Leave out files that have none.",
    check(ctx) {
      const expected = {};
      for (const p of rustFiles(ctx.project)) {
        const names = [...read(ctx.project, p).matchAll(/^\s*pub fn (\w+)/gm)].map((m) => m[1]);
        if (names.length) expected[p] = names;
      }
      return expectEqual(ctx.value, expected);
    },
  },
  {
    id: "todos",
    area: "builtin",
    prompt:
      "Find every TODO comment in the project. Return an array of {file, line, text} objects: file is the path relative to the project root, line the 1-based line number, text what follows \"TODO: \" on that line. Sort by file, then line.",
    check(ctx) {
      const expected = [];
      for (const p of walk(ctx.project)) {
        read(ctx.project, p)
          .split("\n")
          .forEach((l, i) => {
            const m = l.match(/TODO: (.*)$/);
            if (m) expected.push({ file: p, line: i + 1, text: m[1].trim() });
          });
      }
      expected.sort((a, b) => (a.file < b.file ? -1 : a.file > b.file ? 1 : a.line - b.line));
      const got = Array.isArray(ctx.value)
        ? ctx.value.map((t) => ({ ...t, text: typeof t.text === "string" ? t.text.trim() : t.text }))
        : ctx.value;
      return expectEqual(got, expected);
    },
  },
  {
    id: "largest-files",
    area: "builtin",
    prompt:
      "Which three files in the project are the largest, in bytes? Return [{path, bytes}] from the largest down, with paths relative to the project root.",
    check(ctx) {
      const sizes = walk(ctx.project)
        .map((p) => ({ path: p, bytes: statSync(join(ctx.project, p)).size }))
        .sort((a, b) => b.bytes - a.bytes)
        .slice(0, 3);
      return expectEqual(ctx.value, sizes);
    },
  },
  {
    id: "csv-average",
    area: "builtin",
    prompt:
      "data/people.csv lists people with their age and city. Return an object mapping each city to the average age of its people, rounded to one decimal place, as a number.",
    check(ctx) {
      const rows = read(ctx.project, "data/people.csv").trim().split("\n").slice(1).map((l) => l.split(","));
      const by = {};
      for (const [, age, city] of rows) (by[city] ??= []).push(Number(age));
      const expected = {};
      for (const [city, ages] of Object.entries(by)) {
        expected[city] = Math.round((ages.reduce((a, b) => a + b, 0) / ages.length) * 10) / 10;
      }
      return expectEqual(ctx.value, expected);
    },
  },
  {
    id: "config-bump",
    area: "builtin",
    prompt:
      "In data/config.json, turn \"debug\" on and raise the patch number of \"version\" by one. Keep every other key and value as it is. Return the new version string.",
    check(ctx) {
      const before = JSON.parse(ctx.original("data/config.json"));
      let after;
      try {
        after = JSON.parse(read(ctx.project, "data/config.json"));
      } catch (e) {
        return `data/config.json is no longer valid JSON: ${e.message}`;
      }
      const [ma, mi, pa] = before.version.split(".").map(Number);
      const version = `${ma}.${mi}.${pa + 1}`;
      return first(
        expectEqual(after, { ...before, debug: true, version }, "data/config.json"),
        expectEqual(ctx.value, version),
      );
    },
  },
  {
    id: "docs-index",
    area: "builtin",
    prompt:
      "Create notes/docs-index.md with one line per Markdown file in docs/, sorted by file name, each in the form `- <file name>: <text of its first heading>`. Then read the file back to make sure it was written, and return its content.",
    check(ctx) {
      const docs = readdirSync(join(ctx.project, "docs")).filter((f) => f.endsWith(".md")).sort();
      const lines = docs.map((f) => {
        const heading = read(ctx.project, `docs/${f}`).split("\n").find((l) => l.startsWith("#"));
        return `- ${f}: ${heading.replace(/^#+\s*/, "")}`;
      });
      const expected = lines.join("\n");
      if (!existsSync(join(ctx.project, "notes/docs-index.md"))) return "notes/docs-index.md was not created";
      const written = read(ctx.project, "notes/docs-index.md").trimEnd();
      return first(
        expectEqual(written, expected, "notes/docs-index.md"),
        typeof ctx.value === "string" ? expectEqual(ctx.value.trimEnd(), expected) : `the result is ${JSON.stringify(ctx.value)}, expected the file's content`,
      );
    },
  },
  {
    id: "readme-sha256",
    area: "builtin",
    prompt: "Return the SHA-256 digest of README.md as a lowercase hex string.",
    check(ctx) {
      const digest = createHash("sha256").update(readFileSync(join(ctx.project, "README.md"))).digest("hex");
      return expectEqual(ctx.value, digest);
    },
  },
  {
    id: "test-count",
    area: "builtin",
    prompt:
      "How many test functions (marked #[test]) does the project have, and where? Return {total, files}, where files maps each file's path relative to the project root to its number of tests.",
    check(ctx) {
      const files = {};
      let total = 0;
      for (const p of walk(ctx.project).filter((p) => p.endsWith(".rs"))) {
        const n = (read(ctx.project, p).match(/#\[test\]/g) || []).length;
        if (n) {
          files[p] = n;
          total += n;
        }
      }
      return expectEqual(ctx.value, { total, files });
    },
  },
  {
    id: "read-lines",
    area: "builtin",
    prompt:
      "Return lines 24 to 26 of src/parser.rs exactly as they are in the file: one string, lines joined with \"\\n\", without line numbers.",
    check(ctx) {
      const expected = read(ctx.project, "src/parser.rs").split("\n").slice(23, 26).join("\n");
      return expectEqual(ctx.value, expected);
    },
  },

  // The filesystem MCP server (its allowed directory is the project).
  {
    id: "fs-tree",
    area: "mcp-filesystem",
    prompt:
      "Using the filesystem MCP server, list every file under the project's docs/ and src/ directories, recursively. Return their paths relative to the project root, sorted.",
    check(ctx) {
      const expected = [...walk(ctx.project, join(ctx.project, "docs")), ...walk(ctx.project, join(ctx.project, "src"))].sort();
      return first(expectCalled(ctx, "mcp__filesystem__"), expectEqual(ctx.value, expected));
    },
  },
  {
    id: "fs-sizes",
    area: "mcp-filesystem",
    prompt:
      "Using the filesystem MCP server, return the total size in bytes of the files directly inside src/ (not those in its subdirectories).",
    check(ctx) {
      const dir = join(ctx.project, "src");
      const total = readdirSync(dir, { withFileTypes: true })
        .filter((e) => e.isFile())
        .map((e) => statSync(join(dir, e.name)).size)
        .reduce((a, b) => a + b, 0);
      return first(expectCalled(ctx, "mcp__filesystem__"), expectEqual(ctx.value, total));
    },
  },
  {
    id: "fs-readable",
    area: "mcp-filesystem",
    prompt:
      "Using the filesystem MCP server, try to read each of these files: \"README.md\" (in the project), \"/etc/hostname\", and \"docs/missing.md\" (in the project). Return an object that maps each of those three names, exactly as written here, to true if the server could read it and false if not.",
    check(ctx) {
      return first(
        expectCalled(ctx, "mcp__filesystem__", 3),
        expectEqual(ctx.value, { "README.md": true, "/etc/hostname": false, "docs/missing.md": false }),
      );
    },
  },
  {
    id: "fs-media",
    area: "mcp-filesystem",
    prompt:
      "Using the filesystem MCP server, read assets/logo.png as a media file. Return {mimeType, bytes}, where bytes is the size of the image data once decoded.",
    check(ctx) {
      const bytes = statSync(join(ctx.project, "assets/logo.png")).size;
      return first(expectCalled(ctx, "mcp__filesystem__"), expectEqual(ctx.value, { mimeType: "image/png", bytes }));
    },
  },
  {
    id: "fs-write-read",
    area: "mcp-filesystem",
    prompt:
      "Using the filesystem MCP server, create the directory notes/ in the project and write notes/todo.txt containing the three lines \"alpha\", \"beta\" and \"gamma\". Then read it back through the server and return how many lines it has.",
    check(ctx) {
      const file = join(ctx.project, "notes/todo.txt");
      if (!existsSync(file)) return "notes/todo.txt was not created";
      const lines = readFileSync(file, "utf8").split("\n").filter((l) => l !== "");
      return first(
        expectCalled(ctx, "mcp__filesystem__write_file"),
        expectEqual(lines, ["alpha", "beta", "gamma"], "the lines of notes/todo.txt"),
        expectEqual(ctx.value, 3),
      );
    },
  },
  {
    id: "fs-rename",
    area: "mcp-filesystem",
    prompt:
      "Using the filesystem MCP server, rename docs/changelog.md to docs/CHANGES.md. Return the names of the files in docs/ afterwards, as an array.",
    check(ctx) {
      const names = readdirSync(join(ctx.project, "docs"));
      if (!names.includes("CHANGES.md") || names.includes("changelog.md")) {
        return `docs/ holds ${JSON.stringify(names)}; changelog.md was not renamed to CHANGES.md`;
      }
      return first(
        expectCalled(ctx, "mcp__filesystem__"),
        Array.isArray(ctx.value) ? expectEqual([...ctx.value].sort(), [...names].sort()) : `the result is ${JSON.stringify(ctx.value)}, expected an array`,
      );
    },
  },

  // The memory MCP server, which starts with a small knowledge graph.
  {
    id: "memory-rivers",
    area: "mcp-memory",
    prompt:
      "The memory MCP server holds a knowledge graph. Return the names of the cities in it that lie on a river (going by their observations), sorted.",
    check(ctx) {
      const expected = memoryGraph(ctx.memoryFile)
        .entities.filter((e) => e.entityType === "city" && e.observations.some((o) => /river/i.test(o)))
        .map((e) => e.name)
        .sort();
      return first(expectCalled(ctx, "mcp__memory__"), expectEqual(ctx.value, expected));
    },
  },
  {
    id: "memory-neighbours",
    area: "mcp-memory",
    prompt:
      "In the memory server's knowledge graph, who lives in the same city as Grace? Return their names, sorted, without Grace.",
    check(ctx) {
      const g = memoryGraph(ctx.memoryFile);
      const lives = g.relations.filter((r) => r.relationType === "lives_in");
      const city = lives.find((r) => r.from === "Grace").to;
      const expected = lives.filter((r) => r.to === city && r.from !== "Grace").map((r) => r.from).sort();
      return first(expectCalled(ctx, "mcp__memory__"), expectEqual(ctx.value, expected));
    },
  },
  {
    id: "memory-observe",
    area: "mcp-memory",
    prompt:
      "In the memory server's knowledge graph, add the observation \"moved in 2024\" to every person who lives in Paris. Return the names of the people you updated, sorted.",
    check(ctx) {
      const g = memoryGraph(ctx.memoryFile);
      const parisians = g.relations
        .filter((r) => r.relationType === "lives_in" && r.to === "Paris")
        .map((r) => r.from)
        .sort();
      const updated = g.entities
        .filter((e) => e.observations.includes("moved in 2024"))
        .map((e) => e.name)
        .sort();
      return first(
        expectEqual(updated, parisians, "the entities that have the new observation"),
        expectEqual(ctx.value, parisians),
      );
    },
  },
  {
    id: "memory-link",
    area: "mcp-memory",
    prompt:
      "In the memory server's knowledge graph, create a project entity named \"codemode\" with the observation \"runs scripts behind a gate\", and a \"works_on\" relation to it from everyone who works on tally. Return the number of relations you created.",
    check(ctx) {
      const before = ctx.initialMemory();
      const workers = before.relations.filter((r) => r.relationType === "works_on" && r.to === "tally").map((r) => r.from).sort();
      const g = memoryGraph(ctx.memoryFile);
      const entity = g.entities.find((e) => e.name === "codemode");
      if (!entity) return "there is no entity named codemode";
      const linked = g.relations.filter((r) => r.to === "codemode" && r.relationType === "works_on").map((r) => r.from).sort();
      return first(
        expectEqual(entity.entityType, "project", "the entity type of codemode"),
        expectEqual(entity.observations, ["runs scripts behind a gate"], "the observations of codemode"),
        expectEqual(linked, workers, "the people with a works_on relation to codemode"),
        expectEqual(ctx.value, workers.length),
      );
    },
  },

  // The everything MCP server (its echo, sum, environment, structured content and resources).
  {
    id: "echo-50",
    area: "mcp-everything",
    prompt:
      "Call the everything server's echo tool 50 times concurrently, with the messages \"m0\" to \"m49\". Return how many of the replies contain their own message.",
    check(ctx) {
      return first(expectCalled(ctx, "mcp__everything__echo", 50), expectEqual(ctx.value, 50));
    },
  },
  {
    id: "sum-tree",
    area: "mcp-everything",
    prompt:
      "Add up the numbers 1 to 16 using only the everything server's tool that sums two numbers: add them in pairs, all pairs of a level in parallel, level by level until one number is left. Return that number.",
    check(ctx) {
      return first(expectCalled(ctx, "mcp__everything__get_sum", 15), expectEqual(ctx.value, 136));
    },
  },
  {
    id: "env-marker",
    area: "mcp-everything",
    prompt: "The everything MCP server runs with an environment variable named EVAL_MARKER. Return its value.",
    check(ctx) {
      return first(expectCalled(ctx, "mcp__everything__"), expectEqual(ctx.value, ctx.marker));
    },
  },
  {
    id: "weather",
    area: "mcp-everything",
    prompt:
      "According to the everything server's weather data, which of New York, Chicago and Los Angeles is the most humid? Return {city, humidity}.",
    async check(ctx) {
      const data = await ctx.reference(`
        const cities = ["New York", "Chicago", "Los Angeles"];
        const rs = await Promise.all(cities.map(location => tools.mcp__everything__get_structured_content({ location })));
        return cities.map((city, i) => ({ city, humidity: rs[i].structuredContent.humidity }));`);
      const best = data.reduce((a, b) => (b.humidity > a.humidity ? b : a));
      return first(expectCalled(ctx, "mcp__everything__"), expectEqual(ctx.value, best));
    },
  },
  {
    id: "resource-links",
    area: "mcp-everything",
    prompt:
      "Ask the everything server for 4 resource links. Return the links as an array of {uri, name}, in the order the server gave them.",
    async check(ctx) {
      const expected = await ctx.reference(`
        const r = await tools.mcp__everything__get_resource_links({ count: 4 });
        return r.content.filter(c => c.type === "resource_link").map(c => ({ uri: c.uri, name: c.name }));`);
      return first(expectCalled(ctx, "mcp__everything__"), expectEqual(ctx.value, expected));
    },
  },
  {
    id: "gzip-resource",
    area: "mcp-everything",
    prompt:
      "Use the everything server to gzip the text \"hello codemode\" (given to it as a data: URI) and have the result returned as an embedded resource, not a link. Return {uri, mimeType, bytes}, where bytes is the size of the decoded gzip data.",
    async check(ctx) {
      const data = "data:text/plain;base64," + Buffer.from("hello codemode").toString("base64");
      const expected = await ctx.reference(`
        const r = await tools.mcp__everything__gzip_file_as_resource({ data: ${JSON.stringify(data)}, outputType: "resource" });
        return r.content.find(c => c.type === "resource").resource;`);
      expected.bytes = Buffer.from(expected.blob, "base64").length;
      // The URI carries the file name, which the script may choose: it only has to be there.
      const uri = ctx.value?.uri;
      return first(
        expectCalled(ctx, "mcp__everything__gzip_file_as_resource"),
        typeof uri === "string" && uri.length > 0 ? null : `the uri is ${JSON.stringify(uri)}, expected the resource's URI`,
        expectEqual(ctx.value?.mimeType, expected.mimeType, "mimeType"),
        expectEqual(ctx.value?.bytes, expected.bytes, "bytes"),
      );
    },
  },
  {
    id: "tiny-image",
    area: "mcp-everything",
    prompt: "Get the tiny MCP logo image from the everything server, show it with image(), and return its MIME type.",
    check(ctx) {
      const shown = (ctx.run.output || []).some((o) => o.type === "image");
      return first(
        expectCalled(ctx, "mcp__everything__get_tiny_image"),
        shown ? null : "the script did not show an image",
        expectEqual(ctx.value, "image/png"),
      );
    },
  },
];

export function findTask(id) {
  return tasks.find((t) => t.id === id);
}

export { memoryGraph };
