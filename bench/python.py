"""The per-run cost of airlock's Python package against the `airlock` command.

Three ways to run `print(1+1)` N times, timed as a whole and divided by N:

  A. python, one sandbox:   with Sandbox() as sb: sb.run("print(1+1)")  x N
  B. shell, airlock run:    for i in $(seq N); do airlock run -c 'print(1+1)'; done
  C. python, new sandbox:   (with Sandbox() as sb: sb.run("print(1+1)"))  x N

B starts a process, checks the policy, finds the image and makes a sandbox
for every run, so C is the like-for-like comparison with it; A is what the
package is for, one sandbox reused. Rounds alternate the order (A B C, C B A)
so that drift in the machine's load falls on all three; ratios are per round,
then the median. Run by bench/python.sh.
"""

import argparse
import statistics
import subprocess
import time

from airlock import Sandbox

CODE = "print(1+1)"


def python_one_sandbox(runs):
    with Sandbox() as sb:
        start = time.perf_counter()
        for _ in range(runs):
            out = sb.run(CODE)
            assert out.stdout == "2\n", out.record
        return (time.perf_counter() - start) / runs


def shell_airlock_run(runs, airlock):
    loop = f"for i in $(seq {runs}); do {airlock} run -c '{CODE}' >/dev/null || exit 1; done"
    start = time.perf_counter()
    subprocess.run(["bash", "-c", loop], check=True)
    return (time.perf_counter() - start) / runs


def python_new_sandbox(runs):
    start = time.perf_counter()
    for _ in range(runs):
        with Sandbox() as sb:
            out = sb.run(CODE)
            assert out.stdout == "2\n", out.record
    return (time.perf_counter() - start) / runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--airlock", required=True, help="the airlock command")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--runs", type=int, default=20, help="runs per way per round")
    args = parser.parse_args()

    ways = {
        "A": ("python: `sb.run` in one sandbox", lambda: python_one_sandbox(args.runs)),
        "B": ("shell: `airlock run -c`", lambda: shell_airlock_run(args.runs, args.airlock)),
        "C": ("python: a new `Sandbox` per run", lambda: python_new_sandbox(args.runs)),
    }
    # Warm up: the image's files, the helper, the interpreter's caches.
    for _, measure in ways.values():
        measure()
    samples = {key: [] for key in ways}
    for round_ in range(args.rounds):
        order = "ABC" if round_ % 2 == 0 else "CBA"
        for key in order:
            samples[key].append(ways[key][1]())

    print(f"{args.rounds} rounds x {args.runs} runs of `{CODE}` each way, order alternating ABC / CBA.\n")
    print("| way | median ms per run | min | max | median ratio to A (paired) |")
    print("|---|---|---|---|---|")
    for key, (label, _) in ways.items():
        ms = [s * 1000 for s in samples[key]]
        ratio = statistics.median(b / a for a, b in zip(samples["A"], samples[key]))
        print(f"| {key}. {label} | {statistics.median(ms):.1f} | {min(ms):.1f} | {max(ms):.1f} | {ratio:.2f} |")
    ratio_cb = statistics.median(c / b for b, c in zip(samples["B"], samples["C"]))
    print(f"\nC against B (a sandbox per run either way), median paired ratio: {ratio_cb:.2f}")


if __name__ == "__main__":
    main()
