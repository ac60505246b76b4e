const r = await tools.mcp__everything__get_resource_links({ count: 4 });
return r.content.filter((c) => c.type === "resource_link").map(({ uri, name }) => ({ uri, name }));
