//! `codemode demo`: a script against the built-in tools, in a scratch project made for it.

use std::path::Path;

/// The demo script. It reads, searches, runs a command, tries one write (which the default
/// policy asks about, and denies when nobody is at a terminal), and finds a tool by topic.
pub const DEMO_SCRIPT: &str = r#"// A tour of codemode: several tool calls in one script, run in parallel, filtered here.
const [listing, sources, todos] = await Promise.all([
  tools.ls({}),
  tools.find({ pattern: "**/*.rs" }),
  tools.grep({ pattern: "TODO" }),
]);
text(`Project files: ${listing.entries.map((e) => e.kind === "dir" ? e.name + "/" : e.name).join(", ")}`);
text(`Rust sources (find skips what .gitignore excludes): ${sources.paths.join(", ")}`);
text(`${todos.matches.length} TODO lines:\n${todos.matches.map((m) => `${m.path}:${m.line}: ${m.text.trim()}`).join("\n")}`);

const manifest = await tools.read({ path: "Cargo.toml" });
console.log(`Cargo.toml has ${manifest.totalLines} lines; the first:`, manifest.text.split("\n")[0]);

try {
  const counted = await tools.bash({ command: "wc -l src/*.rs" });
  console.log("bash:", counted.output.trim());
} catch (e) {
  console.log(`bash (stage ${e.stage}):`, e.message);
}

try {
  await tools.write({ path: "NOTES.md", content: "written by the demo\n" });
  console.log("write: allowed");
} catch (e) {
  console.log(`write (stage ${e.stage}):`, e.message);
}

const found = await searchTools("replace text in a file", { limit: 2 });
return { toolsForEditing: found.map((t) => t.name), calls: "see the trace with -v" };
"#;

/// Lays out a tiny Rust project for the demo to explore.
pub fn make_project(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("src"))?;
    std::fs::write(
        dir.join("Cargo.toml"),
        "[package]\nname = \"demo\"\nversion = \"0.1.0\"\nedition = \"2024\"\n",
    )?;
    std::fs::write(
        dir.join("src/main.rs"),
        "mod greet;\n\nfn main() {\n    // TODO: read the name from the command line\n    greet::hello(\"world\");\n}\n",
    )?;
    std::fs::write(
        dir.join("src/greet.rs"),
        "pub fn hello(name: &str) {\n    println!(\"hello, {name}\");\n}\n\n// TODO: a farewell\n",
    )?;
    std::fs::write(dir.join(".gitignore"), "target/\n")?;
    std::fs::create_dir_all(dir.join("target"))?;
    std::fs::write(dir.join("target/ignored.rs"), "// ignored by .gitignore\n")?;
    Ok(())
}
