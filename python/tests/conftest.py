"""Shared set-up: airlock's data folder, and checks on what a sandbox leaves behind."""

import os
import pathlib
import re
import shutil
import tempfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
README = REPO / "python" / "README.md"

_made_home = None


def pytest_configure(config):
    # Before any sandbox: the helper and the images live in airlock's data
    # folder. The Rust tests build the python-data image in
    # target/tmp/airlock-test-home; reuse it when it is there.
    global _made_home
    if os.environ.get("AIRLOCK_HOME"):
        return
    shared = REPO / "target" / "tmp" / "airlock-test-home"
    if shared.is_dir():
        os.environ["AIRLOCK_HOME"] = str(shared)
    else:
        _made_home = tempfile.mkdtemp(prefix="airlock-test-home-")
        os.environ["AIRLOCK_HOME"] = _made_home


def pytest_unconfigure(config):
    if _made_home is not None:
        shutil.rmtree(_made_home, ignore_errors=True)


def namespace_fds():
    """This process's descriptors that hold a namespace: a live sandbox holds
    its user and mount namespaces this way, and nothing else here does."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(("user:[", "mnt:[")):
            held.append(target)
    return sorted(held)


def leftover_cgroups():
    """Cgroups the Linux backend made for this process's runs (named
    airlock-<pid>-...), which must be gone once a run is over."""
    prefix = f"airlock-{os.getpid()}-"
    found = []
    with open("/proc/self/mountinfo") as mountinfo:
        mounts = [line.split(" ")[4] for line in mountinfo if " - cgroup" in line]
    for mount in mounts:
        for dirpath, dirnames, _ in os.walk(mount):
            found += [os.path.join(dirpath, d) for d in dirnames if d.startswith(prefix)]
            if dirpath.count("/") > 10:
                dirnames.clear()
    return found


def readme_snippet():
    """The first Python block under "## Use" in the README."""
    match = re.search(r"## Use\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert match, "the README lost its usage example"
    return match.group(1)


@pytest.fixture
def sandbox():
    from airlock import Sandbox

    with Sandbox() as sb:
        yield sb
