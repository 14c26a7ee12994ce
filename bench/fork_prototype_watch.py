# The supervisor's side of a forked run, tried from outside while
# bench/fork_prototype.py runs inside a patched sandbox (bench/results/pool.md
# says how): run as root beside it, with a job script that writes
# /work/visible and sleeps. Finds the code process's host pid (NSpid ends in
# 2, three levels: host, the sandbox's run, the run's own; PID 1 is the run's
# init), checks the template's children file names it, opens the fork's /work through /proc/PID/root,
# moves the fork into new cgroups beside the sandbox's (one write per v1
# hierarchy: pids, memory, cpu, cpuacct), and reads /work through the held
# descriptor once the fork is gone; then removes the cgroups it made.
import os
import time


def status(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    except OSError:
        return None


def find_fork(timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            nspid = (status(pid) or {}).get("NSpid", "").split()
            if len(nspid) == 3 and nspid[-1] == "2" and os.path.exists(f"/proc/{pid}/root/work/visible"):
                return int(pid)
        time.sleep(0.05)
    raise SystemExit("no fork found")


child = find_fork(60)
template = int(status(child)["PPid"])
print("fork's host pid", child, "NSpid", status(child)["NSpid"].split(), "template", template)
with open(f"/proc/{template}/task/{template}/children") as f:
    print("the template's children file:", f.read().split())
work = os.open(f"/proc/{child}/root/work", os.O_RDONLY | os.O_DIRECTORY)
print("the fork's /work through /proc/PID/root:", os.listdir(work))
made = []
with open(f"/proc/{child}/cgroup") as f:
    lines = f.read().split()
for line in lines:
    _, controllers, path = line.split(":", 2)
    if controllers in ("pids", "memory", "cpu", "cpuacct") and path != "/":
        new = f"/sys/fs/cgroup/{controllers}{path.rsplit('/', 1)[0]}/issue15-fork-experiment"
        os.mkdir(new)
        made.append(new)
        with open(new + "/cgroup.procs", "w") as f:
            f.write(str(child))
with open(f"/proc/{child}/cgroup") as f:
    print("after the moves:", [line for line in f.read().split() if "experiment" in line])
while status(child):
    time.sleep(0.05)
with open(os.open("visible", os.O_RDONLY, dir_fd=work)) as f:
    print("fork gone; its /work through the held descriptor:", os.listdir(work), f.read())
time.sleep(0.2)
for new in made:
    os.rmdir(new)
print("cgroups removed")
