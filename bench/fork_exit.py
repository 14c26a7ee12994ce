#!/usr/bin/env python3
"""How long a fork of an interpreter takes to die, by what it imported (issue 15).

A forked run's init is a fork of the template, killed at the run's end
while the record waits; its death tears down its copy of the template's
address space. Each sample: import MODULES (comma-separated, once), fork a
child that only waits for signals, then time SIGKILL to its reaping.
Prints the median of ROUNDS. Run it with the image's interpreter and
site-packages, e.g.

    V=$(ls -d "$AIRLOCK_HOME"/images/*/venv | head -n1)
    for m in "" numpy numpy,pandas,matplotlib; do
        PYTHONPATH=$(ls -d "$V"/lib/python3*/site-packages) OPENBLAS_NUM_THREADS=1 \\
            /root/.pyenv/versions/3.11.7/bin/python3.11 -S bench/fork_exit.py "$m" 40
    done
"""

import os
import signal
import statistics
import sys
import time


def one_death():
    pid = os.fork()
    if pid == 0:
        while True:
            signal.pause()
    time.sleep(0.02)
    started = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return (time.perf_counter() - started) * 1e3


def main():
    modules = [m for m in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if m]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    for module in modules:
        __import__(module)
    deaths = [one_death() for _ in range(rounds)]
    print(f"after importing {modules or 'nothing'}: a fork killed and reaped in {statistics.median(deaths):.3f} ms (median of {rounds})")


if __name__ == "__main__":
    main()
