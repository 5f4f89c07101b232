"""The agent's footprint: resident memory after start and one inventory cycle, and the cycle's time.

Run: ``.venv/bin/python bench/agent_footprint.py [--cycles 200]``

Each measurement runs in a fresh interpreter, as the agent does under
systemd. The agent process does what ``better-compute-agent run`` does before
its first cycle (import itself, its HTTP client and the NVML bindings) and
takes the recorded DGX H100's inventory through the fake NVML; its RSS is read
after that first cycle. Baselines in the same run: a bare interpreter, and one that
only imports aiohttp (the HTTP client the agent does not use, for scale). Targets: RSS ≤ 40 MB, one
inventory cycle ≤ 20 ms.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "agent" / "fixtures" / "host-fixtures.json"

PROBE = """
import json, sys, time, resource
started = time.perf_counter()
{imports}
imported = time.perf_counter() - started
cycles = []
{cycle}
import psutil
rss = psutil.Process().memory_info().rss
print(json.dumps({{"rss_mb": rss / 2**20, "import_s": imported, "cycles": cycles}}))
"""

# What `better-compute-agent run` does before its first cycle: import itself and the bindings.
AGENT_IMPORTS = "import agent.main; agent.main.load_pynvml()"
AGENT_CYCLE = f"""
from pathlib import Path
from agent.inventory import collect_inventory
for _ in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    collect_inventory(fixture=Path({str(FIXTURES)!r}), fixture_host="dgx-h100-01")
    cycles.append(time.perf_counter() - t0)
"""


def probe(imports: str, cycle: str, cycles: int) -> dict[str, object]:
    code = PROBE.format(imports=imports, cycle=cycle)
    done = subprocess.run(
        [sys.executable, "-c", code, str(cycles)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    return dict(json.loads(done.stdout))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=200)
    args = parser.parse_args()
    bare = probe("pass", "", 0)
    client = probe("import aiohttp", "", 0)
    agent = probe(AGENT_IMPORTS, AGENT_CYCLE, args.cycles)
    one = probe(AGENT_IMPORTS, AGENT_CYCLE, 1)
    times = sorted(agent["cycles"])  # type: ignore[arg-type]
    first = one["cycles"][0]  # type: ignore[index]
    print(f"{'process':<44} {'RSS MB':>7}")
    print(f"{'bare interpreter (baseline)':<44} {bare['rss_mb']:>7.1f}")
    print(f"{'interpreter + aiohttp (baseline)':<44} {client['rss_mb']:>7.1f}")
    print(f"{'agent after start + 1 inventory cycle':<44} {one['rss_mb']:>7.1f}")
    print(f"{f'agent after {args.cycles} cycles':<44} {agent['rss_mb']:>7.1f}")
    print(
        f"inventory cycle, DGX H100 recording: first {first * 1000:.2f} ms, "
        f"median {times[len(times) // 2] * 1000:.2f} ms, p99 {times[int(len(times) * 0.99)] * 1000:.2f} ms"
    )
    print(f"agent RSS <= 40 MB: {'PASS' if one['rss_mb'] <= 40 else 'FAIL'}")  # type: ignore[operator]
    print(f"inventory cycle <= 20 ms: {'PASS' if first <= 0.020 else 'FAIL'}")  # type: ignore[operator]
    return 0


if __name__ == "__main__":
    sys.exit(main())
