"""A pool of sandboxes made ready ahead of their runs: ``airlock.Pool``."""

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

from . import _native
from ._errors import PolicyError
from ._result import RunResult
from ._sandbox import Data, Sandbox, _Closable, _audit_store, _check_image, _in_keyword_terms, _spec_json


@dataclass(frozen=True)
class PoolStats:
    """What a pool has done and holds (``Pool.stats()``)."""

    #: Sandboxes it keeps ready when full.
    size: int
    #: Sandboxes ready now.
    ready: int
    #: Memory the ready sandboxes hold (their cgroups' usage, summed), bytes.
    memory_bytes: Optional[int]
    #: Runs served by a ready sandbox.
    hits: int
    #: Runs that found none ready and ran cold.
    misses: int
    #: Runs whose settings a ready sandbox could not take, run cold.
    unsuited: int
    #: Sandboxes made ready; how long the last took, and all of them, ms.
    refills: int
    last_refill_ms: Optional[int]
    refill_ms_total: int
    #: Sandboxes that failed to become ready, and why the last one did.
    refill_failures: int
    last_refill_error: Optional[str]
    #: Ready sandboxes destroyed for their age (``idle_expiry_s``).
    expired: int
    #: Templates started (a forked pool's; 0 for a pooled one), and the
    #: memory the live one holds, bytes (counted in ``memory_bytes`` too).
    templates: int
    template_memory_bytes: Optional[int]


class Pool(_Closable):
    """Sandboxes made ready ahead of their runs, so that a run answers in tens
    of milliseconds and is still fresh.

    Each ready sandbox is a complete sandbox, made as ``Sandbox`` makes one,
    whose interpreter has imported ``preload`` (numpy, pandas and matplotlib
    by default) and waits before the first byte of code. A sandbox taken from
    the pool serves one run warm and is destroyed when closed: never reused,
    never shared. The pool refills in the background, one sandbox at a time::

        with Pool(size=2, mem_mb=512, timeout_s=20) as pool:
            with pool.sandbox() as sb:
                sb.write("/work/data.csv", csv_bytes)
                out = sb.run(code)  # out.usage.start == "pooled"
            out = pool.run(code, files={"data.csv": csv_bytes})

    A run never waits for the pool. It runs cold, its record saying why
    (``record["isolation"]["details"]["pool"]``), when no sandbox is ready,
    or when its settings cannot be applied to a ready one: a run may lower
    the wall and CPU time, the memory and the process limit (applied to the
    ready sandbox's cgroup from outside, where it holds less than the new
    limit), and set the variables of ``env`` that ``env_at_claim`` names
    (the driver sets them before the code's first byte); anything else that
    differs from the pool's (the rest of the environment, the disk, the
    network...) is in force from a sandbox's start.

    :param size: sandboxes kept ready (default 2). Each holds an interpreter
        with its preload: about 100 MB with pandas.
    :param preload: modules each ready sandbox imports before it waits
        (default ``["numpy", "pandas", "matplotlib"]``).
    :param idle_expiry_s: a sandbox ready for longer is made anew (default 600).
    :param memory_budget_mb: the most the ready sandboxes may hold together,
        MiB: no refill starts that would take them past it (default: none).
    :param mode: how the ready sandboxes are made. ``"pooled"`` (the
        default): each starts its own interpreter and imports ``preload``
        (about a second each with pandas), so runs share nothing at all.
        ``"forked"``: one template sandbox per pool imports ``preload``
        once and each ready sandbox is forked from it, making its own
        namespaces, /work, /tmp, cgroup and every layer before its run (tens
        of milliseconds, and its memory shared with the template until
        written). Forked runs share what the template had before any run:
        its address layout, its hash seed (``random``, ``numpy.random`` and
        ``os.urandom`` are reseeded in each fork), its host ids. A pool with
        ``network`` hosts, or a degraded policy, cannot fork: its runs are
        served cold, and ``stats().last_refill_error`` says why.
    :param env_at_claim: variables a run's ``env`` may set, change or remove
        and still run warm (default: none), such as ``["TASK_ID"]``. Only
        names nothing reads before the code starts: the interpreter, the
        preload and C libraries read some at start-up, so a name known to be
        (``PYTHONPATH``, ``LD_PRELOAD``, ``OMP_NUM_THREADS``, ``LANG``,
        ``TZ``...) raises ``PolicyError``.
    :param settings: every setting of ``Sandbox`` (``mem_mb``, ``timeout_s``,
        ``env``...), for every sandbox of the pool; ``with_packages`` aside.
    :raises PolicyError: a setting cannot be used; the message says which and why.
    :raises SandboxUnavailable: this host cannot give the isolation asked for.
    """

    def __init__(
        self,
        *,
        size: int = 2,
        preload: Optional[Iterable[str]] = None,
        idle_expiry_s: Optional[float] = None,
        memory_budget_mb: Optional[int] = None,
        env_at_claim: Optional[Iterable[str]] = None,
        mode: str = "pooled",
        image: str = "python-data",
        audit: Union[bool, str, "os.PathLike[str]", None] = None,
        **settings: Any,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 64:
            raise PolicyError(f"size takes the number of sandboxes kept ready, from 1 to 64 (got {size!r})")
        if isinstance(preload, str):
            raise PolicyError(f"preload takes a list of module names: preload=[{preload!r}]")
        modules = None if preload is None else list(preload)
        if modules is not None and not all(isinstance(m, str) for m in modules):
            raise PolicyError(f"preload takes a list of module names (got {modules!r})")
        if isinstance(idle_expiry_s, bool) or not isinstance(idle_expiry_s, (int, float, type(None))):
            raise PolicyError(f"idle_expiry_s takes a number of seconds (got {idle_expiry_s!r})")
        if isinstance(memory_budget_mb, bool) or not isinstance(memory_budget_mb, (int, type(None))):
            raise PolicyError(f"memory_budget_mb takes a number of MiB (got {memory_budget_mb!r})")
        if isinstance(env_at_claim, str):
            raise PolicyError(f"env_at_claim takes a list of variable names: env_at_claim=[{env_at_claim!r}]")
        names = None if env_at_claim is None else list(env_at_claim)
        if names is not None and not all(isinstance(n, str) for n in names):
            raise PolicyError(f"env_at_claim takes a list of variable names (got {names!r})")
        if not isinstance(mode, str):
            raise PolicyError(f'mode takes "pooled" or "forked" (got {mode!r})')
        _check_image(image)
        spec_json = _spec_json(settings)
        try:
            self._native = _native.Pool(
                spec_json,
                image,
                size,
                modules,
                None if idle_expiry_s is None else float(idle_expiry_s),
                memory_budget_mb,
                _audit_store(audit),
                names,
                mode,
            )
        except PolicyError as error:
            raise PolicyError(_in_keyword_terms(str(error))) from None
        self._image = image

    def sandbox(self, **settings: Any) -> Sandbox:
        """A sandbox for one warm run: a ready one when the pool has one and
        ``settings`` (any of ``Sandbox``'s, over the pool's) can be applied
        to it, else one made now (its first run is cold and says why). Its
        first run is the warm one; a second runs cold in the same sandbox, as
        in any ``Sandbox``. Never waits for the pool. Use it as a context
        manager, as any ``Sandbox``.

        :raises PolicyError: a setting cannot be used.
        :raises SandboxError: the pool is closed, or a cold sandbox could not be made.
        """
        spec_json = _spec_json(settings) if settings else None
        try:
            native = self._native.sandbox(spec_json)
        except PolicyError as error:
            raise PolicyError(_in_keyword_terms(str(error))) from None
        return Sandbox._wrap(native, self._image)

    def run(self, code: str, *, files: Optional[Mapping[str, Data]] = None, **options: Any) -> RunResult:
        """Runs ``code`` in a sandbox of the pool (``Pool.sandbox()``) with
        ``files`` copied into /work first (``{"data.csv": csv_bytes}``), and
        destroys the sandbox after. ``options`` are ``Sandbox.run``'s
        (``cwd``, ``stdin``, ``timeout_s``, ``mem_mb``...).
        """
        with self.sandbox() as sb:
            for path, data in (files or {}).items():
                sb.write(path, data)
            return sb.run(code, **options)

    def wait_ready(self, n: Optional[int] = None, timeout_s: float = 120.0) -> bool:
        """Waits up to ``timeout_s`` until ``n`` sandboxes (default: the
        pool's size) are ready, and says whether they are. A run never needs
        to wait; benchmarks and tests do."""
        return self._native.wait_ready(self.stats().size if n is None else n, float(timeout_s))

    def stats(self) -> PoolStats:
        """What the pool has done and holds now."""
        return PoolStats(**json.loads(self._native.stats()))

    def close(self) -> None:
        """Destroys the ready sandboxes and stops making more. Sandboxes taken
        from the pool live on until they are closed. Closing twice is fine."""
        self._native.close()

    def __repr__(self) -> str:
        if self.closed:
            return f"Pool(image={self._image!r}, closed=True)"
        stats = self.stats()
        return f"Pool(image={self._image!r}, size={stats.size}, ready={stats.ready})"
