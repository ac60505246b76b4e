const g = (await tools.mcp__memory__read_graph({})).structuredContent;
const lives = g.relations.filter((r) => r.relationType === "lives_in");
const city = lives.find((r) => r.from === "Grace").to;
return lives.filter((r) => r.to === city && r.from !== "Grace").map((r) => r.from).sort();
