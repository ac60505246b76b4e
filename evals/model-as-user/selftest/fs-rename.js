const root = (await tools.mcp__filesystem__list_allowed_directories({})).content[0].text.split("\n").filter((l) => l.startsWith("/"))[0].trim();
await tools.mcp__filesystem__move_file({ source: `${root}/docs/changelog.md`, destination: `${root}/docs/CHANGES.md` });
const r = await tools.mcp__filesystem__list_directory({ path: `${root}/docs` });
return r.content[0].text.split("\n").filter((l) => l.startsWith("[FILE]")).map((l) => l.slice(7).trim());
