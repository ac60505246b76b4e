const g = (await tools.mcp__memory__read_graph({})).structuredContent;
const names = g.relations.filter((r) => r.relationType === "lives_in" && r.to === "Paris").map((r) => r.from).sort();
await tools.mcp__memory__add_observations({ observations: names.map((entityName) => ({ entityName, contents: ["moved in 2024"] })) });
return names;
