#!/usr/bin/env python3
"""A run that allows a host, served by `airlock serve` from a pool (its proxy
started at the claim) against the same run on a server without a pool
(cold), and against bare Python, in the same rounds.

Each round, in a shuffled order: one POST /v1/runs to the pooled server
(after its pool is full again, so that every pooled run is a hit), one to
the cold server, and one bare run of the same code. The code imports
pandas and fetches a page from a local HTTP server through the run's proxy
(`policy.allow_hosts`); neither server allows a host by default.

    export AIRLOCK_HOME=...        # a home with the python-data image
    source bench/bare_venv.sh
    python3 bench/pool_network.py --rounds 20 target/bin/airlock "$bare_python"

Prints each arm's median client-side latency (request to response) and its
ratio to bare Python's; the records' `usage.start` say how each run began.
"""

import argparse
import hashlib
import http.server
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

TOKEN = "pool-network-bench"


class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def start_server(airlock, folder, name, port, pooled):
    config = os.path.join(folder, f"{name}.toml")
    with open(config, "w") as f:
        f.write(
            f'listen = "127.0.0.1:0"\nconcurrency = 1\naudit_db = "{folder}/{name}.sqlite3"\n'
            f'[ceiling]\nallow_hosts = ["127.0.0.1:{port}"]\n'
            f'[[tokens]]\nname = "bench"\nsha256 = "{hashlib.sha256(TOKEN.encode()).hexdigest()}"\n'
        )
        if pooled:
            f.write('[pool]\nsize = 1\npreload = ["numpy", "pandas"]\n')
    log = open(os.path.join(folder, f"{name}.log"), "w+")
    server = subprocess.Popen([airlock, "serve", "--config", config], stderr=log, stdout=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        log.seek(0)
        found = re.search(r"serving (http://127\.0\.0\.1:\d+)", log.read())
        if found:
            return server, found.group(1)
        if server.poll() is not None:
            break
        time.sleep(0.1)
    log.seek(0)
    sys.exit(f"{name} server did not start:\n{log.read()[-2000:]}")


def call(url, path, body=None):
    request = urllib.request.Request(
        url + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.read().decode()


def pool_ready(url):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for line in call(url, "/metrics").splitlines():
            if line.startswith("airlock_pool_ready ") and float(line.split()[1]) >= 1:
                return
        time.sleep(0.05)
    sys.exit("the pool did not refill within 120 s")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("airlock")
    parser.add_argument("bare_python")
    args = parser.parse_args()

    page = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    port = page.server_address[1]
    code = (
        "import pandas, urllib.request\n"
        f"print(urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=10).read().decode())\n"
    )
    body = {"code": code, "policy": {"allow_hosts": [f"127.0.0.1:{port}"]}}

    with tempfile.TemporaryDirectory() as folder:
        servers = {}
        try:
            servers["pooled"] = start_server(args.airlock, folder, "pooled", port, True)
            servers["cold"] = start_server(args.airlock, folder, "cold", port, False)
            times = {"bare": [], "pooled": [], "cold": []}
            starts = {"pooled": set(), "cold": set()}
            shuffle = random.Random(args.seed)
            for round_ in range(args.rounds + 2):
                arms = list(times)
                shuffle.shuffle(arms)
                for arm in arms:
                    if arm == "pooled":
                        pool_ready(servers["pooled"][1])
                    began = time.perf_counter()
                    if arm == "bare":
                        out = subprocess.run([args.bare_python, "-c", code], capture_output=True, text=True)
                        elapsed = time.perf_counter() - began
                        assert out.stdout == "hello\n", out
                    else:
                        record = json.loads(call(servers[arm][1], "/v1/runs", body))
                        elapsed = time.perf_counter() - began
                        assert record["stdout"] == "hello\n", record
                        starts[arm].add(record["usage"]["start"])
                    if round_ >= 2:  # two rounds of warm-up
                        times[arm].append(elapsed * 1000)
        finally:
            for server, _ in servers.values():
                server.terminate()
                server.wait()
    bare = statistics.median(times["bare"])
    print(f"{args.rounds} rounds, seed {args.seed}; starts: {({k: sorted(v) for k, v in starts.items()})}")
    for arm, values in times.items():
        median = statistics.median(values)
        print(f"{arm:7} median {median:8.1f} ms   x{median / bare:.3f} bare")


if __name__ == "__main__":
    main()
