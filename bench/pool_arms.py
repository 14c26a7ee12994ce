#!/usr/bin/env python3
"""The pool's benchmarks (issue 15), each paired against a baseline measured
in the same run, in this one process; ``bench/pool_arms.sh`` sets them up.

  latency ROUNDS CODE_FILE CSV|- -- BARE_COMMAND...
      bare (BARE_COMMAND, a fresh process each time), library (airlock.Pool
      of the Python package: the Rust library in this process, recording
      into an audit store as the server does) and http (POST /v1/runs to
      `airlock serve` with [pool], over loopback, one kept-alive
      connection): the order rotated every round. Each pooled arm waits,
      untimed, until both pools are full before its run. Both pools run in
      POOL_MODE (pooled, the default, or forked).
  throughput MODE SECONDS THREADS CODE_FILE CSV|-
      MODE pooled or forked (a pool of POOL_SIZE, default 2, in that mode)
      or cold (a Sandbox per job): jobs back to back on THREADS threads for SECONDS (the sustained
      rate), then arrivals at a fixed pace of 50 % and 90 % of that rate for
      SECONDS each: latency p50 and p99 from arrival to result, queueing
      included; how many runs the pool served warm (pooled or forked).
  memory MODE SIZE...
      a pool of each SIZE in MODE (pooled, forked), filled: the memory its
      ready sandboxes hold (their cgroups' usage, a forked pool's template
      included), in all and per sandbox; then the same pool's gauges
      from `airlock serve`'s /metrics (server_held_mib,
      server_template_mib).

Environment: AIRLOCK (the airlock binary, for `airlock serve`). Prints one
JSON object per measurement.
"""

import base64
import http.client
import json
import math
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time

from airlock import Pool, Sandbox

TOKEN = "pool-bench-token"
FILL_S = 300


def load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def percentile(values, p):
    ordered = sorted(values)
    rank = min(max(math.ceil(p * len(ordered)), 1), len(ordered))
    return ordered[rank - 1]


def median(values):
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


class Job:
    def __init__(self, code_file, csv):
        self.code = open(code_file).read()
        self.files = {} if csv == "-" else {"/work/sales.csv": open(csv, "rb").read()}

    def body(self):
        files = [{"path": p, "content_base64": base64.b64encode(d).decode()} for p, d in self.files.items()]
        return json.dumps({"code": self.code, "files": files, "outputs": list(self.outputs())})

    def outputs(self):
        return ["/work/out.json"] if self.files else []

    def run_in(self, sb):
        for path, data in self.files.items():
            sb.write(path, data)
        out = sb.run(self.code)
        for path in self.outputs():
            sb.read(path)
        if not out.ok:
            sys.exit(f"a run failed: {out!r} {out.message} {out.stderr}")
        return out


class Server:
    """`airlock serve` with a pool of `size` in `mode`, on loopback."""

    def __init__(self, workdir, size, mode):
        sha = __import__("hashlib").sha256(TOKEN.encode()).hexdigest()
        config = os.path.join(workdir, "airlock.toml")
        with open(config, "w") as f:
            f.write(
                f'listen = "127.0.0.1:0"\nconcurrency = 2\nqueue = 64\n'
                f'audit_db = "{workdir}/server-audit.sqlite3"\n'
                f'[pool]\nsize = {size}\nmode = "{mode}"\n[[tokens]]\nname = "bench"\nsha256 = "{sha}"\n'
            )
        self.log = open(os.path.join(workdir, "server.log"), "w+")
        self.process = subprocess.Popen([os.environ["AIRLOCK"], "serve", "--config", config], stderr=self.log)
        deadline = time.time() + 120
        while True:
            self.log.seek(0)
            found = re.search(r"http://127\.0\.0\.1:(\d+)", self.log.read())
            if found:
                break
            if time.time() > deadline or self.process.poll() is not None:
                self.log.seek(0)
                sys.exit(f"airlock serve did not start: {self.log.read()}")
            time.sleep(0.1)
        self.port = int(found.group(1))
        self.connection = http.client.HTTPConnection("127.0.0.1", self.port)

    def request(self, method, path, body=None):
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        self.connection.request(method, path, body=body, headers=headers)
        response = self.connection.getresponse()
        return response.status, response.read()

    def ready(self):
        _, text = self.request("GET", "/metrics")
        found = re.search(rb"^airlock_pool_ready (\d+)$", text, re.M)
        return int(found.group(1)) if found else 0

    def wait_ready(self, n):
        deadline = time.time() + FILL_S
        while self.ready() < n:
            if time.time() > deadline:
                sys.exit("the server's pool did not refill")
            time.sleep(0.05)

    def run(self, body):
        status, text = self.request("POST", "/v1/runs", body)
        record = json.loads(text)
        if status != 200 or record.get("status") != "ok":
            sys.exit(f"POST /v1/runs: {status}: {text[:2000]!r}")
        return record

    def close(self):
        self.process.terminate()
        self.process.wait(60)


def latency(args):
    split = args.index("--")
    (rounds, code_file, csv), bare = args[:split], args[split + 1 :]
    rounds = int(rounds)
    job = Job(code_file, csv)
    body = job.body()
    with tempfile.TemporaryDirectory() as workdir:
        mode = os.environ.get("POOL_MODE", "pooled")
        server = Server(workdir, 1, mode)
        try:
            with Pool(size=1, mode=mode, audit=os.path.join(workdir, "library-audit.sqlite3")) as pool:

                def both_ready():
                    if not pool.wait_ready(1, FILL_S):
                        sys.exit(f"the library's pool did not refill: {pool.stats()}")
                    server.wait_ready(1)

                def bare_arm():
                    start = time.perf_counter()
                    subprocess.run(bare, check=True, stdout=subprocess.DEVNULL)
                    return (time.perf_counter() - start) * 1000

                def library_arm():
                    both_ready()
                    start = time.perf_counter()
                    with pool.sandbox() as sb:
                        out = job.run_in(sb)
                    ms = (time.perf_counter() - start) * 1000
                    if out.usage.start != mode:
                        sys.exit(f"a library run was not {mode}: {out.record['isolation']}")
                    return ms

                def http_arm():
                    both_ready()
                    start = time.perf_counter()
                    record = server.run(body)
                    ms = (time.perf_counter() - start) * 1000
                    if record["usage"].get("start") != mode:
                        sys.exit(f"an HTTP run was not {mode}: {record['isolation']}")
                    return ms

                arms = [bare_arm, library_arm, http_arm]
                for _ in range(2):
                    for arm in arms:
                        arm()
                load_before = load()
                times = [[], [], []]
                for round_ in range(rounds):
                    for k in range(3):
                        i = (round_ + k) % 3
                        times[i].append(arms[i]())
        finally:
            server.close()
    paired = [[t / b for t, b in zip(times[i], times[0])] for i in range(3)]
    over = [h - lib for h, lib in zip(times[2], times[1])]
    print(
        json.dumps(
            {
                "measure": "latency",
                "mode": mode,
                "code": os.path.basename(code_file),
                "bare": " ".join(bare),
                "rounds": rounds,
                "load_before": load_before,
                "load_after": load(),
                "bare_median_ms": round(median(times[0]), 2),
                "library_median_ms": round(median(times[1]), 2),
                "http_median_ms": round(median(times[2]), 2),
                "library_paired_ratio": round(median(paired[1]), 3),
                "http_paired_ratio": round(median(paired[2]), 3),
                "http_minus_library_paired_median_ms": round(median(over), 2),
            }
        ),
        flush=True,
    )


def throughput(args):
    mode, seconds, threads, code_file, csv = args
    seconds, threads = float(seconds), int(threads)
    job = Job(code_file, csv)
    size = int(os.environ.get("POOL_SIZE", "2"))
    pool = None
    if mode != "cold":
        pool = Pool(size=size, mode=mode)
        if not pool.wait_ready(size, FILL_S):
            sys.exit(f"the pool did not fill: {pool.stats()}")

    def one(arrived):
        if pool is None:
            with Sandbox() as sb:
                out = job.run_in(sb)
        else:
            with pool.sandbox() as sb:
                out = job.run_in(sb)
        return (time.perf_counter() - arrived) * 1000, out.usage.start != "cold"

    for _ in range(threads):
        one(time.perf_counter())
    load_before = load()
    phases = []

    def summary(name, results, elapsed, target=None):
        latencies = [ms for ms, _ in results]
        return {
            "phase": name,
            "target_jobs_per_s": None if target is None else round(target, 3),
            "jobs": len(results),
            "jobs_per_s": round(len(results) / elapsed, 3),
            "served_warm": sum(1 for _, warm in results if warm),
            "p50_ms": round(percentile(latencies, 0.5), 1),
            "p99_ms": round(percentile(latencies, 0.99), 1),
        }

    results, lock = [], threading.Lock()
    start = time.perf_counter()
    until = start + seconds

    def back_to_back():
        while time.perf_counter() < until:
            done = one(time.perf_counter())
            with lock:
                results.append(done)

    workers = [threading.Thread(target=back_to_back) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    rate = len(results) / elapsed
    phases.append(summary("saturated", results, elapsed))

    for share in (0.5, 0.9):
        if pool is not None:
            pool.wait_ready(size, FILL_S)
        target = rate * share
        count = max(1, round(seconds * target))
        arrivals, results = queue.Queue(), []

        def serve():
            while True:
                arrived = arrivals.get()
                if arrived is None:
                    return
                done = one(arrived)
                with lock:
                    results.append(done)

        workers = [threading.Thread(target=serve) for _ in range(threads * 4)]
        for w in workers:
            w.start()
        start = time.perf_counter()
        for n in range(count):
            due = start + n / target
            time.sleep(max(0.0, due - time.perf_counter()))
            arrivals.put(due)
        for _ in workers:
            arrivals.put(None)
        for w in workers:
            w.join()
        phases.append(summary(f"{round(share * 100)}% of the sustained rate", results, time.perf_counter() - start, target))
    if pool is not None:
        pool.close()
    print(
        json.dumps(
            {
                "measure": "throughput",
                "mode": mode,
                "pool_size": None if pool is None else size,
                "threads": threads,
                "seconds_per_phase": seconds,
                "code": os.path.basename(code_file),
                "load_before": load_before,
                "load_after": load(),
                "phases": phases,
            }
        ),
        flush=True,
    )


def memory(args):
    mode, *sizes = args
    for size in map(int, sizes):
        started = time.perf_counter()
        with Pool(size=size, mode=mode) as pool:
            if not pool.wait_ready(size, FILL_S * 4):
                sys.exit(f"the pool did not fill: {pool.stats()}")
            filled = time.perf_counter() - started
            time.sleep(2)
            stats = pool.stats()
        held = stats.memory_bytes
        server = server_memory(size, mode)
        print(
            json.dumps(
                {
                    "measure": "memory",
                    "mode": mode,
                    "size": size,
                    "filled_in_s": round(filled, 1),
                    "held_mib": round(held / 1048576, 1),
                    "per_sandbox_mib": round(held / 1048576 / size, 1),
                    "templates": stats.templates,
                    "template_mib": None
                    if stats.template_memory_bytes is None
                    else round(stats.template_memory_bytes / 1048576, 1),
                    "server_held_mib": server["memory_bytes"],
                    "server_template_mib": server["template_memory_bytes"],
                    "load": load(),
                }
            ),
            flush=True,
        )


def server_memory(size, mode):
    """The same pool's gauges from `airlock serve`'s /metrics, once filled
    and settled. The server's backend loads the native library beside its
    binary (the workspace's `libairlock_fork.so`), the package's its own
    embedded copy, so the two doors can differ where those files do."""
    with tempfile.TemporaryDirectory() as workdir:
        server = Server(workdir, size, mode)
        try:
            server.wait_ready(size)
            time.sleep(2)
            _, text = server.request("GET", "/metrics")
        finally:
            server.close()
    gauges = {}
    for name in ("memory_bytes", "template_memory_bytes"):
        found = re.search(rb"^airlock_pool_" + name.encode() + rb" (\d+)$", text, re.M)
        gauges[name] = round(int(found.group(1)) / 1048576, 1) if found else None
    return gauges


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    {"latency": latency, "throughput": throughput, "memory": memory}[command](rest)
