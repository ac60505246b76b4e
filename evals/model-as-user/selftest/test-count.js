const { matches, truncated } = await tools.grep({ pattern: "#\\[test\\]", limit: 100000 });
if (truncated) throw new Error("more tests than grep returned");
const files = {};
for (const m of matches) files[m.path] = (files[m.path] ?? 0) + 1;
return { total: matches.length, files };
