// Links the wrong people: everyone in the graph, not those who work on tally.
const g = (await tools.mcp__memory__read_graph({})).structuredContent;
const people = g.entities.filter((e) => e.entityType === "person").map((e) => e.name);
await tools.mcp__memory__create_entities({ entities: [{ name: "codemode", entityType: "project", observations: ["runs scripts behind a gate"] }] });
await tools.mcp__memory__create_relations({ relations: people.map((from) => ({ from, to: "codemode", relationType: "works_on" })) });
return people.length;
