# Compiles an image's Python files to bytecode inside the build sandbox, with
# the image's own interpreter started with -I -S (so no package's .pth runs),
# on every CPU the step has. Test folders are left out: nothing imports them
# at run time, and they are half of the files of numpy, scipy and pandas.
import os
import subprocess
import sys
import time

WORKER = """
import py_compile, sys
failed = 0
for line in sys.stdin:
    try:
        py_compile.compile(line.rstrip("\\n"), doraise=True)
    except Exception:
        failed += 1
print(failed)
"""

start = time.monotonic()
root = sys.argv[1]
files = []
for folder, subfolders, names in os.walk(root):
    subfolders[:] = sorted(d for d in subfolders if d not in ("tests", "__pycache__"))
    files.extend(os.path.join(folder, n) for n in sorted(names) if n.endswith(".py"))
files.sort(key=lambda f: -os.path.getsize(f))
count = max(1, min(os.cpu_count() or 1, 8))
shares = [files[i::count] for i in range(count)]
workers = [
    subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", WORKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    for _ in shares
]
failed = 0
for worker, share in zip(workers, shares):
    worker.stdin.write("".join(f + "\n" for f in share))
    worker.stdin.close()
for worker in workers:
    failed += int(worker.stdout.read().strip() or 0)
    worker.wait()
print(
    f"compiled {len(files) - failed} of {len(files)} files with {count} workers "
    f"in {time.monotonic() - start:.1f} s",
    flush=True,
)
