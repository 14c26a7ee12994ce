# Generated from airlock-policy's PolicySpec schema: do not edit. Regenerate with
#   AIRLOCK_BLESS=1 cargo test -p airlock-policy --test python_stubs
"""The policy as airlock's one schema states it: fields, types, bounds."""

from typing import Any, Dict, List, Literal, Optional, TypedDict, Union


class PolicySpec(TypedDict, total=False):
    """Every field optional; None keeps the default."""

    allow_degraded: Optional[List[Literal["cgroups", "landlock"]]]
    """Isolation layers the caller accepts to lose where the host lacks them (`cgroups`, `landlock`). Without this a missing layer is an error."""

    allow_hosts: Optional[List[str]]
    """Hosts reachable through the proxy: `HOST[:PORT]`, `*.DOMAIN[:PORT]`, or an IP literal. Empty or absent: no network."""

    backend: Optional[Literal["linux", "wasm"]]
    """`linux` (default) or `wasm`."""

    cpu_time_s: Optional[float]
    """CPU-time limit over all processes, seconds (default 20)."""

    cpus: Optional[float]
    """CPU bandwidth in CPUs (default 1)."""

    disk_inodes: Optional[int]
    """Files and directories /work and /tmp may hold together (default 4096)."""

    disk_mb: Optional[int]
    """Size of the writable /work and /tmp together, MiB (default 64)."""

    env: Optional[Dict[str, str]]
    """The code's whole environment; nothing is inherited."""

    max_connections: Optional[int]
    """Connections through the proxy per run."""

    max_file_bytes: Optional[int]
    """Largest single file copied in or out (default 16 MiB)."""

    max_files_total_bytes: Optional[int]
    """Largest total copied in, and copied out, per run (default 64 MiB)."""

    max_network_bytes_in: Optional[int]
    """Bytes the sandbox may receive through the proxy per run."""

    max_network_bytes_out: Optional[int]
    """Bytes the sandbox may send through the proxy per run."""

    max_output_bytes: Optional[int]
    """Bytes kept per output stream (default 1 MiB)."""

    memory_mb: Optional[int]
    """Memory limit, MiB, no swap (default 512)."""

    on_output_limit: Optional[Literal["truncate", "kill"]]
    """`truncate` (default) or `kill` when a stream passes `max_output_bytes`."""

    open_files: Optional[int]
    """Open files per process (default 256)."""

    pids: Optional[int]
    """Processes and threads at once (default 64)."""

    timeout_s: Optional[float]
    """Wall-clock limit, seconds (default 20)."""

    with_packages: Optional[List[str]]
    """Extra packages for the run, beyond its image, from the operator's vetted set for that image (`statsmodels`): installed once into a derived image, cached, never with network in the run. A package outside the vetted set is refused with the list of those allowed."""


#: The bounds of each numeric field: (minimum, maximum), None where there is none.
BOUNDS = {
    "cpu_time_s": (0.001, 86400.0),
    "cpus": (0.01, None),
    "disk_inodes": (64, 18446744073709551615),
    "disk_mb": (1, 18446744073709551615),
    "max_connections": (1, 4294967295),
    "max_file_bytes": (1, 18446744073709551615),
    "max_files_total_bytes": (1, 18446744073709551615),
    "max_network_bytes_in": (1, 18446744073709551615),
    "max_network_bytes_out": (1, 18446744073709551615),
    "max_output_bytes": (0, 18446744073709551615),
    "memory_mb": (16, 18446744073709551615),
    "open_files": (16, 4294967295),
    "pids": (1, 4294967295),
    "timeout_s": (0.001, 86400.0),
}

#: The fields one run may set for itself (`Sandbox.run(..., timeout_s=...)`).
PER_RUN = (
    "timeout_s",
    "cpu_time_s",
    "memory_mb",
    "pids",
    "cpus",
    "max_output_bytes",
    "on_output_limit",
    "open_files",
)
