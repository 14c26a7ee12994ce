#!/usr/bin/env python3
"""How long an interpreter's exit takes, by what it imported (issue 15).

A pooled run's interpreter has imported the preload, so its exit (the
kernel freeing its address space) is on the run's path; bare `python -c`
exits holding almost nothing. Each sample: a child imports MODULES, writes
one byte, and calls os._exit(0); the time is from that byte to the child's
reaping. Run it with the image's interpreter and site-packages, e.g.

    V=$(ls -d "$AIRLOCK_HOME"/images/*/venv | head -n1)
    PYTHONPATH=$(ls -d "$V"/lib/python3*/site-packages) \\
        /root/.pyenv/versions/3.11.7/bin/python3.11 -S bench/interpreter_exit.py 'import pandas, numpy, matplotlib'
"""

import os
import statistics
import subprocess
import sys
import time


def main():
    imports = sys.argv[1] if len(sys.argv) > 1 else "pass"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    code = f"import os, sys\n{imports}\nsys.stdout.write('x'); sys.stdout.flush(); os._exit(0)"
    samples = []
    for _ in range(rounds):
        child = subprocess.Popen([sys.executable, "-S", "-c", code], stdout=subprocess.PIPE)
        if child.stdout.read(1) != b"x":
            sys.exit(f"the child failed: {child.wait()}")
        began = time.perf_counter()
        child.wait()
        samples.append((time.perf_counter() - began) * 1000)
    print(f"{imports!r}: exit median {statistics.median(samples):.2f} ms, min {min(samples):.2f} ms ({rounds} rounds)")


if __name__ == "__main__":
    main()
