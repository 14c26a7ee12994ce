"""`pip install ./python` into a fresh venv gives a working package: the
extension, the helper inside it, and the README's example as written."""

import os
import subprocess
import venv

from conftest import REPO, readme_snippet


def test_a_fresh_venv_installs_the_package_and_runs_the_readme(tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", str(REPO / "python")],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    # Run from an empty folder, so that only the installed package can be imported.
    script = tmp_path / "snippet.py"
    script.write_text(readme_snippet())
    run = subprocess.run([str(python), str(script)], cwd=tmp_path, capture_output=True, text=True, env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["ok 20.0", "b'{\"weighted_median\": 20.0}'"]

    check = (
        "import airlock, airlock._native, os, pathlib\n"
        "package = pathlib.Path(airlock.__file__).parent\n"
        "assert (package / 'py.typed').is_file() and (package / '_native.pyi').is_file()\n"
        "helper = airlock._native.helper_path()\n"
        "assert os.access(helper, os.X_OK), helper\n"
        "print(airlock.__version__)"
    )
    details = subprocess.run([str(python), "-c", check], cwd=tmp_path, capture_output=True, text=True)
    assert details.returncode == 0, details.stderr
    assert details.stdout.strip() and details.stdout.strip() != "0+unknown"
