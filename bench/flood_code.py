# Forty processes tee(2) a 1 MiB pipe into stdout and stderr, each enlarged
# to 1 MiB, for ever (bench/flood.py, tests/tests/record.rs).
import ctypes, fcntl, os
F_SETPIPE_SZ, size = 1031, 1 << 20
tee = ctypes.CDLL(None).tee
for fd in (1, 2):
    fcntl.fcntl(fd, F_SETPIPE_SZ, size)
for i in range(40):
    if os.fork() == 0:
        r, w = os.pipe()
        fcntl.fcntl(w, F_SETPIPE_SZ, size)
        os.write(w, b"f" * size)
        while True:
            tee(r, 1 + i % 2, size, 0)
while True:
    os.wait()
