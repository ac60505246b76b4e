const names = (await tools.find({ pattern: "*.md", path: "docs" })).paths.map((p) => p.split("/").pop()).sort();
const lines = await Promise.all(names.map(async (name) => {
  const { output } = await tools.bash({ command: `grep -m1 '^#' docs/${name}` });
  return `- ${name}: ${output.trim().replace(/^#+\s*/, "")}`;
}));
await tools.write({ path: "notes/docs-index.md", content: lines.join("\n") + "\n" });
return (await tools.bash({ command: "cat notes/docs-index.md" })).output;
