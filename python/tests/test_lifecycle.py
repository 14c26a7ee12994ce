"""A sandbox lives as long as its `with` block, whatever happens in it."""

import os
import time

import pytest
from conftest import leftover_cgroups, namespace_fds

from airlock import Sandbox, SandboxError


def test_the_sandbox_is_destroyed_after_an_exception_in_the_block():
    before = namespace_fds()
    with pytest.raises(RuntimeError, match="the caller's own error"), Sandbox() as sb:
        assert len(namespace_fds()) == len(before) + 2, "a live sandbox holds its user and mount namespaces"
        sb.write("/work/secret.txt", b"gone with the sandbox")
        assert sb.run("print(open('secret.txt').read())").stdout == "gone with the sandbox\n"
        raise RuntimeError("the caller's own error")
    assert sb.closed
    assert namespace_fds() == before, "the sandbox's namespaces outlived the block"
    assert leftover_cgroups() == []
    with pytest.raises(SandboxError, match="this sandbox is closed; make a new one"):
        sb.run("1")
    with pytest.raises(SandboxError, match="closed"):
        sb.read("/work/secret.txt")
    with pytest.raises(SandboxError, match="closed"):
        sb.write("/work/x", b"x")


def test_a_run_leaves_no_process_behind(sandbox):
    marker = "airlock-python-test-orphan"
    out = sandbox.run(
        f"import subprocess\nsubprocess.Popen(['sleep', '300', '{marker}'], start_new_session=True)\n'spawned'"
    )
    assert out.value == "'spawned'"
    # The kernel tears a killed tree down asynchronously; give it a moment.
    for _ in range(50):
        left = [pid for pid in os.listdir("/proc") if pid.isdigit() and marker in _cmdline(pid)]
        if not left:
            break
        time.sleep(0.02)
    assert left == [], "a process of the run outlived it"
    assert leftover_cgroups() == []


def test_close_is_idempotent_and_the_state_is_visible():
    sb = Sandbox()
    assert not sb.closed
    assert repr(sb) == "Sandbox(image='python-data', closed=False)"
    sb.close()
    sb.close()
    assert sb.closed


def test_each_sandbox_is_its_own():
    with Sandbox() as first, Sandbox() as second:
        first.write("/work/only-here.txt", b"first")
        out = second.run("import os\nos.listdir('/work')")
        assert out.value == "[]"


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
