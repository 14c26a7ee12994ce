# airlock's Python driver: runs the user's code the way a notebook runs a cell.
#
# It adds what a notebook adds to a plain `python script.py`: the last
# expression, found by a notebook's rules (the last statement, also on a line
# it shares with others; not when a `;` ends it), comes back as `value` and as
# a rich result; `display()` is a builtin whose every call is a rich result
# (text/plain, text/html, image/png and the like, in order, each capped); an
# uncaught exception comes back as a structured `error` whose line is the
# user's own (the last frame in the code, library frames kept in the
# traceback) and whose traceback has this file's frames removed; every
# matplotlib figure shown or still open at the end comes back as a PNG.
#
# It runs inside the sandbox, in the same process as the user's code, so the
# supervisor treats everything it reports as untrusted data: parsed with caps,
# PNGs re-checked, never used to decide a status or a limit.
#
# Start-up cost matters: every run pays it. So this file holds only what every
# run needs and imports only modules built into the interpreter or frozen in
# it, never `os` (a warm driver imports ctypes before its preload, before any
# run); what is needed only when there is something to report (an error,
# figures) lives in driver_report.py, beside it, loaded then.
# driver_start.py, Python's script, runs this file, from its bytecode when it
# can trust it (see there), and leaves its `_code_of` here, which loads
# driver_report.py the same way. Where the supervisor knows what Python's
# `site` module would set up, Python starts without it and the driver sets it
# up (_set_up_site); and every run ends without the interpreter's teardown
# (_end).
#
# argv: driver_start.py SITE CODE_PATH DISPLAY_NAME REPORT_PATH VALUE_CAP MAX_FIGURES FIGURE_CAP MAX_RESULTS
#       [READY_PATH [warm huge|small PRELOAD...]]
#
# SITE is "-" when Python's own `site` ran, else the prefix of the venv whose
# `site` the driver sets up (Python was started with -S).
#
# With READY_PATH (a FIFO), the driver writes b"C" there just before the
# code's first instruction. A warm driver (a pooled sandbox, made before any
# run claimed it) first imports each PRELOAD module (with `huge`, from
# arenas aligned for huge pages, and then moves their memory into huge
# pages: see _align_arenas and _collapse_into_huge_pages), unmaps their
# libraries' pages (_unmap_file_pages), writes b"P", and then
# blocks on CODE_PATH, a FIFO, until the run's code arrives: a line of four
# lengths, then the display name, the working directory, the variables the
# run sets (NAME=VALUE) or removes (NAME), each ended by a NUL, and the code.
# The supervisor keeps the clocks from that moment on.
#
# A template (a forked pool's, with `template` for `warm`) imports the
# preload and then serves forks (driver_template.py); each fork returns here
# as a warm driver of its own run. Its paths are then `fd:N`: descriptors
# the template arranged, not files.

import gc
import sys

_DRIVER_FILE = __file__
_DRIVER_DIR = _DRIVER_FILE.rpartition("/")[0]


def _run():
    _set_up_site(sys.argv[1])
    _enter_work_dir()
    code_path, display_name, report_path = sys.argv[2], sys.argv[3], sys.argv[4]
    value_cap, max_figures, figure_cap, max_results = (int(x) for x in sys.argv[5:9])
    code_path, report_path = _path(code_path), _path(report_path)
    ready_path = _path(sys.argv[9]) if len(sys.argv) > 9 else None
    template = sys.argv[10:11] == ["template"]
    warm = template or sys.argv[10:11] == ["warm"]
    state = {
        "report": {},
        "figures": [],
        "results": [],
        "code_file": display_name,
        "value_cap": value_cap,
        "max_figures": max_figures,
        "figure_cap": figure_cap,
        "max_results": max_results,
    }
    _register_matplotlib_backend(state)
    _register_display(state)

    if warm:
        native = _take_native()
        huge = sys.argv[11:12] == ["huge"]
        if huge and native is not None:
            _align_arenas(native)
        for module in sys.argv[12:]:
            __import__(module)
        if huge:
            _collapse_into_huge_pages()
        if template:
            # Returns only in a fork, its sandbox made, for its own run.
            namespace = {"__name__": "airlock_driver_template", "__file__": _DRIVER_DIR + "/driver_template.py"}
            exec(_code_of(namespace["__file__"]), namespace)
            namespace["serve"](native)
            _FORKED.append(True)
        else:
            # (A template's forks start without these mappings' page table
            # entries anyway.)
            _unmap_file_pages()
    ready = open(ready_path, "wb", buffering=0) if ready_path is not None else None
    if warm:
        ready.write(b"P")
        source, display_name = _receive(code_path)
        state["code_file"] = display_name
    else:
        with open(code_path, "rb") as f:
            source = f.read()

    # What exists before the code's module (the interpreter's own objects,
    # the driver's, a warm driver's preload) is left out of the collector's
    # work from here on, for the code's own collections and the one at its
    # end (_end): it all lives until the process ends, and a fork of a
    # template then never writes to those pages (each collection would
    # have, to its copy of the template's).
    gc.freeze()
    # The user's code runs as __main__, in a module of its own, as with `python script.py`.
    main = _main_module(display_name)
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    if "__mp_main__" in sys.modules:
        # multiprocessing, imported by a warm driver's preload, took the
        # driver's module as the one its children's results are unpickled in.
        sys.modules["__mp_main__"] = main
    sys.argv = [display_name]
    # The code's folder replaces the driver's on the import path. An
    # interpreter that did not put the script's folder first (WASI's runs
    # with safe_path) keeps its path whole, the code's folder added in front.
    if sys.path and sys.path[0] == _DRIVER_DIR:
        sys.path[0] = ""
    else:
        sys.path.insert(0, "")

    report = state["report"]
    exit_code = 0
    try:
        body, last, body_source = _split_last_expression(source, display_name)
        if isinstance(main, _Main):
            # A child runs the code's top level without the expression the
            # run evaluates at its end, which may name what only the run's
            # `if __name__ == "__main__":` made.
            _CHILD_MAIN[:] = [source if body_source is None else body_source, display_name]
        if ready is not None:
            ready.write(b"C")
            ready.close()
            ready = None
        exec(body, main.__dict__)
        if last is not None:
            value = eval(last, main.__dict__)
            if value is not None:
                _extras().report_value(value, state)
    except SystemExit as exc:
        exit_code = _exit_code(exc)
    except BaseException as exc:  # noqa: BLE001 - every uncaught exception is the user's result
        _extras().report_error(exc, state, _DRIVER_FILE)
        exit_code = 1

    if "matplotlib.pyplot" in sys.modules:
        _extras().capture_figures(state)
    _flush_streams()
    if report or state["figures"] or state["results"]:
        _extras().write_report(report_path, state)
    return exit_code


def _main_module(display_name):
    """The module the code runs in, as `__main__`, its `__file__` the display
    name, as a script's is its path. multiprocessing's spawn and forkserver
    methods (forkserver is Python 3.14's default; joblib's loky does the
    same) start each child by running `__main__`'s file again, as
    `__mp_main__`, to find the functions it is handed; asked by them,
    `__file__` is a script holding the code (_child_main_file). Without one
    every worker of a Pool died as it started, and the Pool made new ones
    until the wall limit."""
    # WASI has no processes to start.
    main = type(sys)("__main__") if sys.platform == "wasi" else _Main("__main__")
    main.__dict__["__file__"] = display_name
    return main


class _Main(type(sys)):
    """`__main__`, whose `__file__`, read as its attribute by multiprocessing
    or loky as they prepare a child, is _child_main_file's script, and
    otherwise what the module holds: the code itself (a global) and anyone
    else (pandas, inspect, doctest) see the display name, and no file is
    written for them."""

    @property
    def __file__(self):
        caller = sys._getframe(0).f_back
        asking = caller.f_globals.get("__name__", "") if caller is not None else ""
        if asking.startswith(("multiprocessing.", "multiprocess.")) or "loky.backend" in asking:
            return _child_main_file()
        try:
            return self.__dict__["__file__"]
        except KeyError:
            raise AttributeError("__file__") from None

    @__file__.setter
    def __file__(self, value):
        self.__dict__["__file__"] = value

    @__file__.deleter
    def __file__(self):
        try:
            del self.__dict__["__file__"]
        except KeyError:
            raise AttributeError("__file__") from None


# What `type(__main__)` says, as of a plain module.
_Main.__name__ = _Main.__qualname__ = "module"
_Main.__module__ = "builtins"

# The code (or, when the run evaluates its last expression, the code before
# it) and its display name, until _child_main_file writes them; then the path.
_CHILD_MAIN = []
# One entry per script written, for each its own temporary name.
_CHILD_MAIN_WRITES = []
# The file _child_main_file writes: in /tmp, which each run has to itself
# (a library Sandbox's runs share theirs, one after the other, and each
# replaces it); never in the working directory, where it would shadow a
# module or take the name of a file the run was given.
_CHILD_MAIN_FILE = "/tmp/.airlock-main.py"

# The part of _child_main_file's script that points the children a child
# starts at the script (SCRIPT is its path). Such a child would be told to
# run `__main__`'s file, which multiprocessing and loky read as its
# `__file__`: the display name, a file that is not there. The functions
# that prepare a child are wrapped in each of those modules, in the ones
# loaded now and, through a finder, in any loaded later (joblib loads loky
# when the code first asks it for workers).
_POINT_CHILDREN_HERE = r"""def _airlock_point_children_here(sys=_sys, script=SCRIPT):
    names = ('multiprocessing.spawn', 'multiprocess.spawn',
             'loky.backend.spawn', 'joblib.externals.loky.backend.spawn')
    def point(module):
        if getattr(module, '_airlock_points_here', False):
            return
        def get_preparation_data(*args, _original=module.get_preparation_data, **kwargs):
            data = _original(*args, **kwargs)
            if 'init_main_from_path' in data:
                data['init_main_from_path'] = script
            return data
        module.get_preparation_data = get_preparation_data
        module._airlock_points_here = True
    class Loader:
        def __init__(self, loader):
            self.loader = loader
        def __getattr__(self, attribute):
            return getattr(self.loader, attribute)
        def create_module(self, spec):
            return self.loader.create_module(spec)
        def exec_module(self, module):
            self.loader.exec_module(module)
            point(module)
    class Finder:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            if fullname not in names:
                return None
            for finder in sys.meta_path:
                if finder is Finder or not hasattr(finder, 'find_spec'):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if hasattr(spec.loader, 'exec_module'):
                        spec.loader = Loader(spec.loader)
                    return spec
            return None
    for name in names:
        if name in sys.modules:
            point(sys.modules[name])
    sys.meta_path.insert(0, Finder)
_airlock_point_children_here()
del _airlock_point_children_here
"""


def _child_main_file():
    """A script for the code's spawn and forkserver children, written once a
    run, when the first is prepared: it sets up what a child started
    without the driver lacks (matplotlib's backend, which is the driver's;
    `display`; `exit` and `quit`, which `site` would have made) and runs
    the code, compiled under its display name and with `__file__` that
    name, in the namespace multiprocessing makes the child's `__mp_main__`.
    A process such a child starts in turn by spawn or forkserver (a Pool's
    workers cannot; a Process can) is pointed at the script too, where
    that name would have been looked for in the working directory.
    Each write goes to a name of its own and is renamed over the last run's
    script, which may be a link (a rename replaces it, never follows it).
    No lock: threads preparing children at once (or a finalizer or signal
    handler during a write, or a fork meanwhile) each write the same
    script, and the first that succeeds is kept. None where it cannot be
    written (the disk cap reached): the children then cannot find the
    code's functions, as under `python -c`, and never run a file that is
    not the code."""
    pending = list(_CHILD_MAIN)
    if len(pending) == 2:
        path = _write_child_main(*pending)
        if path is not None or len(_CHILD_MAIN) == 2:
            _CHILD_MAIN[:] = [path]
    return _CHILD_MAIN[0] if _CHILD_MAIN else None


def _write_child_main(code, display_name):
    """_child_main_file's script, written; its path, or None."""
    import _thread
    import posix

    text = (
        "# airlock: the run's code, for the processes multiprocessing starts\n"
        "# by spawn or forkserver (driver.py, _child_main_file).\n"
        "import builtins as _builtins, os as _os, sys as _sys\n"
        "if _os.environ.get('MPLBACKEND') == 'module://airlock_inline_backend':\n"
        "    _os.environ['MPLBACKEND'] = 'agg'\n"
        "if not hasattr(_builtins, 'display'):\n"
        "    def display(*objs, **kwargs):\n"
        "        for obj in objs:\n"
        "            print(repr(obj))\n"
        "    _builtins.display = display\n"
        "    del display\n"
        "if not hasattr(_builtins, 'exit'):\n"
        "    import site as _site\n"
        "    _site.setquit()\n"
        "    del _site\n"
        f"_airlock_code = compile({code!r}, {display_name!r}, 'exec')\n"
        "# The code sees its own name, as in the run.\n"
        f"__file__ = _sys.argv[0] = {display_name!r}\n"
        + _POINT_CHILDREN_HERE.replace("SCRIPT", repr(_CHILD_MAIN_FILE))
        + "del _builtins, _os, _sys\n"
        "exec(_airlock_code)\n"
        "del _airlock_code\n"
    ).encode()
    _CHILD_MAIN_WRITES.append(None)
    new = f"{_CHILD_MAIN_FILE}.{posix.getpid()}.{_thread.get_ident()}.{len(_CHILD_MAIN_WRITES)}"
    flags = posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW | posix.O_CLOEXEC
    for attempt in (1, 2):
        try:
            fd = posix.open(new, flags, 0o644)
            break
        except FileExistsError:
            # Left by an earlier run of this sandbox (each run's code is pid
            # 2, its first thread's id alike), or planted: the name is this
            # function's.
            if attempt == 2:
                return None
            try:
                posix.unlink(new)
            except OSError:
                return None
        except OSError:
            return None
    try:
        try:
            view = memoryview(text)
            while view:
                view = view[posix.write(fd, view) :]
        finally:
            posix.close(fd)
        posix.rename(new, _CHILD_MAIN_FILE)
    except OSError:
        try:
            posix.unlink(new)
        except OSError:
            pass
        return None
    return _CHILD_MAIN_FILE


_EXTRAS = []
# Set in a fork of a template, whose end collects the young generations only (_end).
_FORKED = []


def _extras():
    """driver_report.py, loaded on first need."""
    if not _EXTRAS:
        path = _DRIVER_DIR + "/driver_report.py"
        namespace = {"__name__": "airlock_driver_report", "__file__": path}
        exec(_code_of(path), namespace)
        _EXTRAS.append(type(sys)("airlock_driver_report"))
        _EXTRAS[0].__dict__.update(namespace)
    return _EXTRAS[0]


def _register_matplotlib_backend(state):
    """Makes matplotlib render off-screen and hand shown figures to airlock.

    The backend is registered as a module that costs nothing until matplotlib
    asks it for something (MPLBACKEND names it), so code that never plots
    pays nothing.
    """
    module = type(sys)("airlock_inline_backend")
    module.__getattr__ = lambda name: _extras().backend_attribute(module, name)
    module.show = lambda *args, **kwargs: _extras().capture_figures(state)
    sys.modules["airlock_inline_backend"] = module


def _register_display(state):
    """Makes `display(obj, ...)` a builtin, as in a notebook. It costs a
    lambda until it is called."""
    import builtins

    builtins.display = lambda *objs, **kwargs: _extras().display(state, objs, kwargs)


def _path(argument):
    """A path from argv, or the descriptor `fd:N` names."""
    return int(argument[3:]) if argument.startswith("fd:") else argument


def _receive(path):
    """A warm driver's code, from the FIFO the supervisor writes once a run
    claims the sandbox; moves to the run's working directory and sets the
    run's variables (os.environb calls putenv and unsetenv, so the code's
    child processes and its C libraries see them too)."""
    import os

    fd = path if isinstance(path, int) else os.open(path, os.O_RDONLY)
    try:
        header = b""
        while not header.endswith(b"\n"):
            byte = os.read(fd, 1)
            if not byte:
                raise SystemExit("airlock: the code FIFO closed before the code came")
            header += byte
        parts = []
        for size in (int(n) for n in header.split()):
            part = b""
            while len(part) < size:
                more = os.read(fd, size - len(part))
                if not more:
                    raise SystemExit("airlock: the code FIFO closed before the code came")
                part += more
            parts.append(part)
    finally:
        os.close(fd)
    name, cwd, env, source = parts
    os.chdir(cwd.decode())
    for change in env.split(b"\0")[:-1]:
        key, is_set, value = change.partition(b"=")
        if is_set:
            os.environb[key] = value
        else:
            os.environb.pop(key, None)
    return source, name.decode()


def _enter_work_dir():
    """Moves to AIRLOCK_CWD when the backend sets it (WASI has no working
    directory to inherit), and removes it, so the code sees only its own env.
    (posix.environ is the dict os.environ wraps, made or not.)"""
    import posix

    cwd = posix.environ.pop(b"AIRLOCK_CWD", None)
    if cwd is not None:
        posix.unsetenv(b"AIRLOCK_CWD")
        posix.chdir(cwd)


def _set_up_site(prefix):
    """Sets up what Python's `site` module would have, when Python started
    without it (`prefix` is not "-": the runtime's `known_site`).

    The supervisor checked on the host that the venv at `prefix` leaves out
    the system's site-packages and that `site` would run nothing (no `.pth`
    file in its site-packages, no `sitecustomize` module there or in the
    interpreter's library). For such a venv `site` only makes it sys.prefix,
    puts its site-packages folder last on the path and adds the builtins
    exit, quit, help, copyright, credits and license; so that is done here,
    without site's scans of each path entry and its `import os` (about 2 ms
    of every cold start). What the supervisor could not check is left to
    `site` itself: the run's own PYTHONHOME, a sitecustomize on the run's
    PYTHONPATH, an interpreter whose libraries are not in lib. (The one
    difference then: sys.flags.no_site is 1.) A venv's `site` sets up no
    user site and no interactive hook worth having here (no prompt ever
    runs)."""
    if prefix == "-":
        return
    import posix

    pythonpath = posix.environ.get(b"PYTHONPATH")
    if (
        b"PYTHONHOME" in posix.environ
        or sys.platlibdir != "lib"
        or (pythonpath is not None and _finds_sitecustomize(pythonpath))
    ):
        import site

        site.main()
        return
    sys.prefix = sys.exec_prefix = prefix
    sys._home = sys._base_executable.rpartition("/")[0]
    site_packages = "%s/lib/python%d.%d/site-packages" % (prefix, sys.version_info[0], sys.version_info[1])
    if site_packages not in sys.path:
        sys.path.append(site_packages)
    import _sitebuiltins
    import builtins

    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    builtins.help = _sitebuiltins._Helper()
    for name in ("copyright", "credits", "license"):
        setattr(builtins, name, _SiteText(name))


def _finds_sitecustomize(pythonpath):
    """Whether a folder on PYTHONPATH (bytes, as the environment has it)
    holds a sitecustomize module."""
    import _frozen_importlib_external

    folders = [f for f in pythonpath.decode(sys.getfilesystemencoding(), "surrogateescape").split(":") if f]
    return _frozen_importlib_external.PathFinder.find_spec("sitecustomize", folders) is not None


class _SiteText:
    """`copyright`, `credits` or `license` as `site` makes them, made on first
    use (site's module, imported after a start with -S, sets nothing up by
    itself; its setcopyright puts the real ones in builtins)."""

    def __init__(self, name):
        self._name = name

    def _made(self):
        import builtins
        import site

        site.setcopyright()
        return getattr(builtins, self._name)

    def __repr__(self):
        return repr(self._made())

    def __call__(self):
        return self._made()()


def _split_last_expression(source, filename):
    """Compiles the code; when it ends with an expression, compiles that apart.
    Returns the two, and the source before the expression.

    Without the ast module, whose import costs about a millisecond every run:
    the last top-level statement starts on a line at column 0; try each such
    line from the end, and split there when the rest is one expression and
    what comes before is a whole program. A prefix that parses on its own
    ends where the full parse has a statement boundary too, so the split is
    exactly the one an AST would give.

    The last statement may share its line with others (`x = 1; x + 1`), and
    no line then splits it: only then, when the code holds a `;`, is the AST
    asked (driver_report.py).
    """
    whole = _compile(source, filename, "exec")
    try:
        lines = source.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return whole, None, None
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        if not line.strip() or line[0] in " \t#":
            continue
        try:
            # Blank lines in front keep the line numbers of the code as shown.
            last = _compile("\n" * index + "".join(lines[index:]), filename, "eval")
            body_source = "".join(lines[:index])
            body = _compile(body_source, filename, "exec")
        except SyntaxError:
            if ";" in line:
                return _extras().split_on_ast(source, filename, whole)
            continue
        return body, last, body_source
    if b";" in source:
        # The last statement may start after a `;` on a continued line.
        return _extras().split_on_ast(source, filename, whole)
    return whole, None, None


class _Compiled(BaseException):
    """Stops a code's frame before its first instruction (_compile)."""


class _Listener:
    """A stand-in for sys.stderr that notes whether anything was written."""

    heard = False

    def write(self, text):
        self.heard = True
        return len(text)

    def flush(self):
        pass


def _compile(source, filename, mode):
    """What compile(source, filename, mode, dont_inherit=True) returns,
    without what the builtin costs at its first call.

    compile() first asks whether its source is an AST, which makes the
    hundred-odd node types of the `ast` module: about 1.5 ms here, a tenth
    of a cold `print(1+1)`. exec and eval compile a string without asking
    (naming it "<string>"). So the source goes to exec or eval, into a
    namespace of its own, with a trace function that takes the code's frame
    at its start, before its first instruction, and stops it there: the one
    frame exec or eval makes for it, in that namespace, called from here.
    Any other frame that starts meanwhile (an import the compiler makes for
    a named character escape or an unknown coding cookie, a finalizer the
    collector runs) goes on untraced. The code is then given `filename`,
    its nested code too, as the import system renames the code of a .pyc.
    A syntax error is raised as compile() raises it, naming `filename`.
    What the compiler says on the way (a SyntaxWarning) would name
    "<string>": then compile() is asked after all, and says it under the
    code's name. (The driver's own code holds no __future__ import for exec
    to pass on; a trace function set before is set again after.)"""
    import _imp

    namespace = {}
    here = sys._getframe()
    taken = []

    def take(frame, event, arg):
        if frame.f_globals is namespace and frame.f_back is here:
            taken.append(frame.f_code)
            raise _Compiled
        return None

    earlier, stderr, listener = sys.gettrace(), sys.stderr, _Listener()
    sys.stderr = listener
    sys.settrace(take)
    try:
        (exec if mode == "exec" else eval)(source, namespace)
    except _Compiled:
        pass
    except SyntaxError as error:
        if error.filename == "<string>":
            error.filename = filename
            if len(error.args) > 1 and isinstance(error.args[1], tuple):
                error.args = (error.msg, (filename,) + tuple(error.args[1][1:]))
        raise
    finally:
        sys.settrace(earlier)
        sys.stderr = stderr
    if listener.heard or not taken:
        return compile(source, filename, mode, dont_inherit=True)
    code = taken[0]
    _imp._fix_co_filename(code, filename)
    return code


def _exit_code(exc):
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _flush_streams():
    """Flushes the standard streams as an exit does. False when one could
    not be flushed (the exit status is then 120, as Python's), a failure to
    flush stdout (a full disk under a redirected stdout, say) reported on
    stderr as Python reports it."""
    flushed = True
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except Exception as error:
            flushed = False
            if name == "stdout":
                try:
                    sys.stderr.write("Exception ignored in: %r\n%s: %s\n" % (stream, type(error).__name__, error))
                    sys.stderr.flush()
                except Exception:
                    pass
    return flushed


def _end(exit_code):
    """Ends the run's process without the interpreter's teardown: the
    sandbox is destroyed after the run and the kernel frees the rest, and
    the teardown of every module costs more than a small job (cold, after
    `import pandas`: about 50 ms of 320 here; with a warm driver's preload,
    300 to 600 ms). First what an exit must still do, in a normal exit's
    order: wait for the code's threads, run its atexit functions, then let
    the code's objects go as Python's exit lets them go:

    - a collection of the young generations, while the code's module is
      whole, finalizes what the run left lately in reference cycles (a
      `Cycle()` whose result was dropped), its finalizers finding the
      module's globals bound (young only: each full collection walks every
      object the run made, 6 to 8 ms after `import pandas`);
    - the module leaves sys.modules, and its names go one by one, the last
      bound first, so that a finalizer of an object bound late still finds
      what was bound before it (the modules it imported, its classes), and
      a file left open is flushed and closed as its name goes;
    - a full collection finalizes the cycles the module's names held, and
      what older garbage remains.

    Then the streams are flushed (the exit status is 120 if that fails, as
    Python's). gc.freeze in _run keeps each collection to what the run
    made. Not finalized, as CPython does not promise either: what other
    modules still hold (a library's caches, a helper module's globals).

    In a fork of a template the collections take the young generations
    only: a full one also empties the interpreter's free lists, inherited
    from the template, which copies their pages (0.6 ms of a forked
    `print(1+1)` here). A long forked run's objects the collector moved to
    the oldest generation during the run are then not finalized at its end
    (and a file only such a cycle holds is not flushed)."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass
    import atexit
    import posix

    atexit._run_exitfuncs()
    gc.collect(1)
    main = sys.modules.pop("__main__", None)
    if main is not None:
        names = main.__dict__
        for name in reversed(list(names)):
            if name != "__builtins__":
                names.pop(name, None)
        del main, names
    gc.collect(1 if _FORKED else 2)
    posix._exit(exit_code if _flush_streams() else 120)


def _libc():
    """The C library, its madvise given the argument types of an address range."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


# MADV_COLLAPSE (Linux 6.1): make this range's small pages huge pages now.
_MADV_COLLAPSE = 25
# MADV_DONTNEED: drop this range's page table entries. Of a file's own pages
# that only unmaps them; a private copy (or its swap) it discards for good.
_MADV_DONTNEED = 4


# Where the supervisor puts the native library (libairlock_fork.so,
# crates/airlock-fork) for a warm driver that loads it: a sealed memfd at
# the one descriptor past the standard streams (airlock-linux, `native`).
_NATIVE_FD = 3


def _take_native():
    """Loads the native library from its descriptor, if this run was handed
    it, and closes the descriptor, so that the user's code starts with its
    three streams only. Returns the library, or None (no library, or one
    that would not load: the caller decides whether that is fatal)."""
    import os

    # Only the library's own descriptor is closed: any other at 3 is not
    # this function's to close (a warm run without the library has none).
    try:
        name = os.readlink("/proc/self/fd/%d" % _NATIVE_FD)
    except OSError:
        return None
    if not name.startswith("/memfd:airlock-native"):
        return None
    try:
        import ctypes

        return ctypes.CDLL("/proc/self/fd/%d" % _NATIVE_FD)
    except OSError:
        return None
    finally:
        os.close(_NATIVE_FD)


def _align_arenas(native):
    """Has CPython take its object arenas from chunks aligned to huge pages.

    CPython keeps small objects in 1 MiB arenas, each its own mapping, and
    the preload's imports map them between the libraries they load: about
    20 MB of the preload's memory in pieces that no huge page can map, so
    the run's exit frees them page by page (about 5,000 pages; `print(1+1)`
    and its exit 4.92 against 3.02 ms, bench/interpreter_exit.py). The native
    library (`arena`) installs an arena allocator whose arenas lie side by
    side in aligned chunks, which _collapse_into_huge_pages then reaches. It
    changes where arenas are, not what CPython does with them; it stays for
    the run (the code's new arenas come from it too). An optimisation only:
    if it fails, the arenas are CPython's own."""
    try:
        native.airlock_fork_align_arenas()
    except Exception:
        pass


def _collapse_into_huge_pages():
    """Moves the preload's dense memory into huge pages, before any run.

    A warm run ends when its process does, and the kernel frees a process's
    memory page by page at its exit: after the preload (numpy, pandas,
    matplotlib: about 70 MB of private memory) that is several milliseconds
    of every pooled run, more than the rest of a small run's own cost. A
    huge page is freed at once, so the exit of the 24 to 40 MB that sit in dense
    aligned blocks (the C heap, numpy's and pandas' arenas) costs about
    nothing. (In a forked template, writes after a fork split a shared huge
    page's mapping again; its small pages stay one block.) The collapse
    (20 to 140 ms here) is paid while the sandbox is made, not by a run.
    Only blocks at least three quarters resident are collapsed, so the
    sandbox holds at most a third more for them (measured: under 1 MB).
    Adjacent blocks go in one call: each call drains every CPU's page lists.
    The supervisor asks for it only where the host's transparent huge pages
    are not `never` (MADV_COLLAPSE itself would ignore that). An
    optimisation only: where the kernel has no MADV_COLLAPSE (before 6.1),
    has no huge page to give, or anything here fails, the sandbox is the
    same, its run's end only later."""
    if sys.platform != "linux":
        return
    try:
        import ctypes
        import os

        libc = _libc()
        madvise, mincore = libc.madvise, libc.mincore
        mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        page = os.sysconf("SC_PAGE_SIZE")
        # A huge page is what one page table maps: PAGE / 8 entries of PAGE.
        huge = page * page // 8
        pages = huge // page
        resident = ctypes.create_string_buffer(pages)
        with open("/proc/self/maps", "rb") as maps:
            mappings = maps.read().splitlines()
        runs = []  # [start, end) of adjacent dense blocks, each within one mapping
        for mapping in mappings:
            fields = mapping.split()
            # Private writable memory of no file: anonymous, or the C heap.
            if len(fields) < 5 or fields[1] != b"rw-p" or (len(fields) > 5 and fields[5] != b"[heap]"):
                continue
            start, end = (int(address, 16) for address in fields[0].split(b"-"))
            block = (start + huge - 1) & -huge
            joinable = False
            while block + huge <= end:
                dense = mincore(block, huge, resident) == 0 and sum(b & 1 for b in resident.raw) * 4 >= pages * 3
                if dense and joinable:
                    runs[-1][1] = block + huge
                elif dense:
                    runs.append([block, block + huge])
                joinable = dense
                block += huge
        # A call that fails (EINVAL: no MADV_COLLAPSE in this kernel, or a
        # mapping not eligible; EAGAIN, ENOMEM: no huge page to give) leaves
        # its range as it was.
        for start, end in runs:
            madvise(start, end - start, _MADV_COLLAPSE)
    except Exception:
        pass


def _unmap_file_pages():
    """Unmaps the preload's pages of shared libraries, before any run.

    A warm run's exit unmaps every page its process has mapped, one page
    table entry at a time: after the preload that is about 29 MB of
    libraries' pages (libpython, numpy's and pandas' extensions, libcrypto,
    libstdc++), about 7,000 entries, about a millisecond of every pooled
    run's end. Most of them a run never touches again. MADV_DONTNEED on a
    read-only private file mapping only drops its entries: the pages stay in
    the page cache, and a run that needs one faults it back in (with its
    neighbours). Measured outside a sandbox (bench/interpreter_exit.py):
    `print(1+1)` and the exit 7.05 against 6.08 ms, the pandas job about the
    same. Only mappings that hold no private copy, in memory or in swap
    (smaps' `Anonymous:` and `Swap:` both 0; no write permission, so none
    can appear) are dropped: dropping a copied page (a library's relocated
    pages) would lose it. The collector is off from the read of smaps to
    the last call, so that no object's finalizer unmaps a listed mapping
    (and its addresses are reused) in between; nothing else runs then (the
    sandbox's other threads, if any, are a library's idle workers). An
    optimisation only: anything that fails here leaves the mapping as it
    was. (A forked run needs none of this: a fork does not copy the page
    table entries of a mapping that holds no private copy.)"""
    if sys.platform != "linux":
        return
    import gc

    collecting = gc.isenabled()
    gc.disable()
    try:
        madvise = _libc().madvise
        with open("/proc/self/smaps", "rb") as smaps:
            lines = smaps.read().splitlines()
        droppable = []  # [start, end) of read-only private file mappings without private copies
        mapping, copies = None, None  # copies: kB of private copies, once smaps has said
        for line in lines + [b"end"]:
            fields = line.split()
            if not fields:
                continue
            if not fields[0].endswith(b":"):
                # The next mapping's first line (or the end): ADDRESSES PERMISSIONS OFFSET DEVICE INODE [PATH]
                if mapping is not None and copies == 0:
                    droppable.append(mapping)
                mapping, copies = None, None
                if len(fields) > 5 and fields[5].startswith(b"/") and fields[1].endswith(b"p") and b"w" not in fields[1]:
                    mapping = [int(address, 16) for address in fields[0].split(b"-")]
            elif fields[0] in (b"Anonymous:", b"Swap:") and len(fields) > 1:
                copies = (copies or 0) + int(fields[1])
        for start, end in droppable:
            madvise(start, end - start, _MADV_DONTNEED)
    except Exception:
        pass
    finally:
        if collecting:
            gc.enable()


if __name__ == "__main__":
    _end(_run())
