#!/usr/bin/env python3
"""The supervisor's CPU time per second of a flooding run, and how long past
its wall limit the run stops.

The code: forty processes tee(2) a 1 MiB pipe into stdout and stderr (each
enlarged to 1 MiB) as fast as the kernel lets them: no copy for them, a copy
of every byte for whoever reads. The run has a 3 s wall limit. For each
`airlock` binary given, each round, the supervisor process's own CPU time
(utime + stime of the `airlock` process from /proc/PID/stat, its threads
included, its children not) is sampled every 50 ms until it exits; the last
sample, over the run's `wall_ms`, is its CPU per second of flood. Rounds
alternate between the binaries (A B A B), as the machine is shared.

usage: bench/flood.py [--rounds N] [--json OUT] NAME=PATH/TO/airlock ...
(each airlock's helper is the airlock-init beside it)
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "flood_code.py")) as f:
    FLOOD = f.read()
TICK = os.sysconf("SC_CLK_TCK")


def own_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def one_run(airlock, home):
    env = {
        "PATH": "/usr/bin:/bin",
        "AIRLOCK_HOME": home,
        "AIRLOCK_INIT": os.path.join(os.path.dirname(airlock), "airlock-init"),
    }
    out = tempfile.TemporaryFile()
    started = time.monotonic()
    child = subprocess.Popen(
        [airlock, "run", "--json", "--python", "/usr/bin/python3", "--timeout", "3", "--cpus", "2", "-c", FLOOD],
        env=env,
        stdout=out,
        stderr=subprocess.DEVNULL,
    )
    cpu = 0.0
    while child.poll() is None:
        try:
            cpu = own_cpu(child.pid)
        except (OSError, IndexError):
            pass
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    out.seek(0)
    record = json.loads(out.read())
    wall = record["usage"].get("wall_ms", 0) / 1000
    return {
        "status": record["status"],
        "wall_s": wall,
        "command_s": round(elapsed, 3),
        "supervisor_cpu_s": cpu,
        "cpu_per_flood_s": round(cpu / wall, 3) if wall else None,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    parser.add_argument("binaries", nargs="+")
    args = parser.parse_args()
    binaries = [b.split("=", 1) for b in args.binaries]
    results = {name: [] for name, _ in binaries}
    with tempfile.TemporaryDirectory() as home:
        for _ in range(args.rounds):
            for name, path in binaries:
                results[name].append(one_run(path, home))
    summary = {}
    for name, runs in results.items():
        per = [r["cpu_per_flood_s"] for r in runs if r["cpu_per_flood_s"] is not None]
        summary[name] = {
            "runs": runs,
            "median_supervisor_cpu_per_flood_s": statistics.median(per) if per else None,
            "max_wall_s": max(r["wall_s"] for r in runs),
            "max_command_s": max(r["command_s"] for r in runs),
        }
        print(
            f"{name}: supervisor CPU per second of flood, median {summary[name]['median_supervisor_cpu_per_flood_s']}"
            f" s/s; run wall (limit 3 s) max {summary[name]['max_wall_s']} s; whole command max"
            f" {summary[name]['max_command_s']} s; statuses {[r['status'] for r in runs]}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
