"""Times `echo` calls to server-everything over stdio through the official Python MCP SDK.

Run by scripts/bench-mcp (which installs `mcp==2.3.0` into a venv under target/):

    python python_sdk_echo.py SERVER_JS [N] [WARMUP]

Prints one JSON line: per-call median, mean, p99 and the loop's total, in ms. Each call is
timed by the caller around `await session.call_tool(...)` with `time.perf_counter()`, the same
way the script in mcp_latency times its calls with `performance.now()`, so the two sides are
measured alike.
"""

import asyncio
import json
import statistics
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def summary(client, mode, samples_ms, total_ms):
    ordered = sorted(samples_ms)
    return {
        "client": client,
        "mode": mode,
        "n": len(ordered),
        "median_ms": statistics.median(ordered),
        "mean_ms": total_ms / len(ordered),
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "total_ms": total_ms,
    }


async def main():
    server_js = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    warmup = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    params = StdioServerParameters(command="node", args=[server_js])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for i in range(warmup):
                await session.call_tool("echo", {"message": f"w{i}"})
            samples = []
            start = time.perf_counter()
            for i in range(n):
                t = time.perf_counter()
                result = await session.call_tool("echo", {"message": f"m{i}"})
                samples.append((time.perf_counter() - t) * 1e3)
                if result.is_error:
                    raise SystemExit(f"echo failed: {result}")
            total = (time.perf_counter() - start) * 1e3
    print(json.dumps(summary("python-sdk", "sequential", samples, total)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
