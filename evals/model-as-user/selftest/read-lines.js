const { output } = await tools.bash({ command: "sed -n 24,26p src/parser.rs" });
return output.replace(/\n$/, "");
