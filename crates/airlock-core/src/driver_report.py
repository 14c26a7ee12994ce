# The part of airlock's Python driver needed only when there is something to
# report: a value, rich results, an uncaught exception, matplotlib figures,
# the report file. The driver (driver.py, beside this file) compiles it on
# first need, so a run that prints and exits never pays for it.

# The representations a rich result may carry, in the order a notebook asks
# for them, and the method that gives each one. text/plain is always the repr.
_REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("text/latex", "_repr_latex_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("application/json", "_repr_json_"),
)
# Representations whose data is bytes, carried as base64.
_BINARY = ("image/png", "image/jpeg")


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
    if isinstance(exc, SyntaxError) and exc.filename == state["code_file"]:
        # The code itself does not parse: the parser's own position is the user's.
        if exc.lineno:
            error["line"] = exc.lineno
        if exc.offset:
            error["column"] = exc.offset
    else:
        # The user's own line: the last frame in the code, not the library
        # frame the exception was raised in (which the traceback keeps).
        line = _last_line_in(exc.__traceback__, state["code_file"])
        if line:
            error["line"] = line
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        error["module"] = exc.name
    state["report"]["error"] = error
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)


def _last_line_in(tb, code_file):
    """The line of the last traceback frame that runs the code's own file."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == code_file:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


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


def split_on_ast(source, filename, whole):
    """The split of driver.py's _split_last_expression, by the AST: for a last
    statement that shares its line with others. A notebook's rules: only a
    last statement that is an expression has a value, and a `;` after it
    hides it. Returns the two, and the source before the expression (for
    the code's spawned children: driver.py, _child_main_file)."""
    import _ast

    tree = compile(source, filename, "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
    if not tree.body or not isinstance(tree.body[-1], _ast.Expr):
        return whole, None, None
    last = tree.body[-1]
    lines = source.splitlines(keepends=True)
    # Offsets are in UTF-8 bytes; after the expression come only blanks,
    # comments, line continuations and perhaps the `;` that hides it.
    after = b"".join([lines[last.end_lineno - 1][last.end_col_offset :], *lines[last.end_lineno :]])
    if after.lstrip(b" \t\\\r\n").startswith(b";"):
        return whole, None, None
    body = compile(_ast.Module(body=tree.body[:-1], type_ignores=[]), filename, "exec", dont_inherit=True)
    value = compile(_ast.Expression(body=last.value), filename, "eval", dont_inherit=True)
    before = b"".join([*lines[: last.lineno - 1], lines[last.lineno - 1][: last.col_offset]])
    return body, value, before


def report_value(value, state):
    """The last expression: its repr as `value`, and a rich result."""
    report = state["report"]
    text = repr(value)
    if len(text) > state["value_cap"]:
        report["value_truncated"] = True
        text = text[: state["value_cap"]]
    report["value"] = text
    _add_result(state, value, "value", text)


def display(state, objs, kwargs):
    """`display(obj, ...)`: each object a rich result, in order. With
    raw=True the objects are MIME bundles already ({mime: data})."""
    raw = kwargs.get("raw", False)
    for obj in objs:
        if raw and isinstance(obj, dict):
            _add_bundle(state, "display", dict(obj))
        else:
            _add_result(state, obj, "display", None)


def _add_result(state, value, kind, text):
    results = state["results"]
    if len(results) >= state["max_results"]:
        state["report"]["results_dropped"] = state["report"].get("results_dropped", 0) + 1
        return
    try:
        bundle = _mime_bundle(value, state)
    except Exception as exc:  # a broken _repr_*_ is the code's problem, reported, never fatal
        _note(state, f"a rich result could not be made: {exc!r}")
        bundle = {}
    if text is None:
        try:
            text = repr(value)
        except Exception as exc:
            text = f"<unrepresentable {type(value).__name__}: {exc!r}>"
    bundle["text/plain"] = text
    _add_bundle(state, kind, bundle)


def _add_bundle(state, kind, bundle):
    """Checks every representation against its cap and keeps the result."""
    import base64
    import json

    results = state["results"]
    if len(results) >= state["max_results"]:
        state["report"]["results_dropped"] = state["report"].get("results_dropped", 0) + 1
        return
    data = {}
    for mime, content in bundle.items():
        if not isinstance(mime, str):
            continue
        if mime in _BINARY:
            if isinstance(content, str):
                # Already base64, as IPython allows.
                size = len(content) * 3 // 4
            elif isinstance(content, (bytes, bytearray, memoryview)):
                content = bytes(content)
                size = len(content)
            else:
                _note(state, f"{mime}: {type(content).__name__} is not bytes")
                continue
            if size > state["figure_cap"]:
                _note(state, f"{mime}: {size} bytes, above the cap of {state['figure_cap']}")
                continue
            data[mime] = content if isinstance(content, str) else base64.b64encode(content).decode()
            continue
        if mime == "application/json" and not isinstance(content, str):
            try:
                content = json.dumps(content, default=repr)
            except Exception as exc:
                _note(state, f"{mime}: {exc!r}")
                continue
        if isinstance(content, bytes):
            content = content.decode("utf-8", "replace")
        if not isinstance(content, str):
            _note(state, f"{mime}: {type(content).__name__} is not text")
            continue
        if len(content) > state["value_cap"]:
            if mime != "text/plain":
                # Cut HTML or SVG is broken markup: leave it out, say so.
                _note(state, f"{mime}: {len(content)} characters, above the cap of {state['value_cap']}")
                continue
            content = content[: state["value_cap"]]
        data[mime] = content
    if data:
        results.append({"kind": kind, "data": data})


def _mime_bundle(value, state):
    """What a notebook would show for `value`, beside its repr."""
    import sys

    bundle = {}
    if isinstance(value, type):
        # A class has the methods, unbound; a notebook shows its repr only.
        return bundle
    figure = sys.modules.get("matplotlib.figure")
    if figure is not None and isinstance(value, figure.Figure):
        import io

        buf = io.BytesIO()
        value.savefig(buf, format="png")
        bundle["image/png"] = buf.getvalue()
        # Shown here, it does not come back again among the figures.
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:
            pyplot.close(value)
        return bundle
    mimebundle = getattr(value, "_repr_mimebundle_", None)
    if callable(mimebundle):
        got = mimebundle(include=None, exclude=None)
        if isinstance(got, tuple):
            got = got[0]
        if isinstance(got, dict):
            bundle.update(got)
    for mime, name in _REPR_METHODS:
        if mime in bundle:
            continue
        method = getattr(value, name, None)
        if not callable(method):
            continue
        try:
            got = method()
        except Exception as exc:
            _note(state, f"{name}: {exc!r}")
            continue
        if isinstance(got, tuple):
            got = got[0]
        if got is not None:
            bundle[mime] = got
    bundle.pop("text/plain", None)
    return bundle


def _note(state, text):
    state["report"].setdefault("result_errors", []).append(text[:1000])


def write_report(path, state):
    """Writes the report (value, rich results, error, figures as base64) as JSON."""
    import base64
    import json

    report = state["report"]
    report["figures"] = [{"name": name, "png_base64": base64.b64encode(data).decode()} for name, data in state["figures"]]
    report["results"] = state["results"]
    with open(path, "wb") as f:
        f.write(json.dumps(report).encode())
