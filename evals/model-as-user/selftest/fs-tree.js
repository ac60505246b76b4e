const root = (await tools.mcp__filesystem__list_allowed_directories({})).content[0].text.split("\n").filter((l) => l.startsWith("/"))[0].trim();
const out = [];
const walk = (nodes, prefix) => { for (const n of nodes) { const p = prefix + n.name; if (n.type === "directory") walk(n.children ?? [], p + "/"); else out.push(p); } };
for (const dir of ["docs", "src"]) {
  const r = await tools.mcp__filesystem__directory_tree({ path: `${root}/${dir}` });
  walk(JSON.parse(r.content[0].text), dir + "/");
}
return out.sort();
