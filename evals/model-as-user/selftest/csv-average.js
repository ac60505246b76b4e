const { output } = await tools.bash({ command: "cat data/people.csv" });
const by = {};
for (const line of output.trim().split("\n").slice(1)) {
  const [, age, city] = line.split(",");
  (by[city] ??= []).push(Number(age));
}
return Object.fromEntries(Object.entries(by).map(([c, a]) => [c, Math.round(a.reduce((x, y) => x + y, 0) / a.length * 10) / 10]));
