#!/usr/bin/python3
"""The VM scenarios: real airlock runs inside the guest, each asserting a real
outcome, one line each (`vm-scenario NAME ok|FAIL what`). Run as root by the
guest's airlock-vmtest.service (scripts/vm-test); uses only the guest's
/usr/bin/python3 and airlock's binaries from the checkout.

  root-v2         root on pure cgroup v2: memory kill reported as memory_limit,
                  the pids and CPU caps, nothing left behind; then the pool
                  (`airlock serve` with [pool] size = 2): runs served warm,
                  one killed at a lowered memory limit, and after shutdown
                  no process, cgroup or mount left; then the same pool in
                  the forked mode ([pool] mode = "forked": each run forked
                  from one template, its two processes moved into the run's
                  cgroup from outside), a fork bomb stopped at a lowered
                  process limit too
  user-systemd    an ordinary user in a session scope: a scope delegated by
                  the user's systemd instance, the same limits and the same
                  pools, no root
  userns-off      kernel.unprivileged_userns_clone=0: the run is refused
                  naming the fix, and `airlock doctor` says the same
  landlock-6.1    the record says which Landlock ABI was in force
  landlock-off    (a boot whose lsm= leaves Landlock out) the run is refused
                  naming the lsm= that adds it, and so is doctor; with
                  --allow-degraded landlock it runs and its record says
                  Landlock was not in force
  ubuntu-apparmor (Ubuntu 24.04's kernel and root) an ordinary user under
                  kernel.apparmor_restrict_unprivileged_userns=1: refused
                  naming the profile's install command, doctor too; after
                  the README's install commands, a run with every layer and
                  a memory kill reported as memory_limit
"""

import hashlib
import json
import os
import pwd
import re
import subprocess
import sys
import time
import urllib.request

CHECKOUT = os.environ["AIRLOCK_CHECKOUT"]
BIN = os.path.join(CHECKOUT, "target", os.environ.get("AIRLOCK_VM_PROFILE", "debug"))
AIRLOCK = os.path.join(BIN, "airlock")
USER = "airlock-vm"
TIMEOUT = 240


class Failed(Exception):
    pass


def check(condition, what):
    if not condition:
        raise Failed(what)


def command(args, user=None, home="/tmp/airlock-root", scope=False):
    """The command line and environment of `airlock ARGS`, as root or as the
    test user (inside a session-like scope of the system's systemd when
    `scope`, as a login would put it)."""
    env = {"PATH": "/usr/bin:/bin", "AIRLOCK_HOME": home, "AIRLOCK_INIT": os.path.join(BIN, "airlock-init")}
    line = [AIRLOCK, *args]
    if user is not None:
        entry = pwd.getpwnam(user)
        env["XDG_RUNTIME_DIR"] = f"/run/user/{entry.pw_uid}"
        line = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", *line]
        if scope:
            # What pam_systemd does for a login: a scope in the user's slice,
            # owned by the system's systemd, that the user may not write to.
            line = ["systemd-run", "--quiet", "--scope", f"--slice=user-{entry.pw_uid}.slice", *line]
    return line, env


def airlock(args, home="/tmp/airlock-root", **kw):
    line, env = command(args, home=home, **kw)
    return subprocess.run(line, env=env, capture_output=True, text=True, timeout=TIMEOUT, cwd=home)


def record_of(result):
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError:
        raise Failed(f"no record (exit {result.returncode}): {result.stderr.strip()[-400:]}")


# Wall and CPU time a run may take: under TCG an interpreter's start alone
# takes seconds, and the guest's CPU accounting runs ahead of its clock.
RUN_TIMEOUT = ["--timeout", "120", "--cpu-time", "300"]


def run_py(code, extra=(), **kw):
    return record_of(airlock(["run", "--json", "--python", "/usr/bin/python3", *RUN_TIMEOUT, *extra, "-c", code], **kw))


def leftovers(marker):
    """Processes whose command line holds `marker`, airlock's run cgroups
    (`airlock-PID-START-N`) and its systemd scopes, once systemd has had a
    few seconds to collect an emptied scope."""
    for _ in range(50):
        procs = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
        cgroups = run_cgroups() + subprocess.run(
            ["find", "/sys/fs/cgroup", "-type", "d", "-name", "airlock-*.scope"], capture_output=True, text=True
        ).stdout.split()
        if not procs and not cgroups:
            break
        time.sleep(0.1)
    return procs, cgroups


MEMORY_HOG = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))"
# Forks until the process limit refuses one, and prints how many it made.
FORK_BOMB = ("import os, time\nborn = 0\nfor _ in range(64):\n    try:\n"
             "        if os.fork() == 0:\n            time.sleep(60)\n            os._exit(0)\n"
             "        born += 1\n    except OSError:\n        break\nprint(born)")


def limits(route_word, **kw):
    """The default policy's limits, for real: memory, pids, CPU bandwidth."""
    memory = run_py(MEMORY_HOG, ["--memory", "96"], **kw)
    check(memory["status"] == "memory_limit", f"memory: status {memory['status']}: {memory.get('message')}")
    check("memory" in memory["limits_hit"], f"memory: limits_hit {memory['limits_hit']}")
    details = memory["isolation"]["details"]
    check(details.get("cgroup") == "v2", f"cgroup {details.get('cgroup')}")
    check(route_word in details.get("cgroup_route", ""), f"route: {details.get('cgroup_route')}")
    # Forks until the pids cap refuses one; the children outlive the code's
    # own process, so "nothing left" also covers what a run leaves running.
    marker = f"vmbomb{os.getpid()}"
    bomb = run_py(f"# {marker}\n{FORK_BOMB}", ["--pids", "16"], **kw)
    check("pids" in bomb["limits_hit"], f"pids: limits_hit {bomb['limits_hit']}")
    throttled = cpu_cap(**kw)
    procs, cgroups = leftovers(marker)
    check(not procs and not cgroups, f"left behind: processes {procs}, cgroups {cgroups}")
    born = bomb["stdout"].split()[-1]
    summary = f"{details.get('host_ids', 'host ids unknown').split(',')[0]}: memory_limit at 96 MiB, pids cap stopped the forks at {born}, --cpus 0.5 throttled " \
              f"{throttled} times, nothing left; {details['cgroup_route']}"
    return summary


def run_cgroups():
    return subprocess.run(
        ["find", "/sys/fs/cgroup", "-type", "d", "-name", "airlock-*-*-*"], capture_output=True, text=True
    ).stdout.split()


def cpu_cap(**kw):
    """Half a CPU, as the kernel enforces it: the run's cgroup has
    `cpu.max 50000 100000` and its busy loop is throttled (cpu.stat), read
    from outside while it runs. (Under TCG the guest's CPU accounting and its
    clocks drift apart, so timing it from inside proves nothing.)"""
    code = "import time\nend = time.monotonic() + 4\nwhile time.monotonic() < end: pass"
    home = kw.get("home", "/tmp/airlock-root")
    line, env = command(["run", "--json", "--python", "/usr/bin/python3", *RUN_TIMEOUT, "--cpus", "0.5", "-c", code], **kw)
    proc = subprocess.Popen(line, env=env, cwd=home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cpu_max, throttled = None, 0
    deadline = time.monotonic() + TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline:
        for cgroup in run_cgroups():
            try:
                cpu_max = open(os.path.join(cgroup, "cpu.max")).read().strip()
                stat = dict(row.split() for row in open(os.path.join(cgroup, "cpu.stat")))
                throttled = max(throttled, int(stat.get("nr_throttled", 0)))
            except (OSError, ValueError):
                continue
        time.sleep(0.2)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    record = record_of(subprocess.CompletedProcess(line, proc.returncode, out, err))
    check(record["status"] == "ok", f"cpu: status {record['status']}: {record.get('message')}")
    check(cpu_max == "50000 100000", f"cpu: the run's cpu.max was {cpu_max!r}")
    check(throttled > 0, "cpu: the busy loop was never throttled at --cpus 0.5")
    return throttled


# The pool's preload: modules the guest's interpreter has (it is the host's
# /usr/bin/python3, which has no numpy or pandas), enough to tell a warm
# interpreter from a cold one.
POOL_PRELOAD = ["json", "decimal", "csv"]
POOL_TOKEN = "vm-pool-token"


def descendants(root):
    """Every process below `root` now, as (pid, start time)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = open(f"/proc/{name}/stat").read().rpartition(")")[2].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append((int(name), fields[19]))
    found, todo = [], [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            found.append((pid, start))
            todo.append(pid)
    return found


def still_running(pid, start):
    try:
        return open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[19] == start
    except OSError:
        return False


def airlock_mounts():
    return [line for line in open("/proc/self/mountinfo") if "airlock" in line and " - cgroup" not in line]


def pool(mode="pooled", **kw):
    """`airlock serve` with [pool] size = 2 and `mode` on the guest's
    interpreter: runs served warm (`start: pooled`, or `start: forked` from
    the template, the preload already imported), one killed at a memory limit
    lowered at its claim, in the forked mode a fork bomb stopped at a process
    limit lowered at its claim, and after SIGTERM no process, cgroup
    (airlock's run cgroups, its systemd scopes) or mount left."""
    began = time.monotonic()
    home = kw.get("home", "/tmp/airlock-root")
    config = os.path.join(home, f"pool-{mode}.toml")
    with open(config, "w") as f:
        f.write(f'listen = "127.0.0.1:0"\npython = "/usr/bin/python3"\naudit_db = "{home}/pool-{mode}-audit.sqlite3"\n'
                f"[defaults]\ntimeout_s = 120\ncpu_time_s = 300\n[ceiling]\ntimeout_s = 120\ncpu_time_s = 300\n"
                f'[pool]\nsize = 2\nmode = "{mode}"\npreload = {json.dumps(POOL_PRELOAD)}\n'
                f'[[tokens]]\nname = "vm"\nsha256 = "{hashlib.sha256(POOL_TOKEN.encode()).hexdigest()}"\n')
    os.chmod(config, 0o644)
    mounts_before = airlock_mounts()
    line, env = command(["serve", "--config", config], **kw)
    server = subprocess.Popen(line, env=env, cwd=home, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        address = None
        for text in server.stderr:
            if text.startswith("airlock: serving http://"):
                address = text.split("http://")[1].split()[0]
                break
        if address is None:
            raise Failed(f"{mode}: the server did not start (exit {server.wait()})")

        def call(path, body=None):
            request = urllib.request.Request(f"http://{address}{path}", headers={
                "Authorization": f"Bearer {POOL_TOKEN}", "Content-Type": "application/json"},
                data=None if body is None else json.dumps(body).encode())
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                return response.read().decode()

        def wait_ready(n):
            deadline = time.monotonic() + TIMEOUT
            while time.monotonic() < deadline:
                ready = [l for l in call("/metrics").splitlines() if l.startswith("airlock_pool_ready ")]
                if ready and int(ready[0].split()[1]) >= n:
                    return
                time.sleep(0.2)
            raise Failed(f"{mode}: the pool did not reach {n} ready: {call('/metrics')[-600:]}")

        def served(what, body):
            wait_ready(1)
            record = json.loads(call("/v1/runs", body))
            check(record["usage"].get("start") == mode,
                  f"{mode}: {what} not {mode}: {record['usage'].get('start')}: "
                  f"{record['isolation']['details'].get('pool')} {record.get('message')}")
            return record

        probe = f"import sys\nprint(all(m in sys.modules for m in {POOL_PRELOAD!r}))"
        wait_ready(2)
        ready_after = time.monotonic() - began
        warm = []
        for _ in range(3):
            record = served("a run", {"code": probe})
            check(record["status"] == "ok" and record["stdout"] == "True\n",
                  f"{mode}: {record['status']} {record['stdout']!r}: {record.get('message')} {record['stderr'][-300:]}")
            warm.append(record["usage"].get("first_instruction_ms"))
        killed = served("the memory run", {"code": MEMORY_HOG, "policy": {"memory_mb": 96}})
        check(killed["status"] == "memory_limit", f"{mode}: memory run {killed['status']}: {killed.get('message')}")
        details = killed["isolation"]["details"]
        check(details.get("cgroup") == "v2", f"{mode}: cgroup {details.get('cgroup')}")
        cgroup_route = details.get("cgroup_route", "")
        bombed = ""
        if mode == "forked":
            bomb = served("the fork bomb", {"code": FORK_BOMB, "policy": {"pids": 16}})
            check("pids" in bomb["limits_hit"], f"{mode}: pids: limits_hit {bomb['limits_hit']}: {bomb.get('message')}")
            bombed = f", a fork bomb stopped at a claimed 16 processes after {bomb['stdout'].split()[-1]} forks"
        wait_ready(2)
        started = descendants(server.pid)
        check(len(started) >= 2, f"{mode}: two ready sandboxes, but the server has {len(started)} processes")
        server.terminate()
        check(server.wait(timeout=TIMEOUT) == 0, f"{mode}: the server's exit {server.returncode}")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    procs, cgroups = [], []
    for _ in range(50):
        procs = [pid for pid, start in started if still_running(pid, start)]
        cgroups = [c for c in run_cgroups() if f"airlock-{server.pid}-" in c] + subprocess.run(
            ["find", "/sys/fs/cgroup", "-type", "d", "-name", "airlock-*.scope"], capture_output=True, text=True
        ).stdout.split()
        mounts = [m for m in airlock_mounts() if m not in mounts_before]
        if not procs and not cgroups and not mounts:
            break
        time.sleep(0.1)
    check(not procs and not cgroups and not mounts,
          f"{mode}: left behind: processes {procs}, cgroups {cgroups}, mounts {mounts}")
    return f"{mode} pool of 2 ({','.join(POOL_PRELOAD)}) in {time.monotonic() - began:.1f}s (2 ready at {ready_after:.1f}s): " \
           f"3 runs {mode} (first instruction {warm} ms), memory_limit at a claimed 96 MiB{bombed}, " \
           f"{len(started)} processes, after SIGTERM nothing left; {cgroup_route}"


def root_v2():
    os.makedirs("/tmp/airlock-root", exist_ok=True)
    summary = limits("the system's systemd delegated")
    return f"{summary}; {pool()}; {pool('forked')}"


def add_user():
    try:
        pwd.getpwnam(USER)
    except KeyError:
        # useradd gives the user subordinate ids only where these files
        # exist, as an installed system has them (a bare root may not).
        for path in ("/etc/subuid", "/etc/subgid"):
            open(path, "a").close()
        subprocess.run(["useradd", "--create-home", USER], check=True)
    uid = pwd.getpwnam(USER).pw_uid
    home = f"/home/{USER}"
    # A user manager of its own, with its bus, as a login starts it.
    subprocess.run(["systemctl", "start", f"user@{uid}.service"], check=True, timeout=TIMEOUT)
    for _ in range(200):
        if os.path.exists(f"/run/user/{uid}/bus"):
            break
        time.sleep(0.1)
    return home


def user_systemd():
    home = add_user()
    summary = limits("the user's systemd", user=USER, home=home, scope=True)
    return f"{summary}; {pool(user=USER, home=home, scope=True)}; {pool('forked', user=USER, home=home, scope=True)}"


def userns_off():
    home = add_user()
    with open("/proc/sys/kernel/unprivileged_userns_clone", "w") as f:
        f.write("0")
    try:
        refused = airlock(["run", "--python", "/usr/bin/python3", "-c", "print(1)"], user=USER, home=home, scope=True)
        doctor = airlock(["doctor"], user=USER, home=home, scope=True)
    finally:
        with open("/proc/sys/kernel/unprivileged_userns_clone", "w") as f:
            f.write("1")
    fix = "sudo sysctl -w kernel.unprivileged_userns_clone=1"
    check(refused.returncode == 125, f"run exit {refused.returncode}: {refused.stderr.strip()[-300:]}")
    check(fix in refused.stderr, f"the refusal does not name the fix: {refused.stderr.strip()[-300:]}")
    check(doctor.returncode == 1, f"doctor exit {doctor.returncode}")
    check(fix in doctor.stdout, f"doctor does not name the fix: {doctor.stdout[-400:]}")
    return "refused with exit 125 naming `sysctl -w kernel.unprivileged_userns_clone=1`; doctor says the same, exit 1"


def landlock_61():
    os.makedirs("/tmp/airlock-root", exist_ok=True)
    record = run_py("open('/etc/airlock-vm-probe', 'w')")
    check(record["status"] == "failed", f"writing outside /work: {record['status']}")
    abi = record["isolation"]["details"].get("landlock_abi")
    check(abi == "2", f"landlock_abi {abi} on {os.uname().release}")
    check("landlock" in record["isolation"]["layers"], f"layers {record['isolation']['layers']}")
    return f"landlock_abi {abi} in force (writes outside /work refused); layers list landlock"


def refusal_and_doctor(fix, **kw):
    """A default-policy run and `airlock doctor`, both refused naming `fix`."""
    refused = airlock(["run", "--python", "/usr/bin/python3", "-c", "print(1)"], **kw)
    doctor = airlock(["doctor"], **kw)
    check(refused.returncode == 125, f"run exit {refused.returncode}: {refused.stderr.strip()[-300:]}")
    check(fix in refused.stderr, f"the refusal does not name {fix!r}: {refused.stderr.strip()[-400:]}")
    check(doctor.returncode == 1, f"doctor exit {doctor.returncode}: {doctor.stdout[-300:]}")
    check(fix in doctor.stdout, f"doctor does not name {fix!r}: {doctor.stdout[-600:]}")
    return refused


def landlock_off():
    os.makedirs("/tmp/airlock-root", exist_ok=True)
    started = open("/sys/kernel/security/lsm").read().strip()
    check("landlock" not in started.split(","), f"this boot started landlock: {started}")
    fix = "lsm=" + ",".join(["landlock", *(m for m in started.split(",") if m != "capability")])
    refused = refusal_and_doctor(fix)
    check("--allow-degraded landlock" in refused.stderr, f"the refusal does not offer --allow-degraded landlock: {refused.stderr[-300:]}")
    # A shell run: the interpreter's start under TCG would double the cost.
    line = ["run", "--json", "--python", "/usr/bin/python3", "--lang", "sh", *RUN_TIMEOUT, "--allow-degraded",
            "landlock", "-c", "echo without landlock"]
    record = record_of(airlock(line))
    isolation = record["isolation"]
    check(record["status"] == "ok", f"degraded run: status {record['status']}: {record.get('message')}")
    check("landlock" not in isolation["layers"], f"layers {isolation['layers']} list landlock")
    check(isolation.get("degraded") == ["landlock"], f"degraded {isolation.get('degraded')}")
    check("landlock_abi" not in isolation["details"], f"details {isolation['details']}")
    return f"lsm {started}: refused (exit 125) naming `{fix}`, doctor too (exit 1); " \
           f"--allow-degraded landlock ran ok, record degraded {isolation['degraded']}, layers without landlock"


def readme_apparmor_install():
    """The README's install commands for the AppArmor profile, as written
    there (its "Ubuntu 24.04" block), so this scenario proves what users run."""
    readme = open(os.path.join(CHECKOUT, "README.md")).read()
    section = readme[readme.index("**Ubuntu 24.04**"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    check(block is not None and "apparmor_parser" in block.group(1), "the README has no AppArmor install block")
    return block.group(1)


def ubuntu_apparmor():
    home = add_user()
    profile = "/etc/apparmor.d/airlock-init"
    check(not os.path.exists(profile), f"{profile} exists before the scenario")
    sysctl = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
    booted = open(sysctl).read().strip()
    with open(sysctl, "w") as f:
        f.write("1")
    refusal_and_doctor("sudo apparmor_parser -r /etc/apparmor.d/airlock-init", user=USER, home=home, scope=True)
    # The README's commands, run from the checkout with airlock on PATH, as
    # its reader would (they are root there; sudo as root asks nothing).
    install = subprocess.run(["bash", "-euc", readme_apparmor_install()], cwd=CHECKOUT, capture_output=True,
                             text=True, timeout=TIMEOUT, env={"PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin"})
    check(install.returncode == 0, f"the README's install failed ({install.returncode}): {install.stderr[-400:]}")
    loaded = open("/sys/kernel/security/apparmor/profiles").read()
    check("airlock-init" in loaded, "the profile is not loaded")
    record = run_py("print('under apparmor')", user=USER, home=home, scope=True)
    isolation = record["isolation"]
    check(record["status"] == "ok", f"run: status {record['status']}: {record.get('message')}")
    wanted = {"user_namespace", "seccomp", "landlock", "cgroups"}
    check(wanted <= set(isolation["layers"]), f"layers {isolation['layers']}")
    check(not isolation.get("degraded"), f"degraded {isolation.get('degraded')}")
    summary = limits("the user's systemd", user=USER, home=home, scope=True)
    apparmor = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "apparmor"], capture_output=True, text=True).stdout
    return f"restrict_unprivileged_userns {booted} at boot, set 1; refused naming the profile's install, doctor too; " \
           f"after the README's install (AppArmor {apparmor}) layers {','.join(isolation['layers'])}; {summary}"


SCENARIOS = {
    "root-v2": root_v2,
    "user-systemd": user_systemd,
    "userns-off": userns_off,
    "landlock-6.1": landlock_61,
    "landlock-off": landlock_off,
    "ubuntu-apparmor": ubuntu_apparmor,
}


def main():
    wanted = os.environ.get("AIRLOCK_VM_SCENARIOS", "all").split()
    names = list(SCENARIOS) if wanted in (["all"], []) else wanted
    print(f"vm-scenario kernel {os.uname().release}, cgroup {open('/sys/fs/cgroup/cgroup.controllers').read().strip()}",
          flush=True)
    failed = 0
    for name in names:
        started = time.monotonic()
        try:
            what = SCENARIOS[name]()
            verdict = "ok"
        except (Failed, subprocess.SubprocessError, OSError, KeyError, ValueError) as error:
            what, verdict = f"{type(error).__name__}: {error}", "FAIL"
            failed += 1
        print(f"vm-scenario {name:<15} {verdict:<4} {time.monotonic() - started:5.1f}s  {what}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
