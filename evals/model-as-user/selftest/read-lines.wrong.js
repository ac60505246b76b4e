// Keeps the line break that ends line 26.
return (await tools.read({ path: "src/parser.rs", offset: 24, limit: 3 })).text;
