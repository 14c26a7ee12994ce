# airlock's template driver: a forked pool's template serves forks here
# (docs/design.md, "Forked starts"; crates/airlock-linux/src/fork.rs).
#
# driver.py execs this file once its preload is imported and calls serve().
# serve() never returns in the template. For each fork request from the
# supervisor it forks the run's init (PID 1 of a fresh PID namespace) and the
# code's process (PID 2), and returns only in the code's process, its sandbox
# made: driver.py then goes on as the warm driver of that one run.
#
# The template runs no user code and holds no run's data: a request carries
# descriptors only, and the code reaches the fork alone, after the fork. The
# security steps are the native library's (libairlock_fork.so, which the
# supervisor hands the template as a sealed memfd and driver.py loads),
# called with integers only; the forks are os.fork, so CPython's
# at-fork hooks run. Descriptors are kept as plain numbers (never in socket or
# selector objects), so that no object of the template's closes a number a
# fork has reused for something else.
#
# What the supervisor reads (JSON, one message each) is the protocol's
# FromTemplate: "Ready" on the control socket (fd 0), then on each run's
# socket Forked, Setup and Ended, or Failed.

import ctypes
import fcntl
import json
import os
import select
import socket
import sys
import time

_CONTROL = 0
_MAX_FD = 0x7FFFFFFF
# How long a new fork's init has to say it is confined.
_INIT_READY_SECONDS = 10
# The descriptors of a fork request, in the protocol's order (ToTemplate::Fork).
_FORK_FDS = 8
# A fork's exit status when a step of its setup failed.
_SETUP_FAILED = 125


def serve(lib):
    if lib is None:
        raise SystemExit("airlock: the template was not handed its native library, or it would not load")
    for name, arity in (
        ("airlock_fork_unshare_pid", 0),
        ("airlock_fork_join_pid_namespace", 1),
        ("airlock_fork_init", 3),
        ("airlock_fork_child", 3),
    ):
        function = getattr(lib, name)
        function.argtypes = [ctypes.c_int] * arity
        function.restype = ctypes.c_int
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    me = os.pidfd_open(os.getpid())
    _send(_CONTROL, "Ready", [me])
    os.close(me)
    runs = {}
    while True:
        # A new fork's init is waited for here, beside every other run, so
        # that a run which ends meanwhile is reported at once, not after the
        # next fork is made. One whose init is late fails first.
        for run in runs.values():
            if run.ready_deadline is not None and time.monotonic() >= run.ready_deadline:
                run.init_not_ready(b"")
        poller = select.poll()
        poller.register(_CONTROL, select.POLLIN)
        for run in runs.values():
            for fd in run.watched():
                poller.register(fd, select.POLLIN)
        deadlines = [run.ready_deadline for run in runs.values() if run.ready_deadline is not None]
        timeout = None
        if deadlines:
            timeout = max(0, int((min(deadlines) - time.monotonic()) * 1000) + 1)
        for fd, _ in poller.poll(timeout):
            if fd == _CONTROL:
                forked = _on_request(lib, own_pid_ns, runs)
                if forked is not None:
                    # The code's process of a new run: its sandbox is made.
                    return forked
            else:
                for key, run in list(runs.items()):
                    if run.owns(fd):
                        run.on_ready(fd)
                        if run.over:
                            run.close()
                            del runs[key]
                        break


def _on_request(lib, own_pid_ns, runs):
    """One request on the control socket: a fork, or the supervisor gone."""
    carrier = socket.socket(fileno=_CONTROL)
    try:
        message, fds, flags, _ = socket.recv_fds(carrier, 65536, 16)
    finally:
        carrier.detach()
    if not message:
        # The supervisor hung up: the template's work is done. Its forks
        # die with it (each has PR_SET_PDEATHSIG).
        os._exit(0)
    if flags & socket.MSG_CTRUNC or len(fds) != _FORK_FDS or _decode(message) != "Fork":
        # A request that lost descriptors, or is not one: refused, and said so when it can be.
        if len(fds) >= 2:
            _send(fds[1], {"Failed": _failure("read the fork request", f"{len(fds)} descriptors, not {_FORK_FDS}")})
        for fd in fds:
            os.close(fd)
        return None
    run = _fork(lib, own_pid_ns, fds)
    if isinstance(run, _Forked):
        return run.argv
    if run is not None:
        runs[run.socket] = run
    return None


class _Forked:
    """What serve() returns in the code's process."""

    def __init__(self, argv):
        self.argv = argv


def _fork(lib, own_pid_ns, fds):
    plan, run_socket, stdin, stdout, stderr, report, ready, code = fds
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        # A fork keeps only the calling thread, and a process with others
        # must not allocate after a fork.
        _send(run_socket, {"Failed": _failure("fork the run", f"the template has {threads} threads; it forks with one")})
        _close(fds)
        return None
    made = []
    try:
        for _ in range(4):
            made.extend(os.pipe())
    except OSError as error:
        # Out of descriptors, say: this run fails, the template serves on.
        _send(run_socket, {"Failed": _failure("fork the run", f"pipe: {error}", error.errno)})
        _close(fds + made)
        return None
    lifeline_r, lifeline_w, init_ready_r, init_ready_w, go_r, go_w, setup_r, setup_w = made
    saved = _generators()
    errno = lib.airlock_fork_unshare_pid()
    if errno:
        _send(run_socket, {"Failed": _failure("make the run's PID namespace", os.strerror(errno), errno)})
        _close(fds + [lifeline_r, lifeline_w, init_ready_r, init_ready_w, go_r, go_w, setup_r, setup_w])
        return None
    try:
        init_pid = os.fork()
    except OSError as error:
        _send(run_socket, {"Failed": _failure("fork the run's init", str(error), error.errno)})
        _close(fds + made)
        # The namespace for children made above is unused: back to the template's.
        lib.airlock_fork_join_pid_namespace(own_pid_ns)
        return None
    if init_pid == 0:
        _as_fork(lambda: _init(lib, [plan, lifeline_r, init_ready_w]))
    try:
        code_pid = os.fork()
    except OSError as error:
        code_pid = None
        failed = _failure("fork the run's code process", str(error), error.errno)
    if code_pid == 0:
        kept = [stdin, stdout, stderr, report, ready, code, setup_w, plan, lifeline_r, go_r]
        _as_fork(lambda: _child(lib, kept, saved))
        return _Forked(sys.argv)
    errno = lib.airlock_fork_join_pid_namespace(own_pid_ns)
    if errno:
        # Without its own namespace back the template cannot fork again:
        # it ends, and the pool makes another.
        _send(run_socket, {"Failed": _failure("rejoin the template's PID namespace", os.strerror(errno), errno)})
        os._exit(_SETUP_FAILED)
    _close([plan, stdin, stdout, stderr, report, ready, code, lifeline_r, init_ready_w, go_r, setup_w])
    run = _Run(run_socket, init_pid, code_pid, lifeline_w, go_w, setup_r)
    if code_pid is None:
        _send(run_socket, {"Failed": failed})
        run.kill()
        _close([init_ready_r])
        return run
    # The init writes one byte once it is confined (its last step before it
    # reaps); its pipe closes without one if it failed. serve() waits for it.
    run.await_init(init_ready_r)
    return run


class _Run:
    """One run's forks, from the template's side: it is the code's parent
    and reaper, and says how it ended (it runs no user code and no run can
    name it, so its word is the helper's in a cold run)."""

    def __init__(self, run_socket, init_pid, code_pid, lifeline_w, go_w, setup_r):
        self.socket = run_socket
        self.init_pid, self.code_pid = init_pid, code_pid
        self.init_fd = os.pidfd_open(init_pid)
        self.code_fd = os.pidfd_open(code_pid) if code_pid is not None else None
        self.lifeline_w, self.go_w, self.setup_r = lifeline_w, go_w, setup_r
        self.setup = b""
        self.code_end = None if code_pid is not None else {"Exited": -1}
        self.init_end = None
        # How the init ended, when it died before the code (killed by the
        # supervisor, say): the kernel then ended every process of the run.
        self.init_first = None
        self.killed = False
        self.hung_up = False
        self.over = False
        # While the init is being confined: its pipe, and when it is late.
        self.init_ready_r = None
        self.ready_deadline = None

    def await_init(self, init_ready_r):
        self.init_ready_r = init_ready_r
        self.ready_deadline = time.monotonic() + _INIT_READY_SECONDS

    def init_not_ready(self, said):
        """The init failed, or did not say it was confined in time."""
        self._init_answered()
        why = said.decode("utf-8", "replace") or f"it ended, or did not say it was ready in {_INIT_READY_SECONDS} s"
        _send(self.socket, {"Failed": _failure("make the run's init", why)})
        self.kill()

    def _init_answered(self):
        os.close(self.init_ready_r)
        self.init_ready_r = None
        self.ready_deadline = None

    def watched(self):
        if self.init_ready_r is not None:
            # Until the supervisor has its Forked (or Failed), nothing else
            # of the run is read: its messages keep their order.
            return [self.init_ready_r]
        fds = []
        if not self.hung_up:
            fds.append(self.socket)
        if self.setup_r is not None:
            fds.append(self.setup_r)
        if self.code_end is None:
            fds.append(self.code_fd)
        if self.init_end is None:
            fds.append(self.init_fd)
        return fds

    def owns(self, fd):
        return fd in self.watched()

    def on_ready(self, fd):
        if fd == self.init_ready_r:
            said = os.read(self.init_ready_r, 4096)
            if said != b"1":
                self.init_not_ready(said)
                return
            self._init_answered()
            _send(self.socket, {"Forked": {"init_pid": self.init_pid, "code_pid": self.code_pid}}, [self.init_fd, self.code_fd])
        elif fd == self.socket:
            self._on_supervisor()
        elif fd == self.setup_r:
            more = os.read(self.setup_r, 65536)
            self.setup += more
            if not more or len(self.setup) > 65536:
                os.close(self.setup_r)
                self.setup_r = None
                self._say({"Setup": {"report": self.setup.decode("utf-8", "replace")}})
        elif fd == self.code_fd:
            _, status = os.waitpid(self.code_pid, 0)
            self.code_end = _end(status)
            # The run is over: its init goes, and with it every process the
            # code left behind.
            self.kill()
        elif fd == self.init_fd:
            _, status = os.waitpid(self.init_pid, 0)
            self.init_end = _end(status)
            if self.code_end is None:
                self.init_first = self.init_end
        if self.code_end is not None and self.init_end is not None:
            self._say({"Ended": {"code": self.code_end, "init_first": self.init_first}})
            self.over = True

    def _on_supervisor(self):
        try:
            message = os.read(self.socket, 65536)
        except OSError:
            message = b""
        if message and _decode(message) == "Release" and self.go_w is not None:
            # Both processes are in the run's cgroup: the code's process may
            # make its sandbox.
            try:
                os.write(self.go_w, b"g")
            except OSError:
                pass  # the code's process is gone: its end is seen on its pidfd
            os.close(self.go_w)
            self.go_w = None
            return
        # The supervisor hung up (or said what it may not): the run ends,
        # unreported.
        self.hung_up = True
        self.kill()

    def _say(self, message):
        if not self.hung_up:
            _send(self.socket, message)

    def kill(self):
        if self.init_end is None and not self.killed:
            self.killed = True
            try:
                import signal

                signal.pidfd_send_signal(self.init_fd, signal.SIGKILL)
            except OSError:
                pass

    def close(self):
        fds = (self.socket, self.init_fd, self.code_fd, self.lifeline_w, self.go_w, self.setup_r)
        _close([fd for fd in fds if fd is not None])


def _init(lib, fds):
    _arrange(fds)
    return lib.airlock_fork_init(0, 1, 2)


def _child(lib, fds, saved):
    """The code's process: its descriptors at the numbers the native step
    keeps (fork.rs's KEPT_FDS), its own session, the release, the native
    steps, then its generators reseeded."""
    _arrange(fds)
    os.setsid()
    if os.read(9, 1) != b"g":
        os._exit(_SETUP_FAILED)
    os.close(9)
    status = lib.airlock_fork_child(7, 6, 8)
    if status != 0:
        os._exit(status)
    problem = _reseed(saved)
    if problem is not None:
        os.write(6, (json.dumps({"Failed": _failure("reseed the fork's generators", problem)}) + "\n").encode())
        os._exit(_SETUP_FAILED)
    os.close(6)
    return 0


def _as_fork(step):
    """Runs `step` in a fork: it returns normally only in the code's process
    with its sandbox made; any other end is the fork's exit."""
    try:
        if step() == 0:
            return
        os._exit(_SETUP_FAILED)
    except BaseException:  # noqa: BLE001 - a fork never returns into the template's loop
        # Said where the fork's error goes (the init's ready pipe, the code's stderr).
        try:
            import traceback

            os.write(2, traceback.format_exc().encode())
        finally:
            os._exit(_SETUP_FAILED)


def _arrange(fds):
    """Puts `fds` at 0, 1, 2... in order, inheritable, and closes every
    other descriptor."""
    # Above the targets first, so that no target overwrites one still to be moved.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, len(fds)) for fd in fds]
    for number, fd in enumerate(high):
        os.dup2(fd, number, inheritable=True)
    os.closerange(len(fds), _MAX_FD)


def _generators():
    """The template's generators' states, which no fork may keep."""
    import random

    numpy = sys.modules.get("numpy")
    return random.getstate(), numpy.random.get_state()[1].copy() if numpy is not None else None


def _reseed(saved):
    """Reseeds `random` and numpy's global generator from the kernel, and
    draws multiprocessing's authkey anew; the problem, if any still holds
    the template's (fail closed)."""
    import random

    random.seed()
    template_random, template_numpy = saved
    if random.getstate() == template_random:
        return "random kept the template's state"
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
        if template_numpy is not None and (numpy.random.get_state()[1] == template_numpy).all():
            return "numpy.random kept the template's state"
    # multiprocessing draws its authkey once, when its process module is
    # imported (a preload that imports concurrent.futures, joblib or
    # scikit-learn does): each run is its own parent, with a key of its own.
    process = sys.modules.get("multiprocessing.process")
    if process is not None:
        current = process.current_process()
        template_key = bytes(current.authkey)
        current.authkey = os.urandom(32)
        if bytes(current.authkey) == template_key:
            return "multiprocessing kept the template's authkey"
    return None


def _end(status):
    if os.WIFSIGNALED(status):
        return {"Killed": os.WTERMSIG(status)}
    return {"Exited": os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1}


def _failure(step, detail, errno=None):
    return {"step": step, "errno": errno, "detail": detail}


def _decode(message):
    try:
        return json.loads(message)
    except ValueError:
        return None


def _send(fd, message, fds=()):
    carrier = socket.socket(fileno=fd)
    try:
        socket.send_fds(carrier, [json.dumps(message).encode()], list(fds))
    except OSError:
        pass
    finally:
        carrier.detach()


def _close(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
