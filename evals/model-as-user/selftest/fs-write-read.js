const root = (await tools.mcp__filesystem__list_allowed_directories({})).content[0].text.split("\n").filter((l) => l.startsWith("/"))[0].trim();
await tools.mcp__filesystem__create_directory({ path: `${root}/notes` });
await tools.mcp__filesystem__write_file({ path: `${root}/notes/todo.txt`, content: "alpha\nbeta\ngamma\n" });
const r = await tools.mcp__filesystem__read_text_file({ path: `${root}/notes/todo.txt` });
return r.content[0].text.split("\n").filter(Boolean).length;
