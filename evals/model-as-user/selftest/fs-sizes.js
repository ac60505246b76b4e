const root = (await tools.mcp__filesystem__list_allowed_directories({})).content[0].text.split("\n").filter((l) => l.startsWith("/"))[0].trim();
const r = await tools.mcp__filesystem__list_directory_with_sizes({ path: `${root}/src` });
const text = r.content.filter((c) => c.type === "text").map((c) => c.text).join("");
const names = text.split("\n").filter((l) => l.startsWith("[FILE]")).map((l) => l.slice(7).trim().split(/\s+/)[0]);
const infos = await Promise.all(names.map((n) => tools.mcp__filesystem__get_file_info({ path: `${root}/src/${n}` })));
return infos.map((i) => Number(i.content[0].text.match(/size: (\d+)/)[1])).reduce((a, b) => a + b, 0);
