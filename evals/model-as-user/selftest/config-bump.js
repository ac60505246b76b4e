const { output } = await tools.bash({ command: "cat data/config.json" });
const config = JSON.parse(output);
const [a, b, c] = config.version.split(".").map(Number);
config.version = `${a}.${b}.${c + 1}`;
config.debug = true;
await tools.write({ path: "data/config.json", content: JSON.stringify(config, null, 2) + "\n" });
return config.version;
