# airlock's Python driver: runs the user's code the way a notebook runs a cell.
#
# It adds three things to a plain `python script.py`: the repr of a last
# expression comes back as `value`; an uncaught exception comes back as a
# structured `error` whose traceback has this file's frames removed; every
# matplotlib figure shown or still open at the end comes back as a PNG.
#
# It runs inside the sandbox, in the same process as the user's code, so the
# supervisor treats everything it reports as untrusted data: parsed with caps,
# PNGs re-checked, never used to decide a status or a limit.
#
# Start-up cost matters (every run pays it), so nothing is imported here that
# plain Python does not already load, until there is something to report.
#
# argv: driver.py CODE_PATH DISPLAY_NAME REPORT_PATH VALUE_CAP MAX_FIGURES FIGURE_CAP

import sys

_DRIVER_FILE = __file__


def _run():
    _enter_work_dir()
    code_path, display_name, report_path = sys.argv[1], sys.argv[2], sys.argv[3]
    value_cap, max_figures, figure_cap = (int(x) for x in sys.argv[4:7])
    report = {}
    figures = []

    def capture_figures():
        # Called by plt.show() and at the end: every open figure, as a PNG, then closed.
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        import io

        for num in pyplot.get_fignums():
            fig = pyplot.figure(num)
            if len(figures) < max_figures:
                buf = io.BytesIO()
                try:
                    fig.savefig(buf, format="png")
                except Exception as exc:  # a figure that cannot render is reported, not fatal
                    report.setdefault("figure_errors", []).append(f"figure {num}: {exc!r}"[:1000])
                else:
                    data = buf.getvalue()
                    label = fig.get_label() or ""
                    name = f"figure-{len(figures) + 1}.png" if not label else f"figure-{len(figures) + 1}-{label}.png"
                    if len(data) <= figure_cap:
                        figures.append((name, data))
                    else:
                        report.setdefault("figure_errors", []).append(
                            f"{name}: {len(data)} bytes, above the cap of {figure_cap}"
                        )
            else:
                report["figures_dropped"] = report.get("figures_dropped", 0) + 1
            pyplot.close(fig)

    _install_matplotlib_backend(capture_figures)

    with open(code_path, "rb") as f:
        source = f.read()

    # The user's code runs as __main__, in a module of its own, as with `python script.py`.
    main = type(sys)("__main__")
    main.__file__ = display_name
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    sys.argv = [display_name]
    # The code's folder replaces the driver's on the import path. An
    # interpreter that did not put the script's folder first (WASI's runs
    # with safe_path) keeps its path whole, the code's folder added in front.
    if sys.path and sys.path[0] == _DRIVER_FILE.rpartition("/")[0]:
        sys.path[0] = ""
    else:
        sys.path.insert(0, "")

    exit_code = 0
    try:
        body, last = _split_last_expression(source, display_name)
        exec(body, main.__dict__)
        if last is not None:
            value = eval(last, main.__dict__)
            if value is not None:
                text = repr(value)
                if len(text) > value_cap:
                    report["value_truncated"] = True
                    text = text[:value_cap]
                report["value"] = text
    except SystemExit as exc:
        exit_code = _exit_code(exc)
    except BaseException as exc:  # noqa: BLE001 - every uncaught exception is the user's result
        report["error"] = _describe(exc)
        _print_traceback(exc)
        exit_code = 1

    try:
        capture_figures()
    except Exception as exc:
        report.setdefault("figure_errors", []).append(repr(exc)[:1000])
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if report or figures:
        _write_report(report_path, report, figures)
    return exit_code


def _enter_work_dir():
    """Moves to AIRLOCK_CWD when the backend sets it (WASI has no working
    directory to inherit), and removes it, so the code sees only its own env."""
    import os

    cwd = os.environ.pop("AIRLOCK_CWD", None)
    if cwd:
        os.chdir(cwd)


def _split_last_expression(source, filename):
    """Compiles the code; when it ends with an expression, compiles that apart.

    Without the ast module, whose import costs about a millisecond every run:
    the last top-level statement starts on a line at column 0; try each such
    line from the end, and split there when the rest is one expression and
    what comes before is a whole program. A prefix that parses on its own
    ends where the full parse has a statement boundary too, so the split is
    exactly the one an AST would give.
    """
    whole = compile(source, filename, "exec", dont_inherit=True)
    try:
        lines = source.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return whole, None
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        if not line.strip() or line[0] in " \t#":
            continue
        try:
            # Blank lines in front keep the line numbers of the code as shown.
            last = compile("\n" * index + "".join(lines[index:]), filename, "eval", dont_inherit=True)
            body = compile("".join(lines[:index]), filename, "exec", dont_inherit=True)
        except SyntaxError:
            continue
        return body, last
    return whole, None


def _exit_code(exc):
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _user_traceback(exc):
    """The traceback without this driver's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == _DRIVER_FILE:
        tb = tb.tb_next
    return tb


def _describe(exc):
    import traceback

    exc = exc.with_traceback(_user_traceback(exc))
    error = {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }
    if isinstance(exc, SyntaxError):
        error["message"] = exc.msg or str(exc)
        if exc.lineno:
            error["line"] = exc.lineno
        if exc.offset:
            error["column"] = exc.offset
    else:
        tb = exc.__traceback__
        line = None
        while tb is not None:
            line = tb.tb_lineno
            tb = tb.tb_next
        if line:
            error["line"] = line
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        error["module"] = exc.name
    return error


def _print_traceback(exc):
    import traceback

    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)


def _write_report(path, report, figures):
    import base64
    import json

    report["figures"] = [{"name": name, "png_base64": base64.b64encode(data).decode()} for name, data in figures]
    data = json.dumps(report).encode()
    with open(path, "wb") as f:
        f.write(data)


def _install_matplotlib_backend(capture):
    """Makes matplotlib render off-screen and hand shown figures to `capture`.

    The backend module is registered now but imports matplotlib's Agg backend
    only when matplotlib asks for it, so code that never plots pays nothing.
    """

    class InlineBackend(type(sys)):
        def __getattr__(self, name):
            from matplotlib.backends import backend_agg

            self.FigureCanvas = backend_agg.FigureCanvasAgg
            self.FigureManager = backend_agg.FigureManager
            self.new_figure_manager = backend_agg.new_figure_manager
            self.new_figure_manager_given_figure = backend_agg.new_figure_manager_given_figure
            if name in self.__dict__:
                return self.__dict__[name]
            raise AttributeError(name)

    module = InlineBackend("airlock_inline_backend")

    def show(*args, **kwargs):
        capture()

    module.show = show
    sys.modules["airlock_inline_backend"] = module


if __name__ == "__main__":
    _exit_code_ = _run()
    if sys.platform == "wasi":
        # A WASI guest is discarded after its run, and has no threads to
        # wait for: skip the interpreter's teardown (a third of a small
        # job's time) after doing what an exit must still do.
        import atexit
        import os

        atexit._run_exitfuncs()
        for _stream_ in (sys.stdout, sys.stderr):
            try:
                _stream_.flush()
            except Exception:
                pass
        os._exit(_exit_code_)
    sys.exit(_exit_code_)
