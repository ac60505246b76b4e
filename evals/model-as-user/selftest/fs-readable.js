const root = (await tools.mcp__filesystem__list_allowed_directories({})).content[0].text.split("\n").filter((l) => l.startsWith("/"))[0].trim();
const names = ["README.md", "/etc/hostname", "docs/missing.md"];
const results = await Promise.all(names.map((n) => tools.mcp__filesystem__read_text_file({ path: n.startsWith("/") ? n : `${root}/${n}` })));
return Object.fromEntries(names.map((n, i) => [n, !results[i].isError]));
