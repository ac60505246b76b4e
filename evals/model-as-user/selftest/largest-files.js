const { output } = await tools.bash({ command: "find . -type f -printf '%s %P\\n' | sort -rn | head -3" });
return output.trim().split("\n").map((l) => { const [bytes, path] = l.split(" "); return { path, bytes: Number(bytes) }; });
