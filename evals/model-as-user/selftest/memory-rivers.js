const g = (await tools.mcp__memory__read_graph({})).structuredContent;
return g.entities.filter((e) => e.entityType === "city" && e.observations.some((o) => /river/i.test(o))).map((e) => e.name).sort();
