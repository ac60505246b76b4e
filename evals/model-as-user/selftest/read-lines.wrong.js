// Returns the read tool's text as it is, line numbers included.
return (await tools.read({ path: "src/parser.rs", offset: 24, limit: 3 }));
