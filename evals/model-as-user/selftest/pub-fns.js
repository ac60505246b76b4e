const { paths } = await tools.find({ pattern: "src/**/*.rs" });
const out = {};
await Promise.all(paths.map(async (path) => {
  const { text } = await tools.read({ path });
  const names = [...text.matchAll(/^\s*pub fn (\w+)/gm)].map((m) => m[1]);
  if (names.length) out[path] = names;
}));
return out;
