# The part of airlock's Python driver needed only when there is something to
# report: an uncaught exception, matplotlib figures, the report file. The
# driver (driver.py, beside this file) compiles it on first need, so a run
# that prints and exits never pays for it.


def report_error(exc, state, driver_file):
    """Records an uncaught exception and prints it as Python would."""
    import sys
    import traceback

    exc = exc.with_traceback(_user_traceback(exc, driver_file))
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
    state["report"]["error"] = error
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)


def _user_traceback(exc, driver_file):
    """The traceback without the driver's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == driver_file:
        tb = tb.tb_next
    return tb


def capture_figures(state):
    """Every open figure, as a PNG, then closed: at plt.show() and at the end."""
    import sys

    report, figures = state["report"], state["figures"]
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        import io

        for num in pyplot.get_fignums():
            fig = pyplot.figure(num)
            if len(figures) < state["max_figures"]:
                buf = io.BytesIO()
                try:
                    fig.savefig(buf, format="png")
                except Exception as exc:  # a figure that cannot render is reported, not fatal
                    report.setdefault("figure_errors", []).append(f"figure {num}: {exc!r}"[:1000])
                else:
                    data = buf.getvalue()
                    label = fig.get_label() or ""
                    name = f"figure-{len(figures) + 1}.png" if not label else f"figure-{len(figures) + 1}-{label}.png"
                    if len(data) <= state["figure_cap"]:
                        figures.append((name, data))
                    else:
                        report.setdefault("figure_errors", []).append(
                            f"{name}: {len(data)} bytes, above the cap of {state['figure_cap']}"
                        )
            else:
                report["figures_dropped"] = report.get("figures_dropped", 0) + 1
            pyplot.close(fig)
    except Exception as exc:
        report.setdefault("figure_errors", []).append(repr(exc)[:1000])


def backend_attribute(module, name):
    """Fills matplotlib's backend module from the Agg backend on first use."""
    from matplotlib.backends import backend_agg

    module.FigureCanvas = backend_agg.FigureCanvasAgg
    module.FigureManager = backend_agg.FigureManager
    module.new_figure_manager = backend_agg.new_figure_manager
    module.new_figure_manager_given_figure = backend_agg.new_figure_manager_given_figure
    if name in module.__dict__:
        return module.__dict__[name]
    raise AttributeError(name)


def write_report(path, state):
    """Writes the report (value, error, figures as base64) as JSON."""
    import base64
    import json

    report = state["report"]
    report["figures"] = [{"name": name, "png_base64": base64.b64encode(data).decode()} for name, data in state["figures"]]
    with open(path, "wb") as f:
        f.write(json.dumps(report).encode())
