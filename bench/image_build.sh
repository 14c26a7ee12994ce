#!/usr/bin/env bash
# A cold build of the python-data image, paired A B A B:
#   pip      how airlock built images before issue 13, on the host: a venv,
#            `pip install --only-binary=:all:` of the same pinned versions,
#            matplotlib's font cache, `pip list` (pip's download cache warm)
#   airlock  `airlock image build python-data` into an empty store whose
#            checked-file cache is warm: uv installs in a sandbox, every file
#            hashed, the tree sealed and hashed (no image to reuse)
#   rebuild  `airlock image build python-data` when the image exists
# Goal: airlock <= 0.25x pip; a rebuild free.
#
# usage: bench/image_build.sh [ROUNDS]     (needs a release build: cargo build --release)
# Results go to bench/results/image-build.json and are summarised on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
airlock=$PWD/target/release/airlock
[ -x "$airlock" ] || { echo "build first: cargo build --release" >&2; exit 1; }
# The interpreter itself, not the pyenv shim (whose start-up hooks would be timed too).
python=$(python3 -c 'import sys; print(sys.executable)')
work=$(mktemp -d "${TMPDIR:-/var/tmp}/airlock-image-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The lock's versions, as the requirements pip was given.
"$python" - crates/airlock/src/image/python-data.pylock.toml > "$work/requirements.txt" <<'PY'
import sys, tomllib
for p in tomllib.load(open(sys.argv[1], "rb"))["packages"]:
    print(f"{p['name']}=={p['version']}")
PY
# Warm both download caches (and build the image the rebuild reuses).
export AIRLOCK_HOME=$work/warm
"$airlock" image build python-data >&2
pip_build="rm -rf $work/pip && $python -m venv $work/pip \
 && $work/pip/bin/python -m pip install --only-binary=:all: --no-input --disable-pip-version-check --progress-bar off -r $work/requirements.txt \
 && MPLCONFIGDIR=$work/pip/mplconfig MPLBACKEND=Agg $work/pip/bin/python -c 'import matplotlib.font_manager' \
 && $work/pip/bin/python -m pip list --format json --disable-pip-version-check"
sh -c "$pip_build" >/dev/null
airlock_build="rm -rf $work/cold && mkdir -p $work/cold/images/.cache && cp -al $work/warm/images/.cache/files $work/cold/images/.cache/ \
 && AIRLOCK_HOME=$work/cold $airlock image build python-data"
rebuild="AIRLOCK_HOME=$work/warm $airlock image build python-data"
python3 bench/paired.py --rounds "$rounds" --warmup 0 --names pip,airlock,rebuild \
  --json bench/results/image-build.json "$pip_build" "$airlock_build" "$rebuild"
