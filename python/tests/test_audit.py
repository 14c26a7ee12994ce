"""Every run of an audited sandbox is in the audit store, and a run the store
cannot take is never handed out as if it were: it raises, its record beside."""

import json
import os
import pathlib
import shutil
import sqlite3
import subprocess
import sys

import pytest

from airlock import PolicyError, Sandbox, SandboxError


def stored(store, run_id):
    """The record the store holds for `run_id`, or None."""
    with sqlite3.connect(store) as db:
        row = db.execute("SELECT record FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else json.loads(row[0])


def test_an_audited_run_is_in_the_store(tmp_path):
    store = tmp_path / "audit.sqlite3"
    with Sandbox(audit=store) as sb:
        first = sb.run("print('first')")
        second = sb.run("print('second')")
    for result in (first, second):
        assert result.ok, result.stderr
        record = stored(store, result.record["id"])
        assert record is not None, "the run is not in the store"
        assert record["stdout"] == result.stdout
        assert record["code"] == result.record["code"]


def test_airlock_audit_in_the_environment_records_in_airlocks_own_store(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    shared = pathlib.Path(os.environ["AIRLOCK_HOME"])
    (home / "images").symlink_to(shared / "images")
    code = "from airlock import Sandbox\nwith Sandbox() as sb:\n    print(sb.run('print(7)').record['id'])"
    env = dict(os.environ, AIRLOCK_HOME=str(home), AIRLOCK_AUDIT="1")
    ran = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert ran.returncode == 0, ran.stderr
    record = stored(home / "audit.sqlite3", ran.stdout.strip())
    assert record is not None and record["stdout"] == "7\n"


def test_an_audit_setting_that_is_neither_a_flag_nor_a_path_is_refused(monkeypatch):
    with pytest.raises(PolicyError, match="audit takes"):
        Sandbox(audit=3)
    monkeypatch.setenv("AIRLOCK_AUDIT", "maybe")
    with pytest.raises(PolicyError, match="AIRLOCK_AUDIT"):
        Sandbox()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="mounts a small disk: needs root")
def test_a_run_the_store_cannot_take_raises_with_its_record(tmp_path):
    # The store on a disk too small for the record (a tmpfs in a mount
    # namespace of the child's own): the run happens, the store refuses it.
    disk = tmp_path / "disk"
    disk.mkdir()
    code = f"""
import airlock
with airlock.Sandbox(audit={str(disk / "audit.sqlite3")!r}) as sb:
    try:
        sb.run("print('x' * 900_000)")
    except airlock.SandboxError as error:
        print("refused:", error.result.status, str(error))
    else:
        print("handed out")
"""
    script = 'mount -t tmpfs -o size=400k,mode=0755 auditdisk "$0" && exec "$@"'
    ran = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, str(disk), sys.executable],
        input=code,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("refused: ok "), ran.stdout
    assert "NOT recorded in the audit store" in ran.stdout
