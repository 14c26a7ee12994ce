"""Runs stopped by a limit report the right status and `limit`."""

import pytest

from airlock import Sandbox


def test_a_timeout_is_reported_as_wall_time():
    with Sandbox(timeout_s=1) as sb:
        out = sb.run("import time\nprint('started', flush=True)\ntime.sleep(30)")
    assert (out.ok, out.status, out.limit) == (False, "timeout", "wall_time")
    assert out.stdout == "started\n"
    assert "wall_time" in out.record["limits_hit"]
    assert out.message


def test_a_memory_bomb_is_reported_as_memory():
    with Sandbox(mem_mb=128) as sb:
        out = sb.run("chunks = []\nwhile True:\n    chunks.append(b'x' * (16 << 20))")
    assert (out.ok, out.status, out.limit) == (False, "memory_limit", "memory")
    assert "memory" in out.record["limits_hit"]


def test_cpu_time_is_reported_as_cpu_time():
    with Sandbox(cpu_time_s=1, timeout_s=20) as sb:
        out = sb.run("while True:\n    pass")
    assert (out.ok, out.status, out.limit) == (False, "cpu_limit", "cpu_time")


def test_output_past_the_cap_is_killed_when_asked():
    with Sandbox(max_output_bytes=1000, on_output_limit="kill") as sb:
        out = sb.run("while True:\n    print('x' * 100)")
    assert (out.ok, out.status, out.limit) == (False, "output_limit", "output")
    assert len(out.stdout) <= 1000


def test_output_past_the_cap_is_truncated_by_default():
    with Sandbox(max_output_bytes=1000) as sb:
        out = sb.run("print('x' * 5000)\n'done'")
    assert (out.ok, out.status, out.limit, out.value) == (True, "ok", None, "'done'")
    assert len(out.stdout) == 1000
    assert out.record["stdout_truncated"] is True
    assert "output" in out.record["limits_hit"]


def test_the_sandbox_runs_again_after_a_limit():
    with Sandbox(timeout_s=1) as sb:
        assert sb.run("while True: pass").status == "timeout"
        assert sb.run("'still here'").value == "'still here'"


def test_a_run_may_set_its_own_limits(sandbox):
    """Issue 14, item 9: `timeout_s` (and the other per-run limits) on `sb.run`."""
    out = sandbox.run("import time; time.sleep(10)", timeout_s=1)
    assert (out.status, out.limit) == ("timeout", "wall_time")
    assert out.usage.wall_ms < 5000
    assert out.record["policy"]["timeout_s"] == 1.0
    # The sandbox's own limits are back for the next run.
    out = sandbox.run("1")
    assert out.ok and out.record["policy"]["timeout_s"] == 20.0
    out = sandbox.run("x = bytearray(200 << 20)", mem_mb=64)
    assert out.status == "memory_limit", out


def test_per_run_limits_are_the_specs_own_fields():
    import inspect

    from airlock import Sandbox, _spec

    keywords = {"mem_mb" if f == "memory_mb" else f for f in _spec.PER_RUN}
    parameters = set(inspect.signature(Sandbox.run).parameters) - {"self", "code", "cwd", "lang", "stdin"}
    assert parameters == keywords


def test_a_bad_per_run_limit_names_it(sandbox):
    from airlock import PolicyError

    with pytest.raises(PolicyError, match="timeout_s"):
        sandbox.run("1", timeout_s=-1)
    with pytest.raises(PolicyError, match="mem_mb"):
        sandbox.run("1", mem_mb=1)
