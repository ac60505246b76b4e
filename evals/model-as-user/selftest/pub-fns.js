const files = (await tools.find({ pattern: "src/**/*.rs" })).split("\n").filter(Boolean);
const out = {};
await Promise.all(files.map(async (path) => {
  const { output } = await tools.bash({ command: `cat ${path}` });
  const names = [...output.matchAll(/^\s*pub fn (\w+)/gm)].map((m) => m[1]);
  if (names.length) out[path] = names;
}));
return out;
