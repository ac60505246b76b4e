"""Reads the JSON lines of scripts/bench-mcp's rounds and prints the figures and ratios.

    python report.py ROUND_FILE...   (one file of JSON lines per round)

Each ratio is taken within a round (the clients ran minutes apart at most, under the same
load), then summarised over the rounds as a range and a median.
"""

import json
import statistics
import sys


def load(path):
    with open(path) as f:
        return {(l["client"], l["mode"]): l for l in map(json.loads, filter(str.strip, f))}


def spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return "-", "-"
    return f"{min(values):.3f}–{max(values):.3f}", f"{statistics.median(values):.3f}"


def main():
    rounds = [load(p) for p in sys.argv[1:]]
    if not rounds:
        raise SystemExit("usage: report.py ROUND_FILE...")
    keys = []
    for r in rounds:
        keys += [k for k in r if k not in keys]
    print(f"\n{len(rounds)} rounds; ms; range over the rounds, then the median of the rounds")
    print(f"| {'client':<13} | {'mode':<10} | {'per-call median':<24} | {'per-call mean (total/N)':<24} | {'total':<28} |")
    print("|" + "---|" * 5)
    for key in keys:
        rows = [r.get(key) for r in rounds]
        cols = []
        for stat in ("median_ms", "mean_ms", "total_ms"):
            lo_hi, mid = spread([row.get(stat) if row else None for row in rows])
            cols.append(f"{lo_hi} ({mid})")
        print(f"| {key[0]:<13} | {key[1]:<10} | {cols[0]:<24} | {cols[1]:<24} | {cols[2]:<28} |")

    def ratio(num, den, stat):
        out = []
        for r in rounds:
            a, b = r.get(num), r.get(den)
            out.append(a[stat] / b[stat] if a and b and b.get(stat) else None)
        return out

    def diff(num, den, stat):
        out = []
        for r in rounds:
            a, b = r.get(num), r.get(den)
            out.append(a[stat] - b[stat] if a and b else None)
        return out

    seq, par = "sequential", "parallel"
    checks = [
        ("script ÷ Python SDK, per-call median", ratio(("script", seq), ("python-sdk", seq), "median_ms"), 1.1),
        ("script ÷ Python SDK, per-call mean", ratio(("script", seq), ("python-sdk", seq), "mean_ms"), 1.1),
        ("script with audit log ÷ Python SDK, median", ratio(("script-audit", seq), ("python-sdk", seq), "median_ms"), 1.1),
        ("script with audit log ÷ Python SDK, mean", ratio(("script-audit", seq), ("python-sdk", seq), "mean_ms"), 1.1),
        ("script 1,000 parallel ÷ TS SDK 1,000 sequential, totals", ratio(("script", par), ("ts-sdk", seq), "total_ms"), 1.0),
        ("same, script with audit log", ratio(("script-audit", par), ("ts-sdk", seq), "total_ms"), 1.0),
        ("script ÷ our Rust client, per-call median", ratio(("script", seq), ("rust-direct", seq), "median_ms"), None),
        ("gate alone ÷ our Rust client, per-call median", ratio(("rust-gate", seq), ("rust-direct", seq), "median_ms"), None),
    ]
    print(f"\n| {'ratio':<56} | {'range':<12} | {'median':<7} | {'target':<6} | met in |")
    print("|" + "---|" * 5)
    for name, values, target in checks:
        lo_hi, mid = spread(values)
        met = "-"
        if target is not None:
            known = [v for v in values if v is not None]
            met = f"{sum(v <= target for v in known)} of {len(known)}"
        shown = f"≤ {target}" if target is not None else "-"
        print(f"| {name:<56} | {lo_hi:<12} | {mid:<7} | {shown:<6} | {met} |")
    if any(("script@before", seq) in r for r in rounds):
        checks = [
            ("before: script ÷ Python SDK, per-call median", ratio(("script@before", seq), ("python-sdk", seq), "median_ms"), 1.1),
            ("before: script with audit log ÷ Python SDK, median", ratio(("script-audit@before", seq), ("python-sdk", seq), "median_ms"), 1.1),
            ("after ÷ before: script, per-call median", ratio(("script", seq), ("script@before", seq), "median_ms"), None),
            ("after ÷ before: script with audit log, per-call median", ratio(("script-audit", seq), ("script-audit@before", seq), "median_ms"), None),
            ("after ÷ before: gate alone, per-call median", ratio(("rust-gate", seq), ("rust-gate@before", seq), "median_ms"), None),
            ("after ÷ before: script 1,000 parallel, total", ratio(("script", par), ("script@before", par), "total_ms"), None),
        ]
        for name, values, target in checks:
            lo_hi, mid = spread(values)
            known = [v for v in values if v is not None]
            met = f"{sum(v <= target for v in known)} of {len(known)}" if target else "-"
            shown = f"≤ {target}" if target else "-"
            print(f"| {name:<56} | {lo_hi:<12} | {mid:<7} | {shown:<6} | {met} |")
    overhead = [
        ("script − our Rust client, per-call median (ms)", diff(("script", seq), ("rust-direct", seq), "median_ms")),
        ("gate alone − our Rust client, per-call median (ms)", diff(("rust-gate", seq), ("rust-direct", seq), "median_ms")),
        ("script with audit − script, per-call median (ms)", diff(("script-audit", seq), ("script", seq), "median_ms")),
    ]
    for name, values in overhead:
        lo_hi, mid = spread(values)
        print(f"| {name:<56} | {lo_hi:<12} | {mid:<7} | -      | -   |")


if __name__ == "__main__":
    main()
