// Treats every call that did not throw as a success, ignoring isError.
const root = (await tools.mcp__filesystem__list_allowed_directories({})).content[0].text.split("\n").filter((l) => l.startsWith("/"))[0].trim();
const names = ["README.md", "/etc/hostname", "docs/missing.md"];
const out = {};
for (const n of names) {
  try { await tools.mcp__filesystem__read_text_file({ path: n.startsWith("/") ? n : `${root}/${n}` }); out[n] = true; } catch { out[n] = false; }
}
return out;
