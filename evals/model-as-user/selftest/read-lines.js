const { text } = await tools.read({ path: "src/parser.rs", offset: 24, limit: 3 });
return text.replace(/\n$/, "");
