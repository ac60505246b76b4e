const hits = (await tools.grep({ pattern: "TODO: " })).split("\n").filter(Boolean);
return hits.map((h) => {
  const [, file, line, rest] = h.match(/^([^:]+):(\d+):(.*)$/);
  return { file, line: Number(line), text: rest.split("TODO: ")[1].trim() };
}).sort((a, b) => a.file < b.file ? -1 : a.file > b.file ? 1 : a.line - b.line);
