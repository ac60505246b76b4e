const { matches } = await tools.grep({ pattern: "TODO: " });
return matches.map((m) => ({ file: m.path, line: m.line, text: m.text.split("TODO: ")[1].trim() }))
  .sort((a, b) => a.file < b.file ? -1 : a.file > b.file ? 1 : a.line - b.line);
