# Sourced by the benchmarks that compare against bare Python. Sets
# $bare_python to a clean venv of the python-data image's interpreter
# holding the image's packages, made on the host (the image's own venv
# names its interpreter where the sandbox shows it, /opt/airlock/python,
# so it does not run outside), in a folder removed at exit; $bare_venv is
# that folder. Needs $AIRLOCK_HOME with the image built.
image=$(cut -d' ' -f1 "$AIRLOCK_HOME/images/names/python-data")
read -r executable base version < <(python3 -c "import json; p = json.load(open('$AIRLOCK_HOME/images/$image/manifest.json'))['python']; print(p['executable'], p['base_prefix'], p['version'])")
short=${version%.*}
bare_venv=$(mktemp -d /var/tmp/airlock-bare-venv.XXXXXX)
mkdir -p "$bare_venv/bin" "$bare_venv/lib/python$short"
ln -s "$executable" "$bare_venv/bin/python"
ln -s "$AIRLOCK_HOME/images/$image/venv/lib/python$short/site-packages" "$bare_venv/lib/python$short/site-packages"
printf 'home = %s\ninclude-system-site-packages = false\nversion = %s\n' "$(dirname "$executable")" "$version" > "$bare_venv/pyvenv.cfg"
bare_python=$bare_venv/bin/python
