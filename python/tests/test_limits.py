"""Runs stopped by a limit report the right status and `limit`."""

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
