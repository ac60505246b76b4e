const g = (await tools.mcp__memory__read_graph({})).structuredContent;
const workers = g.relations.filter((r) => r.relationType === "works_on" && r.to === "tally").map((r) => r.from);
await tools.mcp__memory__create_entities({ entities: [{ name: "codemode", entityType: "project", observations: ["runs scripts behind a gate"] }] });
const r = await tools.mcp__memory__create_relations({ relations: workers.map((from) => ({ from, to: "codemode", relationType: "works_on" })) });
return r.structuredContent.relations.length;
