#!/usr/bin/env python3
"""Where a cold `airlock run` spends its time, phase by phase, against bare
Python's own life, from the kernel's scheduler tracepoints: each process's
exec, fork and exit, stamped by the kernel, with no system call traced (a
`perf trace` or `strace` of a run slows every call and moves the figures).

usage: bench/cold_phases.py [--rounds N] AIRLOCK BARE_PYTHON
  AIRLOCK       the command (its airlock-init beside it), run as
                `AIRLOCK run -c 'print(1+1)'` with this environment's AIRLOCK_HOME
  BARE_PYTHON   bare Python's interpreter (`source bench/bare_venv.sh` makes one)
Needs root and `perf` (Debian: linux-perf). The two commands alternate in the same
rounds. Prints the median of each phase (the first two runs of each left
out, as warm-up):

  command start    the command's exec to its first fork (the setup's helper)
  setup            that fork to the setup helper's exit (the command's own
                   work before it sends the plan, then the sandbox built)
  hand-over        the setup helper's exit to the run's init forked
  run made         the init forked to the code's exec of Python
  python           Python's exec to its exit (bare: the same, for bare Python)
  end              Python's exit to the command's exit (the record, teardown)
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

EVENTS = "sched:sched_process_exec,sched:sched_process_exit,sched:sched_process_fork"
LINE = re.compile(r"\s*(\S+)\s+(\d+)\s+([\d.]+):\s+sched:(\w+):\s*(.*)")


def record(commands, rounds, data):
    """Runs `commands` in turn, `rounds` times, under `perf record` of the
    tracepoints (in the same rounds, so that a noisy machine slows each
    alike); returns the events as (comm, pid, ms, event, detail)."""
    each = " ".join(f"{command} >/dev/null;" for command in commands)
    loop = f"i=0; while [ $i -lt {rounds} ]; do {each} i=$((i+1)); done"
    subprocess.run(["perf", "record", "-q", "-o", data, "-e", EVENTS, "-a", "--", "sh", "-c", loop],
                   check=True, stderr=subprocess.DEVNULL)
    text = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,time,event,trace"],
                          check=True, capture_output=True, text=True).stdout
    events = []
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            comm, pid, seconds, event, detail = match.groups()
            events.append((comm, pid, float(seconds) * 1000, event, detail))
    return events


def exec_name(detail):
    return detail.split("filename=", 1)[1].split()[0] if "filename=" in detail else ""


def airlock_phases(events, airlock):
    runs, run = [], None
    # The processes the run's helpers fork: the init and the code, which
    # is Python once it execs (bare Python's runs interleave with these).
    in_sandbox = set()
    for comm, pid, ms, event, detail in events:
        if event == "sched_process_exec" and exec_name(detail) == airlock:
            run = {"exec": ms, "helper_forks": [], "helper_exits": []}
            runs.append(run)
        elif run is None:
            continue
        elif event == "sched_process_fork" and comm == "airlock" and "first_fork" not in run:
            run["first_fork"] = ms
        elif event == "sched_process_fork" and comm == "airlock-init":
            run["helper_forks"].append(ms)
            in_sandbox.add(detail.rsplit("child_pid=", 1)[-1].split()[0])
        elif event == "sched_process_exec" and comm == "python" and pid in in_sandbox:
            run["python"] = ms
        elif event == "sched_process_exit" and comm == "python" and pid in in_sandbox:
            run["python_end"] = ms
        elif event == "sched_process_exit" and comm == "airlock-init":
            run["helper_exits"].append(ms)
        elif event == "sched_process_exit" and comm == "airlock":
            run["end"] = ms
    phases = []
    for run in runs[2:]:
        if not all(k in run for k in ("first_fork", "python", "python_end", "end")) or not run["helper_exits"]:
            continue
        setup_end = run["helper_exits"][0]
        init_forked = min((ms for ms in run["helper_forks"] if ms > setup_end), default=None)
        if init_forked is None:
            continue
        phases.append({
            "command start": run["first_fork"] - run["exec"],
            "setup": setup_end - run["first_fork"],
            "hand-over": init_forked - setup_end,
            "run made": run["python"] - init_forked,
            "python": run["python_end"] - run["python"],
            "end": run["end"] - run["python_end"],
            "total": run["end"] - run["exec"],
        })
    return phases


def bare_lives(events, python):
    started, lives = {}, []
    for _comm, pid, ms, event, detail in events:
        if event == "sched_process_exec" and exec_name(detail) == python:
            started[pid] = ms
        elif event == "sched_process_exit" and pid in started:
            lives.append(ms - started.pop(pid))
    return lives[2:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("airlock")
    parser.add_argument("bare_python")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("cold_phases.py: the scheduler's tracepoints need root")
    airlock = os.path.abspath(args.airlock)
    with tempfile.TemporaryDirectory() as work:
        data = os.path.join(work, "perf.data")
        commands = [f"{airlock} run -c 'print(1+1)'", f"{args.bare_python} -c 'print(1+1)'"]
        events = record(commands, args.rounds, data)
        phases = airlock_phases(events, airlock)
        lives = bare_lives(events, args.bare_python)
    if not phases or not lives:
        sys.exit("cold_phases.py: no complete run was seen (is the command the README's build, with its helper?)")
    print(f"cold print(1+1), medians of {len(phases)} runs (ms):")
    for name in phases[0]:
        print(f"  {name:14s} {statistics.median(p[name] for p in phases):7.3f}")
    print(f"bare python, exec to exit, median of {len(lives)} runs: {statistics.median(lives):.3f} ms")


if __name__ == "__main__":
    main()
