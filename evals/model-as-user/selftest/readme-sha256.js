return (await tools.bash({ command: "sha256sum README.md" })).output.split(" ")[0];
