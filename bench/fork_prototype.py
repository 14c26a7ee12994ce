# A prototype of issue 15's forked mode, to check the kernel's rules and
# measure what a fork from a pandas-importing template costs, before the
# mode is built into airlock (it is not yet: see docs/design.md, "Forked
# starts"). Not part of airlock; nothing imports it.
#
#   template SECCOMP_BPF   the template: imports the preload, then serves one
#                          fork per line on stdin ("job CSV SCRIPT" or
#                          "probe"), replying one JSON line per fork. Run it
#                          in a user, mount and PID namespace of its own
#                          (`unshare -Urmpf --mount-proc`), where it holds
#                          CAP_SYS_ADMIN as the sandbox's template would.
#   (in a sandbox, AIRLOCK_EXPERIMENT_TEMPLATE=1 in its environment)
#                          the same forks inside a real airlock sandbox whose
#                          helper was patched to leave the code what a
#                          template keeps; see in_sandbox() below.
#   bench ROUNDS PYTHON BARE_SCRIPT CSV SCRIPT SECCOMP_BPF JSON_OUT
#                          the paired benchmark (bench/fork_prototype.sh):
#                          the weighted-median job forked from the template
#                          against bare cold Python, A B A B, the order
#                          swapped every round; jobs per second, one at a
#                          time, each way; then 20 probes of what a fork
#                          sees (randomness, leftovers, PIDs, attempts), and
#                          one run whose code sends itself SIGTERM.
#
# Each run, in this order (the order is the argument): a PID namespace of
# its own, whose PID 1 is a fork of the template that only reaps, as a cold
# run's init (the template unshares the namespace before that fork and
# resets it after); the code's process, a second fork born in it as PID 2,
# so that the template reaps it and reads its wait status. In it: die with
# the template; new mount, IPC, UTS, network and cgroup namespaces; fresh
# tmpfs on /work, /tmp and /dev/shm and a /proc of its PID namespace only,
# with the masks the template's /proc has (a cold run's, copied); the run's
# files copied in; a nested user namespace (in which it holds nothing once
# capabilities are dropped; its mount namespace belongs to the template's
# user namespace, so its mounts are beyond it); the bounding set and every
# capability dropped, no_new_privs; Landlock (writes below /work, /tmp,
# /dev/shm only); every descriptor but 0-2 closed; the run's seccomp filter
# stacked on the template's; random and numpy.random reseeded and checked
# (the run fails, exit 125, if either still holds the template's state);
# then the code.

import ctypes
import json
import os
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
SYS_CAPSET, SYS_SECCOMP = 126, 317
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
SECCOMP_SET_MODE_FILTER = 1
# Read and execute everywhere; everything below the run's own tmpfs.
LANDLOCK_READ = 1 | 4 | 8  # EXECUTE, READ_FILE, READ_DIR
LANDLOCK_FILE_WRITE = 2  # WRITE_FILE, the only write right a rule on a file may hold

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def check(result, what):
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def unshare(flags):
    check(libc.unshare(flags), f"unshare({flags:#x})")


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def prctl(option, arg):
    check(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def write_file(path, text):
    with open(path, "w") as f:
        f.write(text)


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities():
    """The bounding set first (dropping it needs CAP_SETPCAP), then every set."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) == 0:
        cap += 1
    header = CapHeader(0x20080522, 0)
    data = (CapData * 2)()
    check(libc.syscall(SYS_CAPSET, ctypes.byref(header), data), "capset")


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock(writable_dirs, writable_files):
    abi = check(libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), 1), "landlock abi")
    rights = (1 << 13) - 1  # ABI 1: 13 rights
    if abi >= 2:
        rights |= 1 << 13  # REFER
    if abi >= 3:
        rights |= 1 << 14  # TRUNCATE
    attr = RulesetAttr(rights)
    ruleset = check(libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(8), 0), "ruleset")
    for path, access in [("/", LANDLOCK_READ)] + [(d, rights) for d in writable_dirs] + [
        (f, LANDLOCK_FILE_WRITE | 4) for f in writable_files
    ]:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = PathBeneath(access, fd)
        check(libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0), f"landlock rule {path}")
        os.close(fd)
    check(libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock restrict")
    os.close(ruleset)
    return abi


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program):
    """`program`: struct sock_filter instructions as bytes (8 each), as the
    supervisor compiles them; stacked on any filter already in force."""
    buffer = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    check(libc.syscall(SYS_SECCOMP, SECCOMP_SET_MODE_FILTER, 0, ctypes.byref(prog)), "seccomp")


MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096


def proc_masks():
    """The masks over the template's /proc (a cold run's: files behind
    /dev/null, directories behind an empty tmpfs, /proc/sys and /proc/fs
    read-only), from its mount table, in order: (kind, path)."""
    masks = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            root, target = fields[3], fields[4]
            fstype = fields[fields.index("-") + 1]
            if not target.startswith("/proc/"):
                continue
            if fstype == "devtmpfs" and root == "/null":
                masks.append(("null", target))
            elif fstype == "tmpfs":
                masks.append(("empty", target))
            elif fstype == "proc":
                masks.append(("read_only", target))
    return masks


def apply_proc_masks(masks):
    """The same masks over the fork's fresh /proc, which has none."""
    hidden = MS_NOSUID | MS_NODEV | MS_NOEXEC
    for kind, target in masks:
        if not os.path.exists(target):
            continue
        if kind == "null":
            mount("/dev/null", target, None, MS_BIND)
            mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | hidden)
        elif kind == "empty":
            mount("tmpfs", target, "tmpfs", MS_RDONLY | hidden, "size=4k,nr_inodes=1")
        else:
            mount(target, target, None, MS_BIND)
            mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | hidden)


def reseed_or_fail(template_states):
    """New randomness from the kernel for the run's generators; the run
    never starts with the template's."""
    import random

    import numpy

    random.seed()
    numpy.random.seed()
    random_state, numpy_state = template_states
    if random.getstate() == random_state or numpy.random.get_state()[1].tobytes() == numpy_state:
        raise SystemExit(125)


def fork_child(kind, argv, out_fd, seccomp, template_states, masks):
    """The forked run; never returns."""
    try:
        # The run's own streams: the template's standard input carries the
        # next forks' requests.
        os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        # Out of the template's session and process group: kill(0, ...)
        # reaches a whole group across PID namespaces.
        os.setsid()
        prctl(PR_SET_PDEATHSIG, 9)
        # The run's files and code, as the supervisor would copy them in.
        csv, source = b"", {"probe": PROBE, "sigterm": SIGTERM_SELF}.get(kind, "").encode()
        if kind == "job":
            with open(argv[0], "rb") as f:
                csv = f.read()
            with open(argv[1], "rb") as f:
                source = f.read()
        unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET | CLONE_NEWCGROUP)
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        for path in ("/work", "/tmp", "/dev/shm"):
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,nr_inodes=4096,mode=1777")
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        apply_proc_masks(masks)
        libc.sethostname(b"airlock", 7)
        if kind == "job":
            with open("/work/sales.csv", "wb") as f:
                f.write(csv)
        # The nested user namespace: the child's uid (0 in the prototype's
        # template, 1000 in a sandbox's) is 1000 in it.
        uid, gid = os.getuid(), os.getgid()
        unshare(CLONE_NEWUSER)
        write_file("/proc/self/setgroups", "deny")
        write_file("/proc/self/uid_map", f"1000 {uid} 1")
        write_file("/proc/self/gid_map", f"1000 {gid} 1")
        drop_capabilities()
        prctl(PR_SET_DUMPABLE, 0)
        landlock(["/work", "/tmp", "/dev/shm"], ["/dev/null"])
        os.closerange(3, 1 << 16)
        install_seccomp(seccomp)
        reseed_or_fail(template_states)
        os.chdir("/work")
        main = {"__name__": "__main__"}
        exec(compile(source, "job.py", "exec"), main)
        sys.stdout.flush()
        os._exit(0)
    except SystemExit as e:
        sys.stdout.flush()
        os._exit(e.code if isinstance(e.code, int) else 1)
    except BaseException as e:  # noqa: BLE001
        print(f"fork setup or code failed: {e!r}", flush=True)
        os._exit(126)


# The code sends itself SIGTERM: as PID 2 it dies of it, as in a cold run
# (PID 1 of a namespace, it would be dropped by the kernel).
SIGTERM_SELF = "import os\nos.kill(os.getpid(), 15)\nprint('still alive')\n"

PROBE = r"""
import ctypes, json, os, random, stat, sys, threading, time
import numpy
found = {"pid": os.getpid(), "proc": sorted(p for p in os.listdir("/proc") if p.isdigit()),
         "tmp": os.listdir("/tmp"), "work": os.listdir("/work"), "shm": os.listdir("/dev/shm"),
         "random": random.random(), "numpy": float(numpy.random.random()), "urandom": os.urandom(8).hex(),
         "hash": hash("airlock"), "libc_printf": ctypes.cast(ctypes.CDLL(None).printf, ctypes.c_void_p).value,
         "uid": os.getuid(), "hostname": os.uname().nodename,
         "marker_env": os.environ.get("AIRLOCK_PROBE_MARK"), "marker_module": getattr(json, "airlock_mark", None),
         "fake_module": "airlock_fake" in sys.modules, "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
         "threads": len(os.listdir("/proc/self/task")),
         "kallsyms_is_dev_null": stat.S_ISCHR(os.stat("/proc/kallsyms").st_mode),
         "proc_acpi": os.listdir("/proc/acpi") if os.path.isdir("/proc/acpi") else None}
try:
    open("/proc/sys/kernel/hostname", "w").close()
    found["proc_sys"] = "writable"
except OSError as e:
    found["proc_sys"] = os.strerror(e.errno)
found["pgrp"], found["sid"] = os.getpgrp(), os.getsid(0)
libc = ctypes.CDLL(None, use_errno=True)
def attempt(result):
    return "allowed" if result == 0 else f"refused: {os.strerror(ctypes.get_errno())}"
# Undo the fresh /tmp (MNT_DETACH); make a namespace (the filter refuses).
found["attempts"] = {"umount_tmp": attempt(libc.umount2(b"/tmp", 2)),
                     "unshare_user": attempt(libc.unshare(0x10000000))}
# The run's init: its view (the template's) closed to the code, its life
# beyond the code's signals.
try:
    os.listdir("/proc/1/root/")
    found["init_root"] = "readable"
except OSError as e:
    found["init_root"] = os.strerror(e.errno)
os.kill(1, 9)
time.sleep(0.05)
found["init_after_sigkill"] = "alive" if os.path.exists("/proc/1/status") else "gone"
# What the next fork must not find.
for path in ("/tmp/left", "/work/left", "/dev/shm/left"):
    open(path, "w").write("x")
os.environ["AIRLOCK_PROBE_MARK"] = "left"
json.airlock_mark = "left"
sys.modules["airlock_fake"] = type(sys)("airlock_fake")
os.set_inheritable(os.open("/dev/null", os.O_RDONLY), True)
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
if os.fork() == 0:
    os.setsid()
    time.sleep(60)
    os._exit(0)
print(json.dumps(found))
"""


def run_init(run_over, seccomp):
    """PID 1 of the run's PID namespace, as a cold run's init: holds nothing
    (no capability, undumpable, so the code cannot open its /proc/1/root,
    the template's view), reaps orphans, and exits when the template says
    the code has ended; the kernel then ends every process of the
    namespace. Never returns."""
    try:
        os.setsid()
        prctl(PR_SET_PDEATHSIG, 9)
        prctl(PR_SET_DUMPABLE, 0)
        os.closerange(3, run_over)
        os.closerange(run_over + 1, 1 << 16)
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        drop_capabilities()
        install_seccomp(seccomp)
        import select

        while not select.select([run_over], [], [], 0.1)[0]:
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                pass
        os._exit(0)
    except BaseException:  # noqa: BLE001
        os._exit(125)


def fork_once(kind, argv, seccomp, states, own_pid_ns, masks):
    """One forked run: its init, PID 1 of a fresh PID namespace, then the
    code's process, PID 2, born in it (if the init has died, the fork fails
    and so does the run); both the template's children, so the
    template reaps the code and reads its wait status itself. Returns that
    status and the code's output."""
    import select

    run_over_read, run_over_write = os.pipe()
    unshare(CLONE_NEWPID)
    init = os.fork()
    if init == 0:
        os.close(run_over_write)
        run_init(run_over_read, seccomp)
    os.close(run_over_read)
    # The next child is born in the init's namespace too (the template
    # cannot open the init's /proc/PID/ns once it is undumpable; it needs
    # not: its namespace for children is still the init's).
    read_end, write_end = os.pipe()
    code = os.fork()
    if code == 0:
        os.close(read_end)
        os.close(run_over_write)
        fork_child(kind, argv, write_end, seccomp, states, masks)
    # ...and from here on in the template's own again.
    check(libc.setns(own_pid_ns, CLONE_NEWPID), "setns back")
    os.close(write_end)
    output, status = b"", None
    while True:
        if select.select([read_end], [], [], 0.05)[0]:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            output += chunk
        if status is None:
            pid, status = os.waitpid(code, os.WNOHANG)
            if pid == 0:
                status = None
            else:
                # The code ended: the init goes, and with it whatever the code
                # left running (which may hold its output pipe open).
                os.close(run_over_write)
    if status is None:
        _, status = os.waitpid(code, 0)
        os.close(run_over_write)
    os.close(read_end)
    os.waitpid(init, 0)
    return os.waitstatus_to_exitcode(status), output


def template(seccomp_path):
    import random

    import matplotlib
    import numpy
    import pandas  # noqa: F401

    matplotlib.use("agg")
    with open(seccomp_path, "rb") as f:
        seccomp = f.read()
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    masks = proc_masks()
    # What a fork must not keep: the template's generator states.
    states = (random.getstate(), numpy.random.get_state()[1].tobytes())
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        kind, *argv = line.split()
        status, output = fork_once(kind, argv, seccomp, states, own_pid_ns, masks)
        reply = {
            "status": status,
            "output": output.decode(errors="replace"),
            # What the template's PID namespace holds once the fork is reaped:
            # the fork's daemons died with its PID 1.
            "template_sees": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        }
        print(json.dumps(reply), flush=True)


def bench(rounds, python, bare_script, csv, script, seccomp, json_out):
    import statistics
    import subprocess
    import time

    here = os.path.abspath(__file__)
    tmpl = subprocess.Popen(
        ["unshare", "-Urmpf", "--mount-proc", python, "-I", here, "template", seccomp],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert json.loads(tmpl.stdout.readline())["ready"]

    def forked(kind, *argv):
        start = time.perf_counter()
        tmpl.stdin.write(" ".join((kind, *argv)) + "\n")
        tmpl.stdin.flush()
        reply = json.loads(tmpl.stdout.readline())
        return (time.perf_counter() - start) * 1000, reply

    def bare():
        start = time.perf_counter()
        subprocess.run([python, bare_script], check=True, stdout=subprocess.DEVNULL)
        return (time.perf_counter() - start) * 1000

    forked_ms, bare_ms, ratios = [], [], []
    for i in range(rounds):
        if i % 2 == 0:
            a = bare()
            f, reply = forked("job", csv, script)
        else:
            f, reply = forked("job", csv, script)
            a = bare()
        if reply["status"] != 0 or "weighted median price" not in reply["output"]:
            raise SystemExit(f"forked job failed: {reply}")
        forked_ms.append(f)
        bare_ms.append(a)
        ratios.append(f / a)
    # Throughput, one job at a time: forked, then bare cold.
    jobs = max(rounds, 10)
    start = time.perf_counter()
    for _ in range(jobs):
        forked("job", csv, script)
    forked_rate = jobs / (time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(jobs // 2):
        bare()
    bare_rate = (jobs // 2) / (time.perf_counter() - start)
    replies = [forked("probe")[1] for _ in range(20)]
    probes = [json.loads(reply["output"]) for reply in replies]
    template_sees = {tuple(reply["template_sees"]) for reply in replies}
    sigterm = forked("sigterm")[1]
    tmpl.stdin.close()
    tmpl.wait()
    distinct = {key: len({p[key] for p in probes}) for key in ("random", "numpy", "urandom", "hash", "libc_printf")}
    left = [
        p
        for p in probes
        if p["tmp"] or p["work"] or p["shm"] or p["marker_env"] or p["marker_module"] or p["fake_module"]
        or p["fds"] != [0, 1, 2, 3] or p["threads"] != 1 or p["proc"] != ["1", "2"]
        or p["init_root"] == "readable" or p["init_after_sigkill"] != "alive"
    ]
    result = {
        "rounds": rounds,
        "bare_median_ms": round(statistics.median(bare_ms), 1),
        "forked_median_ms": round(statistics.median(forked_ms), 1),
        "forked_p90_ms": round(sorted(forked_ms)[int(0.9 * (rounds - 1))], 1),
        "paired_ratio_median": round(statistics.median(ratios), 3),
        "sequential_jobs_per_s": {"forked": round(forked_rate, 2), "bare": round(bare_rate, 2)},
        "probes": len(probes),
        "distinct_across_probes": distinct,
        "probes_finding_an_earlier_runs_leftovers": len(left),
        "template_pids_after_each_fork": sorted(template_sees),
        "sigterm_to_self": {"status": sigterm["status"], "output": sigterm["output"]},
        "probe_example": probes[0],
        "loadavg": open("/proc/loadavg").read().split()[:3],
    }
    with open(json_out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


def in_sandbox():
    """Inside an airlock sandbox whose helper left the code what a template
    keeps (bench/fork_prototype_in_sandbox.patch): 3 probes, then 10 forked
    weighted-median jobs, timed from the fork to the child reaped."""
    import random
    import time

    import matplotlib  # noqa: F401
    import numpy
    import pandas  # noqa: F401

    with open("/proc/self/status") as f:
        print("template:", [line.strip() for line in f if line.startswith(("Cap", "Uid", "Seccomp", "NoNewPrivs"))])
    with open("/work/default-seccomp.bpf", "rb") as f:
        seccomp = f.read()
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    masks = proc_masks()
    states = (random.getstate(), numpy.random.get_state()[1].tobytes())
    job_ms = []
    for i in range(13):
        kind, argv = ("probe", []) if i < 3 else ("job", ["/work/sales.csv", "/work/weighted_median.py"])
        start = time.perf_counter()
        status, output = fork_once(kind, argv, seccomp, states, own_pid_ns, masks)
        if kind == "probe":
            print("probe", i, "status", status, output.decode(errors="replace").strip())
        elif status != 0 or b"weighted median price" not in output:
            raise SystemExit(f"forked job failed ({status}): {output!r}")
        else:
            job_ms.append(round((time.perf_counter() - start) * 1000, 1))
    print("forked jobs, ms from fork to reaped:", sorted(job_ms), "median", sorted(job_ms)[len(job_ms) // 2])


if __name__ == "__main__" and os.environ.get("AIRLOCK_EXPERIMENT_TEMPLATE") == "1":
    in_sandbox()
elif __name__ == "__main__":
    if sys.argv[1] == "template":
        template(sys.argv[2])
    else:
        bench(int(sys.argv[2]), *sys.argv[3:9])
