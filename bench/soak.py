#!/usr/bin/env python3
"""The soak: many runs through `airlock serve`, then proof that nothing was
left behind. A benchmark-style check, not a timed test: it prints figures
and exits 1 if anything leaked.

  bench/soak.py [--runs 10000] [--clients 16] [--kills 100] [--json FILE]

Phase 1 sends RUNS runs from CLIENTS concurrent clients, in a fixed mix
(ok, failed, timeout, memory kill, output flood, fork bomb, network refused,
copy-out refused), then checks: no process of any run is left (every run's
code carries a marker), no run cgroup, the server's mounts, tmpfs and open
descriptors are what they were after warm-up, it holds no host-id allocation
(a lock-file descriptor), no work directory is left in /tmp, the server's memory is flat after warm-up, and the audit chain
verifies with exactly one entry per answered run.

Phase 2 sends KILLS runs one by one while SIGKILLing the server at random
points (a kill roughly every 10 runs, at a random delay into a run), restarts
it each time, and checks that after the last start-up cleanup nothing is
left and that every run the server acknowledged (answered 200) is in the
audit store.

Uses only the Python standard library; runs the release binaries (build
them first; AIRLOCK_SOAK_PROFILE=debug for the debug ones, as CI does) as the
calling user, with the host's python3 and no image.
"""

import argparse
import base64
import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", os.environ.get("AIRLOCK_SOAK_PROFILE", "release"))
TMP_AT_START = set(os.listdir(tempfile.gettempdir()))
MARKER = f"soak{os.getpid()}x{random.randrange(1 << 30)}"

# The mix: (name, request body, what the answer must say). Each code holds
# the marker, so a process left by any run is found by its command line.
M = f"# {MARKER}"
MIX = [
    ("ok", {"code": f"print(6 * 7) {M}"}, lambda r: r["status"] == "ok" and r["stdout"].strip() == "42"),
    ("failed", {"code": f"raise SystemExit(3) {M}"}, lambda r: r["status"] == "failed"),
    ("timeout", {"code": f"import time\ntime.sleep(30) {M}", "policy": {"timeout_s": 1}},
     lambda r: r["status"] == "timeout"),
    ("memory", {"code": f"b = []\nwhile True: b.append(bytearray(8 << 20)) {M}", "policy": {"memory_mb": 64}},
     lambda r: r["status"] == "memory_limit"),
    ("flood", {"code": f"import sys\nwhile True: sys.stdout.write('x' * 65536) {M}",
               "policy": {"max_output_bytes": 65536, "on_output_limit": "kill", "timeout_s": 10}},
     lambda r: r["status"] == "output_limit"),
    ("forkbomb", {"code": f"bomb() {{ bomb | bomb & }}; bomb; sleep 2 {M}", "language": "sh",
                  "policy": {"pids": 16, "timeout_s": 4}},
     lambda r: "pids" in r["limits_hit"]),
    ("network", {"code": "import socket\ns = socket.socket()\ns.settimeout(2)\n"
                         f"try:\n    s.connect(('1.1.1.1', 80)); print('connected')\nexcept OSError: print('refused') {M}"},
     lambda r: r["status"] == "ok" and r["stdout"].strip() == "refused"),
    ("copyout", {"code": f"import os\nos.symlink('/etc/passwd', '/work/out.txt') {M}", "outputs": ["out.txt"]},
     lambda r: r["status"] == "ok" and [bool(a.get("error")) and not a.get("content_base64")
                                         for a in r.get("artifacts", [])] == [True]),
]


class Server:
    def __init__(self, work, token_sha, concurrency):
        self.work = work
        self.log_path = os.path.join(work, "server.log")
        self.db = os.path.join(work, "audit.sqlite3")
        self.config = os.path.join(work, "airlock.toml")
        with open(self.config, "w") as f:
            f.write(f'listen = "127.0.0.1:0"\npython = "python3"\nconcurrency = {concurrency}\n'
                    f'queue = 1024\naudit_db = "{self.db}"\n'
                    '[ceiling]\ntimeout_s = 30\n'
                    f'[[tokens]]\nname = "soak"\nsha256 = "{token_sha}"\n')
        self.proc = None
        self.url = None

    def start(self):
        env = dict(os.environ, AIRLOCK_HOME=os.path.join(self.work, "home"),
                   AIRLOCK_INIT=os.path.join(BIN, "airlock-init"))
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen([os.path.join(BIN, "airlock"), "serve", "--config", self.config],
                                     stderr=log, stdout=subprocess.DEVNULL, env=env)
        for _ in range(300):
            text = open(self.log_path).read()
            if "serving http://" in text:
                self.url = "http://" + text.split("serving http://")[1].split()[0].rstrip("/,")
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise SystemExit(f"the server did not start: {open(self.log_path).read()[-2000:]}")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)

    def status_kib(self, key):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))

    def fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def host_ids_held(self):
        """Host-id allocations the server holds: each is an open file
        description of the host-id lock file (crates/airlock-linux hostid),
        so a leaked allocation is a descriptor of it left open."""
        held = 0
        for fd in os.listdir(f"/proc/{self.proc.pid}/fd"):
            try:
                held += os.readlink(f"/proc/{self.proc.pid}/fd/{fd}").endswith("/host-ids.lock")
            except OSError:
                pass
        return held

    def mount_table(self):
        """The server's mounts as (mount point, file system type), so a
        change can be named: the server shares the host's mount namespace,
        where anything on the machine may mount (perf mounts tracefs)."""
        with open(f"/proc/{self.proc.pid}/mountinfo") as f:
            return [(line.split(" ")[4], line.split(" - ")[1].split(" ")[0]) for line in f.read().splitlines()]

    def mounts(self):
        table = self.mount_table()
        return len(table), sum(fstype == "tmpfs" for _, fstype in table)


def post(url, token, body, timeout=120):
    request = urllib.request.Request(url + "/v1/runs", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, None
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        # The server died under the request (the SIGKILL phase): not answered.
        return None, None


def leftovers(server_pids):
    """Processes of any run, run cgroups of any server process, airlock's
    entries new in the temporary directory (other than the soak's own)."""
    procs = subprocess.run(["pgrep", "-f", MARKER], capture_output=True, text=True).stdout.split()
    procs = [p for p in procs if int(p) != os.getpid()]
    cgroups = []
    for top, dirs, _ in os.walk("/sys/fs/cgroup"):
        for d in dirs:
            if any(d.startswith(f"airlock-{pid}-") for pid in server_pids):
                cgroups.append(os.path.join(top, d))
    tmp = sorted(d for d in set(os.listdir(tempfile.gettempdir())) - TMP_AT_START if d.startswith("airlock"))
    return procs, cgroups, tmp


def audit(db):
    verify = subprocess.run([os.path.join(BIN, "airlock"), "audit", "--db", db, "verify"], capture_output=True,
                            text=True)
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        ids = {row[0] for row in conn.execute("SELECT run_id FROM runs")}
        count = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    return verify.returncode == 0, verify.stdout.strip() or verify.stderr.strip(), ids, count


def phase_runs(server, token, runs, clients):
    counts = {name: 0 for name, _, _ in MIX}
    wrong, answered, refused = [], [], []
    lock = threading.Lock()
    jobs = iter(range(runs))
    rss = []

    def client():
        while True:
            with lock:
                index = next(jobs, None)
            if index is None:
                return
            name, body, ok = MIX[index % len(MIX)]
            status, record = post(server.url, token, body)
            with lock:
                counts[name] += 1
                if status == 200:
                    answered.append(record["id"])
                    if not ok(record):
                        wrong.append((name, record["status"], record.get("message")))
                else:
                    refused.append((name, status))
                if len(answered) % max(1, runs // 20) == 0:
                    rss.append(server.status_kib("VmRSS"))

    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"seconds": round(time.monotonic() - started, 1), "counts": counts, "answered": answered,
            "wrong": wrong, "refused": refused, "rss_kib": rss}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--kills", type=int, default=100, help="runs of the SIGKILL phase")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    for name in ("airlock", "airlock-serve", "airlock-init"):
        if not os.access(os.path.join(BIN, name), os.X_OK):
            flag = " --release" if BIN.endswith("release") else ""
            raise SystemExit(f"{BIN}/{name} is missing: build it first with cargo build --workspace --bins{flag}")
    token = base64.b32encode(os.urandom(15)).decode()
    work = tempfile.mkdtemp(prefix="airlock-soak-")
    TMP_AT_START.add(os.path.basename(work))
    server = Server(work, hashlib.sha256(token.encode()).hexdigest(), args.concurrency)
    problems = []
    figures = {"runs": args.runs, "clients": args.clients, "concurrency": args.concurrency,
               "cores": os.cpu_count(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    # Phase 1: the mix, from many clients.
    server.start()
    pids = [server.proc.pid]
    warm = phase_runs(server, token, 2 * len(MIX), 4)
    time.sleep(1)
    base = {"rss_kib": server.status_kib("VmRSS"), "fds": server.fds(), "mounts": server.mounts()}
    base_table = server.mount_table()
    main_phase = phase_runs(server, token, args.runs, args.clients)
    time.sleep(2)
    after = {"rss_kib": server.status_kib("VmRSS"), "fds": server.fds(), "mounts": server.mounts()}
    after_table = server.mount_table()
    mounts_changed = {"new": sorted(set(after_table) - set(base_table)),
                      "gone": sorted(set(base_table) - set(after_table))}
    host_ids = server.host_ids_held()
    procs, cgroups, tmp = leftovers(pids)
    answered = warm["answered"] + main_phase["answered"]
    server.stop()
    chain_ok, chain_text, ids, entries = audit(server.db)
    figures["phase1"] = {
        "seconds": main_phase["seconds"], "runs_per_second": round(args.runs / main_phase["seconds"], 1),
        "mix": main_phase["counts"], "answered": len(answered), "not_answered": len(main_phase["refused"]),
        "wrong_outcome": len(main_phase["wrong"]), "audit_entries": entries, "chain": chain_text,
        "rss_kib_after_warmup": base["rss_kib"], "rss_kib_samples": main_phase["rss_kib"],
        "rss_kib_end": after["rss_kib"], "fds_after_warmup": base["fds"], "fds_end": after["fds"],
        "mounts_after_warmup": base["mounts"], "mounts_end": after["mounts"], "mounts_changed": mounts_changed,
        "left": {"processes": procs, "cgroups": cgroups, "work_dirs": tmp, "host_ids": host_ids},
    }
    if main_phase["wrong"]:
        problems.append(f"{len(main_phase['wrong'])} runs ended otherwise than their kind must: "
                        f"{main_phase['wrong'][:5]}")
    if main_phase["refused"]:
        problems.append(f"{len(main_phase['refused'])} runs not answered 200: {main_phase['refused'][:5]}")
    if procs or cgroups or tmp or host_ids:
        problems.append(f"left behind: processes {procs[:5]}, cgroups {cgroups[:5]}, work dirs {tmp[:5]}, "
                        f"host ids still held {host_ids}")
    if after["fds"] > base["fds"] + 2 or after["mounts"] != base["mounts"]:
        problems.append(f"descriptors or mounts grew: {base} -> {after}; mounts new {mounts_changed['new']}, "
                        f"gone {mounts_changed['gone']}")
    # Flat: the end within 25% (and 16 MiB) of the figure after warm-up.
    if after["rss_kib"] > max(base["rss_kib"] * 1.25, base["rss_kib"] + 16384):
        problems.append(f"server memory grew: {base['rss_kib']} KiB after warm-up, {after['rss_kib']} KiB at the end")
    if not chain_ok:
        problems.append(f"the audit chain does not verify: {chain_text}")
    if entries != len(answered) or set(answered) != ids:
        problems.append(f"{entries} audit entries for {len(answered)} answered runs")

    # Phase 2: SIGKILL at random points, restart, nothing left, nothing lost.
    acknowledged, kills = [], 0
    rng = random.Random(16)
    server.start()
    pids.append(server.proc.pid)
    body_cycle = [MIX[0][1], MIX[2][1], MIX[3][1], MIX[5][1]]
    for index in range(args.kills):
        body = body_cycle[index % len(body_cycle)]
        if rng.random() < 0.1:
            result = {}
            thread = threading.Thread(target=lambda: result.update(answer=post(server.url, token, body, 30)))
            thread.start()
            time.sleep(rng.uniform(0.0, 1.5))
            server.kill()
            kills += 1
            thread.join()
            status, record = result.get("answer", (None, None))
            if status == 200:
                acknowledged.append(record["id"])
            server.start()
            pids.append(server.proc.pid)
        else:
            status, record = post(server.url, token, body)
            if status == 200:
                acknowledged.append(record["id"])
    # One run, so the last start's backend probes the host and cleans up.
    status, record = post(server.url, token, MIX[0][1])
    if status == 200:
        acknowledged.append(record["id"])
    time.sleep(2)
    procs, cgroups, tmp = leftovers(pids)
    server.stop()
    chain_ok, chain_text, ids, entries = audit(server.db)
    missing = [i for i in acknowledged if i not in ids]
    figures["phase2"] = {"runs": args.kills, "kills": kills, "acknowledged": len(acknowledged),
                         "missing_from_audit": len(missing), "chain": chain_text,
                         "left": {"processes": procs, "cgroups": cgroups, "work_dirs": tmp}}
    if missing:
        problems.append(f"{len(missing)} acknowledged runs are missing from the audit store: {missing[:5]}")
    if procs or cgroups or tmp:
        problems.append(f"after the kills: processes {procs[:5]}, cgroups {cgroups[:5]}, work dirs {tmp[:5]}")
    if not chain_ok:
        problems.append(f"after the kills the audit chain does not verify: {chain_text}")

    figures["problems"] = problems
    print(json.dumps(figures, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    subprocess.run(["rm", "-rf", work])
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
