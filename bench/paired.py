#!/usr/bin/env python3
"""Paired timing of shell commands: A B A B ..., so that a noisy machine
slows both alike. Prints each command's median wall time, the ratio of
medians against the first (the baseline), and the median of per-pair ratios.

usage: paired.py [--rounds N] [--warmup N] [--names A,B,...] [--shuffle SEED] [--json FILE] -- BASELINE OTHER [OTHER ...]
Each command is run through /bin/sh -c; its output is discarded; a command
that fails stops the benchmark.
"""
import argparse
import json
import random
import statistics
import subprocess
import sys
import time


def once(command):
    start = time.perf_counter()
    done = subprocess.run(["/bin/sh", "-c", command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {command}\n{done.stderr.decode()[-2000:]}")
    return elapsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--names", default="", help="comma-separated names for the commands")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--shuffle", type=int, metavar="SEED", help="run each round's commands in a random order (seeded), not alternated"
    )
    parser.add_argument("commands", nargs="+")
    args = parser.parse_args()
    names = args.names.split(",") if args.names else [f"cmd{i}" for i in range(len(args.commands))]
    for _ in range(args.warmup):
        for c in args.commands:
            once(c)
    times = [[] for _ in args.commands]
    shuffler = random.Random(args.shuffle)
    for round_ in range(args.rounds):
        order = list(range(len(args.commands)))
        if args.shuffle is not None:
            # Each round in its own order: a sandbox's run leaves work behind
            # it (its network namespace freed by a kernel worker, its memory
            # cgroup dying), which the command after it pays; with three
            # commands or more, alternating still gives the first sandbox
            # after the baseline a clean start half the time, the others never.
            shuffler.shuffle(order)
        elif round_ % 2:
            # Alternate the order each round so neither side always goes first.
            order.reverse()
        for i in order:
            times[i].append(once(args.commands[i]))
    base = times[0]
    results = []
    for name, command, t in zip(names, args.commands, times):
        ratios = [x / b for x, b in zip(t, base)]
        results.append({
            "name": name,
            "command": command,
            "median_ms": round(statistics.median(t) * 1000, 2),
            "ratio_of_medians": round(statistics.median(t) / statistics.median(base), 3),
            "median_paired_ratio": round(statistics.median(ratios), 3),
        })
    width = max(len(r["name"]) for r in results)
    for r in results:
        print(f"{r['name']:<{width}}  median {r['median_ms']:8.2f} ms   x{r['ratio_of_medians']:.3f} (paired x{r['median_paired_ratio']:.3f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": args.rounds, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
