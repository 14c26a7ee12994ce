"""The sandbox: Python's face on the native ``airlock._native.Sandbox``."""

import asyncio
import json
import os
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Optional, TypeVar, Union

from . import _native
from ._errors import PolicyError
from ._result import RunResult

#: Keyword arguments whose name differs from the policy field they set. Every
#: other setting has the policy field's own name (see airlock-policy's PolicySpec).
_RENAMED = {"mem_mb": "memory_mb", "network": "allow_hosts"}
_KEYWORD_FOR_FIELD = {field: keyword for keyword, field in _RENAMED.items()}

Data = Union[bytes, bytearray, memoryview, str]


_Self = TypeVar("_Self", bound="_Closable")


class _Closable:
    """What a sandbox and a pool share: closed by ``close()`` (twice is
    fine), and by leaving a ``with`` block. ``_native`` is the object behind."""

    _native: Any

    @property
    def closed(self) -> bool:
        """Whether it has been closed."""
        return self._native.closed

    def close(self) -> None:
        self._native.close()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()


class Sandbox(_Closable):
    """A disposable sandbox: a private work directory, ``/work``, and the runs
    made in it, each in a fresh process tree with no network, an empty
    environment and hard limits.

    Use it as a context manager; leaving the block destroys the sandbox and
    everything in it, also when the block raised::

        with Sandbox(network=False, mem_mb=512, timeout_s=20) as sb:
            sb.write("/work/data.csv", csv_bytes)
            out = sb.run(code, cwd="/work")
            result = sb.read("/work/out.json") if out.ok else None

    Every setting is optional; ``None`` keeps airlock's default.

    :param network: ``False`` (the default) for no network at all, or the
        hosts the code may reach through airlock's filtering proxy:
        ``["api.example.com", "*.example.org:443", "10.0.0.5:8080"]`` (without
        a port: 443 and 80). The code finds the proxy in ``HTTP_PROXY`` and
        ``HTTPS_PROXY``; every connection, allowed or refused, is in the
        record's ``network``. The proxy never dials a private or metadata
        address unless it is named as an IP literal.
    :param timeout_s: wall-clock limit per run, seconds (default 20).
    :param cpu_time_s: CPU-time limit per run over all processes, seconds (default 20).
    :param mem_mb: memory limit, MiB, no swap (default 512).
    :param pids: processes and threads at once (default 64).
    :param cpus: CPU bandwidth in CPUs (default 1).
    :param disk_mb: size of /work and /tmp together, MiB (default 64).
    :param disk_inodes: files and folders /work and /tmp may hold (default 4096).
    :param max_output_bytes: bytes kept of each of stdout and stderr (default 1 MiB).
    :param on_output_limit: ``"truncate"`` (default: keep the first bytes and
        go on) or ``"kill"`` (stop the run) past ``max_output_bytes``.
    :param max_file_bytes: largest file copied in or out (default 16 MiB).
    :param max_files_total_bytes: most bytes copied in, and copied out (default 64 MiB).
    :param open_files: open files per process (default 256).
    :param env: the code's whole environment (nothing is inherited), over
        ``PATH``, ``HOME``, ``LANG`` and ``TMPDIR``.
    :param max_network_bytes_out: bytes the code may send through the proxy per run.
    :param max_network_bytes_in: bytes the code may receive through the proxy per run.
    :param max_connections: connections through the proxy per run.
    :param allow_degraded: isolation layers to run without where this host
        lacks them (``"cgroups"``, ``"landlock"``); without this, a missing
        layer is a ``SandboxUnavailable`` error.
    :param with_packages: extra packages for this sandbox, from the image's
        vetted set (``["statsmodels"]``); installed once into a derived image
        and cached, without opening the network to the code. A package outside
        the set is a ``PolicyError`` that lists those allowed.
    :param image: the runtime image: ``"python-data"`` (numpy, pandas,
        matplotlib, scipy; built on first use, which takes about a minute and
        needs the package index) or one built with ``airlock image build``.
    :param audit: record every run in the hash-chained audit store: ``True``
        for airlock's own (``audit.sqlite3`` in its data folder), or the path
        of a store. Default: as ``AIRLOCK_AUDIT=1`` in the environment says.
        A run the store cannot take raises ``SandboxError`` (its ``result``
        holds the record): no run is handed out unrecorded.
    :raises PolicyError: a setting cannot be used; the message says which and why.
    :raises SandboxUnavailable: this host cannot give the isolation asked for.
    """

    def __init__(
        self,
        *,
        network: Union[bool, Iterable[str], None] = False,
        timeout_s: Optional[float] = None,
        cpu_time_s: Optional[float] = None,
        mem_mb: Optional[int] = None,
        pids: Optional[int] = None,
        cpus: Optional[float] = None,
        disk_mb: Optional[int] = None,
        disk_inodes: Optional[int] = None,
        max_output_bytes: Optional[int] = None,
        on_output_limit: Optional[str] = None,
        max_file_bytes: Optional[int] = None,
        max_files_total_bytes: Optional[int] = None,
        open_files: Optional[int] = None,
        env: Optional[Mapping[str, str]] = None,
        max_network_bytes_out: Optional[int] = None,
        max_network_bytes_in: Optional[int] = None,
        max_connections: Optional[int] = None,
        allow_degraded: Optional[Iterable[str]] = None,
        with_packages: Optional[Iterable[str]] = None,
        image: str = "python-data",
        audit: Union[bool, str, "os.PathLike[str]", None] = None,
    ) -> None:
        settings: dict[str, Any] = {
            "network": network,
            "timeout_s": timeout_s,
            "cpu_time_s": cpu_time_s,
            "mem_mb": mem_mb,
            "pids": pids,
            "cpus": cpus,
            "disk_mb": disk_mb,
            "disk_inodes": disk_inodes,
            "max_output_bytes": max_output_bytes,
            "on_output_limit": on_output_limit,
            "max_file_bytes": max_file_bytes,
            "max_files_total_bytes": max_files_total_bytes,
            "open_files": open_files,
            "env": env,
            "max_network_bytes_out": max_network_bytes_out,
            "max_network_bytes_in": max_network_bytes_in,
            "max_connections": max_connections,
            "allow_degraded": allow_degraded,
            "with_packages": with_packages,
        }
        _check_image(image)
        spec_json = _spec_json(settings)
        try:
            self._native = _native.Sandbox(spec_json, image, _audit_store(audit))
        except PolicyError as error:
            raise PolicyError(_in_keyword_terms(str(error))) from None
        self._image = image

    @classmethod
    def _wrap(cls, native: "_native.Sandbox", image: str) -> "Sandbox":
        """A sandbox around a native one made elsewhere (a pool's)."""
        sandbox = cls.__new__(cls)
        sandbox._native = native
        sandbox._image = image
        return sandbox

    def write(self, path: str, data: Data) -> None:
        """Copies ``data`` into the sandbox at ``path`` (``/work/x.csv`` or
        ``x.csv``), creating folders on the way. A ``str`` is written as UTF-8.

        :raises PolicyError: the path is outside /work.
        :raises ArtifactError: the file is above ``max_file_bytes``, the files
            together above ``max_files_total_bytes``, or the path passes through
            a link.
        """
        self._native.write(path, _as_bytes("write()", data))

    def read(self, path: str, max_bytes: Optional[int] = None) -> bytes:
        """Reads one regular file back from the sandbox. Links are never
        followed, whatever the code planted.

        :param max_bytes: refuse a larger file (default: ``max_file_bytes``).
        :raises PolicyError: the path is outside /work.
        :raises ArtifactError: the file is missing, larger than the cap, or not
            a regular file (a link, a folder, a FIFO).
        """
        return self._native.read(path, max_bytes)

    def run(
        self,
        code: str,
        *,
        cwd: str = "/work",
        lang: str = "python",
        stdin: Optional[Data] = None,
        timeout_s: Optional[float] = None,
        cpu_time_s: Optional[float] = None,
        mem_mb: Optional[int] = None,
        pids: Optional[int] = None,
        cpus: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
        on_output_limit: Optional[str] = None,
        open_files: Optional[int] = None,
    ) -> RunResult:
        """Runs ``code`` in a fresh process tree of this sandbox and waits for it.

        Python code runs the way a notebook runs a cell: the last
        expression's ``repr`` comes back as ``value``, an uncaught exception as
        ``error``, and matplotlib figures as ``figures``. Files in /work stay
        between runs; variables do not.

        Code that fails, or hits a limit, is a result whose ``ok`` is false,
        not an exception. Other Python threads run meanwhile.

        :param cwd: the working directory, /work or a folder below it.
        :param lang: ``"python"`` or ``"sh"``.
        :param stdin: the code's standard input (default: empty).
        :param timeout_s: limits for this run only, instead of the sandbox's
            (``cpu_time_s``, ``mem_mb``, ``pids``, ``cpus``,
            ``max_output_bytes``, ``on_output_limit``, ``open_files`` too);
            ``None`` keeps the sandbox's. The result's ``limit`` says which
            one stopped the run.
        :raises PolicyError: a bad ``cwd``, ``lang`` or limit.
        :raises SandboxError: the sandbox itself failed (or is closed); its
            ``result`` holds the run's record. ``SandboxUnavailable`` when the
            run asked for what the host cannot give.
        """
        stdin_bytes = None if stdin is None else _as_bytes("stdin", stdin)
        limits = {
            "timeout_s": timeout_s,
            "cpu_time_s": cpu_time_s,
            "memory_mb": mem_mb,
            "pids": pids,
            "cpus": cpus,
            "max_output_bytes": max_output_bytes,
            "on_output_limit": on_output_limit,
            "open_files": open_files,
        }
        limits = {name: value for name, value in limits.items() if value is not None}
        limits_json = _to_json(limits) if limits else None
        try:
            native = self._native.run(code, lang, cwd, stdin_bytes, limits_json)
        except PolicyError as error:
            raise PolicyError(_in_keyword_terms(str(error))) from None
        return RunResult._from_native(native)

    async def run_async(self, code: str, **options: Any) -> RunResult:
        """``run`` for asyncio, with the same options: the run happens on a
        worker thread, so the event loop and other sandboxes go on meanwhile.

        Cancelling the call (``asyncio.wait_for`` timing out, a task
        cancelled) stops the run at once; the sandbox then refuses further
        runs, so close it and make a new one.
        """
        try:
            return await asyncio.to_thread(self.run, code, **options)
        except asyncio.CancelledError:
            self._native.kill()
            raise

    def close(self) -> None:
        """Destroys the sandbox and everything in it. A run in progress on
        another thread is waited for. Closing twice is fine."""
        self._native.close()

    def __repr__(self) -> str:
        return f"Sandbox(image={self._image!r}, closed={self.closed})"


#: The keyword arguments of ``Sandbox`` that make its policy.
SETTINGS = (
    "network",
    "timeout_s",
    "cpu_time_s",
    "mem_mb",
    "pids",
    "cpus",
    "disk_mb",
    "disk_inodes",
    "max_output_bytes",
    "on_output_limit",
    "max_file_bytes",
    "max_files_total_bytes",
    "open_files",
    "env",
    "max_network_bytes_out",
    "max_network_bytes_in",
    "max_connections",
    "allow_degraded",
    "with_packages",
)


def _spec_json(settings: Mapping[str, Any]) -> str:
    """The ``PolicySpec`` JSON for ``Sandbox``'s keyword arguments (``None``
    keeps the default)."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}; the settings are: {', '.join(SETTINGS)}")
    checked = dict(settings)
    checked["network"] = _allowed_hosts(settings.get("network"))
    checked["env"] = _mapping("env", settings.get("env"))
    checked["allow_degraded"] = _strings("allow_degraded", settings.get("allow_degraded"))
    checked["with_packages"] = _strings("with_packages", settings.get("with_packages"))
    spec = {_RENAMED.get(name, name): value for name, value in checked.items() if value is not None}
    return _to_json(spec)


def _check_image(image: Any) -> None:
    if not isinstance(image, str):
        raise PolicyError(f"image must be the name of an image, such as 'python-data' (got {image!r})")


def _as_bytes(what: str, data: Data) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} takes bytes or str, not {type(data).__name__}")


def _allowed_hosts(network: Union[bool, Iterable[str], None]) -> Optional[list[str]]:
    if network is None or network is False:
        return None
    if network is True:
        raise PolicyError(
            "network=True would open every host, which airlock never does; "
            "name the hosts the code may reach, e.g. network=['api.example.com']"
        )
    if isinstance(network, str):
        raise PolicyError(f"network takes a list of hosts: network=[{network!r}]")
    return _strings("network", network)


def _strings(name: str, values: Optional[Iterable[str]]) -> Optional[list[str]]:
    if values is None:
        return None
    try:
        items = list(values)
    except TypeError:
        raise PolicyError(f"{name} takes a list of strings (got {values!r})") from None
    for item in items:
        if not isinstance(item, str):
            raise PolicyError(f"{name} takes a list of strings; {item!r} is not one")
    return items


_AUDIT_ENV = "AIRLOCK_AUDIT"


def _audit_store(audit: Union[bool, str, "os.PathLike[str]", None]) -> Optional[str]:
    """The audit store for the native side: ``None`` for none, ``""`` for
    airlock's own, else its path. Unset, ``AIRLOCK_AUDIT`` decides, as it does
    for ``airlock run``."""
    if audit is None:
        value = os.environ.get(_AUDIT_ENV, "")
        if value in ("", "0", "false", "no"):
            return None
        if value in ("1", "true", "yes"):
            return ""
        raise PolicyError(f"{_AUDIT_ENV}={value!r}: use 1 to record runs, 0 not to")
    if audit is True:
        return ""
    if audit is False:
        return None
    if isinstance(audit, (str, os.PathLike)):
        path = os.fspath(audit)
        if isinstance(path, str) and path:
            return path
    raise PolicyError(f"audit takes True, False or the path of an audit store (got {audit!r})")


def _mapping(name: str, values: Optional[Mapping[str, str]]) -> Optional[dict[str, str]]:
    if values is None:
        return None
    if not isinstance(values, Mapping):
        raise PolicyError(f"{name} takes a dict of strings, such as {{'LANG': 'C.UTF-8'}} (got {values!r})")
    return dict(values)


def _to_json(spec: dict[str, Any]) -> str:
    for name, value in spec.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            keyword = _KEYWORD_FOR_FIELD.get(name, name)
            raise PolicyError(
                f"{keyword}={value!r} is not a finite number, a string, or a list or dict of them"
            ) from None
    return json.dumps(spec)


def _in_keyword_terms(message: str) -> str:
    """The native side names policy fields; say the keyword the caller wrote."""
    for keyword, field in _RENAMED.items():
        message = message.replace(field, keyword)
    return message
