const r = await tools.bash({ command: "find src -name '*.rs' -exec cat {} + | wc -l" });
return Number(r.output.trim());
