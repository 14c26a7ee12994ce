"""Every field of a run's result, from real runs."""

import base64
import hashlib
import struct

from airlock import ErrorInfo, Figure, RunResult, Sandbox, Usage


def png_size(png):
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", png[16:24])


def test_a_successful_run_fills_every_field(sandbox):
    code = "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\n6 * 7"
    out = sandbox.run(code)
    assert isinstance(out, RunResult)
    assert out.ok is True
    assert out.status == "ok"
    assert out.limit is None
    assert out.exit_code == 0
    assert out.stdout == "to stdout\n"
    assert out.stderr == "to stderr\n"
    assert out.code == code
    assert out.value == "42"
    assert out.error is None
    assert out.figures == []
    assert out.message is None
    assert isinstance(out.usage, Usage)
    assert out.usage.wall_ms > 0
    assert out.usage.cpu_ms is not None and out.usage.cpu_ms > 0
    assert out.usage.peak_memory_bytes is not None and out.usage.peak_memory_bytes > 1 << 20


def test_the_record_is_the_whole_run_record(sandbox):
    sandbox.write("in.txt", "data")
    out = sandbox.run("print('hi')")
    record = out.record
    assert record["status"] == "ok"
    assert record["code"] == "print('hi')"
    assert record["code_sha256"] == hashlib.sha256(b"print('hi')").hexdigest()
    assert record["language"] == "python"
    assert len(record["id"]) == 32
    assert record["schema_version"] == 1
    assert record["stdout"] == "hi\n"
    assert record["inputs"] == [{"path": "/work/in.txt", "bytes": 4, "sha256": hashlib.sha256(b"data").hexdigest()}]
    assert record["policy"]["memory_mb"] == 512
    assert record["image"]["name"] == "python-data"
    assert record["isolation"]["backend"] == "linux"
    assert "seccomp" in record["isolation"]["layers"]
    assert record["usage"]["wall_ms"] == out.usage.wall_ms
    # Every figure the record's usage has is on `usage`, as it is.
    for name, value in record["usage"].items():
        assert getattr(out.usage, name) == value, name
    assert out.usage.start == "cold"
    assert out.usage.first_instruction_ms is not None


def test_settings_reach_the_policy_in_the_record():
    with Sandbox(mem_mb=256, timeout_s=7.5, pids=10, env={"GREETING": "hello"}, max_output_bytes=4096) as sb:
        out = sb.run("import os\nos.environ['GREETING']")
    assert out.value == "'hello'"
    policy = out.record["policy"]
    assert (policy["memory_mb"], policy["timeout_s"], policy["pids"]) == (256, 7.5, 10)
    assert policy["max_output_bytes"] == 4096
    assert policy["env"] == {"GREETING": "hello"}


def test_an_uncaught_exception_is_a_failed_result_with_the_error(sandbox):
    out = sandbox.run("x = 1\n\nraise KeyError('missing key')")
    assert out.ok is False
    assert out.status == "failed"
    assert out.limit is None
    assert out.exit_code == 1
    assert out.value is None
    assert isinstance(out.error, ErrorInfo)
    assert out.error.type == "KeyError"
    assert out.error.message == "'missing key'"
    assert out.error.line == 3
    assert "line 3" in out.error.traceback and out.error.traceback.endswith("KeyError: 'missing key'\n")
    assert "driver" not in out.error.traceback


def test_figures_come_back_as_pngs_that_save_and_display(sandbox, tmp_path):
    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.figure(figsize=(4, 3), dpi=100); plt.plot([1, 2, 3]); plt.show()\n"
        "plt.figure(figsize=(8, 2), dpi=100); plt.bar(['a', 'b'], [3, 4])"
    )
    out = sandbox.run(code)
    assert out.ok, out.stderr
    assert [type(f) for f in out.figures] == [Figure, Figure]
    first, second = out.figures
    assert (first.width, first.height) == (400, 300) == png_size(first.png)
    assert (second.width, second.height) == (800, 200) == png_size(second.png)
    assert first.name == "figure-1.png"
    assert first._repr_png_() == first.png
    saved = first.save(tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes() == first.png
    assert saved == str(tmp_path / "plot.png")
    recorded = out.record["figures"][0]
    assert base64.b64decode(recorded["png_base64"]) == first.png
    assert recorded["sha256"] == hashlib.sha256(first.png).hexdigest()


def test_a_non_zero_exit_is_failed_without_an_error(sandbox):
    out = sandbox.run("import sys; sys.exit(3)")
    assert (out.ok, out.status, out.exit_code, out.error) == (False, "failed", 3, None)


def test_shell_code_runs_under_sh(sandbox):
    out = sandbox.run('echo "$0"; pwd; exit 4', lang="sh", cwd="/work")
    assert out.status == "failed" and out.exit_code == 4
    assert out.stdout.splitlines()[1] == "/work"
    assert out.record["language"] == "sh"
    assert out.value is None


def test_cwd_stdin_and_files_between_runs(sandbox):
    sandbox.write("/work/sub/dir/file.txt", b"kept")
    out = sandbox.run(
        "import os, sys\nprint(open('file.txt').read(), sys.stdin.read())\nos.getcwd()",
        cwd="/work/sub/dir",
        stdin="from stdin",
    )
    assert out.stdout == "kept from stdin\n"
    assert out.value == "'/work/sub/dir'"
    assert sandbox.run("x = 1").ok
    assert sandbox.run("x").error.type == "NameError", "variables must not outlive a run"


def test_write_takes_bytes_and_str_and_read_returns_bytes(sandbox):
    sandbox.write("a.bin", bytes(range(256)))
    sandbox.write("b.txt", "naïve café")
    sandbox.write("c.bin", bytearray(b"\x00\x01"))
    assert sandbox.read("/work/a.bin") == bytes(range(256))
    assert sandbox.read("b.txt") == "naïve café".encode()
    assert sandbox.read("c.bin", max_bytes=2) == b"\x00\x01"
    out = sandbox.run("open('d.txt', 'w').write('made inside')")
    assert out.ok
    assert sandbox.read("d.txt") == b"made inside"


def test_repr_is_short(sandbox):
    out = sandbox.run("1/0")
    assert repr(out) == "RunResult(status='failed', exit_code=1, error='ZeroDivisionError')"


def test_display_and_rich_results_come_back_in_order(sandbox):
    """Issue 14, item 4: `display()` and a notebook's rich results."""
    code = "class H:\n    def _repr_html_(self): return '<b>h</b>'\n    def __repr__(self): return 'H()'\ndisplay(H(), 'two')\nx = 1; x + 1"
    out = sandbox.run(code)
    assert out.ok, out.error
    assert [r.kind for r in out.results] == ["display", "display", "value"]
    assert out.results[0].html == "<b>h</b>" and out.results[0].text == "H()"
    assert out.results[1].text == "'two'"
    assert out.value == "2" and out.results[2].text == "2"


def test_the_error_is_on_the_users_line(sandbox):
    """Issue 14, item 1: the last frame in the code, not the library's."""
    out = sandbox.run("import json\n\njson.loads('{bad')\n")
    assert (out.error.type, out.error.line) == ("JSONDecodeError", 3)
    assert "decoder.py" in out.error.traceback
