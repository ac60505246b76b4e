const hits = (await tools.grep({ pattern: "#\\[test\\]" })).split("\n").filter(Boolean);
const files = {};
for (const h of hits) { const f = h.split(":")[0]; files[f] = (files[f] ?? 0) + 1; }
return { total: hits.length, files };
