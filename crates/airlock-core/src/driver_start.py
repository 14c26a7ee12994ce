# Where airlock's Python driver starts (argv as driver.py's, beside this file).
#
# Python compiles a script it is given at every start, and the driver is a few
# hundred lines: compiling it cost about a tenth of a small run. So the driver
# runs from bytecode when there is some it can trust: driver.pyc, beside it,
# made on the host by this interpreter from this very source. It is Python's
# own checked-hash .pyc, checked here as the import system checks one: this
# interpreter's magic number, and the hash of the source beside it. Anything
# else (no .pyc, another interpreter's, another source's, a damaged one) is
# compiled from the source as before: a .pyc can cost the compile, never change
# what runs.
import marshal
import sys


def _code_of(path):
    """The code of the driver's file `path`: its checked bytecode, or its source compiled."""
    with open(path, "rb") as f:
        source = f.read()
    try:
        import _imp
        import _frozen_importlib_external as bootstrap

        with open(path + "c", "rb") as f:
            pyc = f.read()
        if (
            pyc[:4] == bootstrap.MAGIC_NUMBER
            and pyc[4:8] == b"\x03\x00\x00\x00"
            and pyc[8:16] == _imp.source_hash(bootstrap._RAW_MAGIC_NUMBER, source)
        ):
            return marshal.loads(memoryview(pyc)[16:])
    except Exception:  # noqa: BLE001 - no usable bytecode: the source is compiled
        pass
    return compile(source, path, "exec", dont_inherit=True)


# The driver runs here, as __main__, as if Python had been given driver.py.
__file__ = __file__.rpartition("/")[0] + "/driver.py"
exec(_code_of(__file__))
