"""airlock runs code a language model wrote without letting it run your machine.

::

    from airlock import Sandbox

    with Sandbox(network=False, mem_mb=512, timeout_s=20) as sb:
        sb.write("/work/data.csv", csv_bytes)
        out = sb.run(code, cwd="/work")
        result = sb.read("/work/out.json") if out.ok else None

Each ``Sandbox`` is a disposable Linux sandbox (namespaces, seccomp,
Landlock, cgroups) with no network, an empty environment and hard limits,
run in-process by airlock's Rust library: there is no server to start. Every
run returns a ``RunResult`` carrying its code and the whole run record.
A ``Pool`` keeps sandboxes ready, their imports done, for runs that must
answer in tens of milliseconds.
"""

from importlib.metadata import PackageNotFoundError, version

from ._errors import ArtifactError, PolicyError, SandboxError, SandboxUnavailable
from ._pool import Pool, PoolStats
from ._result import DisplayData, ErrorInfo, Figure, RunResult, Usage
from ._sandbox import Sandbox

try:
    __version__ = version("airlock")
except PackageNotFoundError:  # imported from a source tree, not installed
    __version__ = "0+unknown"

__all__ = [
    "ArtifactError",
    "DisplayData",
    "ErrorInfo",
    "Figure",
    "PolicyError",
    "Pool",
    "PoolStats",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxUnavailable",
    "Usage",
]
