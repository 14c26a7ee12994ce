"""The sandbox helper travels inside the extension module and is installed
into airlock's data folder, whole and executable, replacing a bad copy."""

import os
import pathlib
import subprocess
import sys

import airlock._native

RUN = "from airlock import Sandbox\nwith Sandbox() as sb:\n    print(sb.run('6 * 7').value)"


def fresh_home(tmp_path):
    """A data folder of its own that shares this session's images."""
    home = tmp_path / "home"
    home.mkdir(parents=True)
    (home / "images").symlink_to(pathlib.Path(os.environ["AIRLOCK_HOME"]) / "images")
    return home


def run_in(home):
    env = dict(os.environ, AIRLOCK_HOME=str(home))
    return subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True, check=False)


def test_the_helper_is_installed_executable_in_the_data_folder():
    path = pathlib.Path(airlock._native.helper_path())
    assert path.parent == pathlib.Path(os.environ["AIRLOCK_HOME"]) / "helpers"
    assert path.name.startswith("airlock-init-")
    assert os.access(path, os.X_OK)
    assert path.read_bytes()[:4] == b"\x7fELF"


def test_a_first_sandbox_installs_the_helper(tmp_path):
    home = fresh_home(tmp_path)
    ran = run_in(home)
    assert (ran.returncode, ran.stdout) == (0, "42\n"), ran.stderr
    helper, fork_library = sorted((home / "helpers").iterdir())
    assert helper.name == pathlib.Path(airlock._native.helper_path()).name
    assert helper.read_bytes() == pathlib.Path(airlock._native.helper_path()).read_bytes()
    # The forked mode's native library travels the same way.
    assert fork_library.name.startswith("libairlock_fork.so-")
    assert fork_library.read_bytes()[:4] == b"\x7fELF"


def test_a_damaged_or_non_executable_helper_is_replaced(tmp_path):
    good = pathlib.Path(airlock._native.helper_path())
    for damage in ("truncated", "not executable"):
        home = fresh_home(tmp_path / damage.replace(" ", "-"))
        planted = home / "helpers" / good.name
        planted.parent.mkdir()
        if damage == "truncated":
            planted.write_bytes(good.read_bytes()[:1000])
            planted.chmod(0o755)
        else:
            planted.write_bytes(good.read_bytes())
            planted.chmod(0o644)
        ran = run_in(home)
        assert (ran.returncode, ran.stdout) == (0, "42\n"), (damage, ran.stderr)
        assert planted.read_bytes() == good.read_bytes()
        assert os.access(planted, os.X_OK)
        installed = sorted(p.name for p in planted.parent.iterdir())
        assert installed[0] == good.name and installed[1].startswith("libairlock_fork.so-"), installed
        assert len(installed) == 2, "a staging file was left behind"
