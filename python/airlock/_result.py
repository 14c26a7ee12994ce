"""What a run returns: the result, its error, figures and usage."""

import base64
import json
import os
from dataclasses import dataclass
from typing import Any, Optional, Union


@dataclass(frozen=True)
class ErrorInfo:
    """The code's uncaught exception, with line numbers that match the code as
    it was given (airlock's own frames are removed from the traceback)."""

    type: str
    message: str
    traceback: str
    line: Optional[int] = None
    column: Optional[int] = None


@dataclass(frozen=True)
class Usage:
    """What the run used. A figure the backend could not measure is ``None``."""

    wall_ms: int
    cpu_ms: Optional[int] = None
    peak_memory_bytes: Optional[int] = None
    #: Milliseconds spent getting the image with the extra packages
    #: (``with_packages``), and whether it was already built.
    image_ms: Optional[int] = None
    image_cached: Optional[bool] = None
    #: How the sandbox started: ``"cold"`` (made for the run) or ``"pooled"``
    #: (taken ready from a pool, its clocks started at the release).
    start: Optional[str] = None
    #: A pooled run: how long its sandbox waited ready before the run.
    pool_wait_ms: Optional[int] = None
    #: From the request to the code's first instruction.
    first_instruction_ms: Optional[int] = None


@dataclass(frozen=True, repr=False)
class Figure:
    """A matplotlib figure the code showed or left open, as a PNG.

    Notebooks display it (``_repr_png_``); ``save`` writes it to a file.
    """

    name: str
    width: int
    height: int
    png: bytes

    def save(self, path: Union[str, "os.PathLike[str]"]) -> str:
        """Writes the PNG to ``path`` and returns the path written."""
        with open(path, "wb") as f:
            f.write(self.png)
        return os.fspath(path)

    def _repr_png_(self) -> bytes:
        return self.png

    def __repr__(self) -> str:
        return f"Figure(name={self.name!r}, width={self.width}, height={self.height}, png=<{len(self.png)} bytes>)"


@dataclass(frozen=True, repr=False)
class DisplayData:
    """A rich result, as a notebook shows it: one object passed to
    ``display()`` (``kind == "display"``) or the last expression's value
    (``kind == "value"``), in several representations keyed by MIME type:
    ``text/plain`` always, and ``text/html``, ``text/markdown``,
    ``image/png``... when the object has them. A notebook displays it as it
    is (``_repr_mimebundle_``).
    """

    kind: str
    data: dict[str, str]

    @property
    def text(self) -> str:
        return self.data.get("text/plain", "")

    @property
    def html(self) -> Optional[str]:
        return self.data.get("text/html")

    @property
    def png(self) -> Optional[bytes]:
        png = self.data.get("image/png")
        return base64.b64decode(png) if png is not None else None

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return dict(self.data)

    def __repr__(self) -> str:
        return f"DisplayData(kind={self.kind!r}, types={sorted(self.data)!r}, text={self.text[:60]!r})"


class RunResult:
    """What one run did.

    ``ok`` is true when the code exited 0 within every limit. ``status`` says
    how the run ended in one word: ``ok``, ``failed``, ``timeout``,
    ``memory_limit``, ``cpu_limit``, ``output_limit``, ``internal_error``
    (airlock itself failed while the code ran; everything observed is kept)
    or ``sandbox_error``;
    ``limit`` names the limit that stopped it (``wall_time``, ``memory``,
    ``cpu_time``, ``output``), if one did. ``record`` is the whole run record
    as a dict, the same one ``airlock run --json`` prints.
    """

    __slots__ = (
        "code",
        "error",
        "exit_code",
        "figures",
        "limit",
        "message",
        "ok",
        "record",
        "results",
        "status",
        "stderr",
        "stdout",
        "usage",
        "value",
    )

    ok: bool
    status: str
    limit: Optional[str]
    exit_code: Optional[int]
    stdout: str
    stderr: str
    code: str
    value: Optional[str]
    error: Optional[ErrorInfo]
    figures: list[Figure]
    results: list[DisplayData]
    usage: Usage
    message: Optional[str]
    record: dict[str, Any]

    def __init__(self, record: dict[str, Any], *, ok: bool, limit: Optional[str]) -> None:
        self.record = record
        self.ok = ok
        self.limit = limit
        self.status = record["status"]
        self.exit_code = record.get("exit_code")
        self.stdout = record.get("stdout", "")
        self.stderr = record.get("stderr", "")
        self.code = record.get("code", "")
        #: ``repr`` of the code's last expression, as a notebook shows it.
        self.value = record.get("value")
        error = record.get("error")
        self.error = ErrorInfo(**error) if error else None
        self.figures = [
            Figure(f["name"], f["width"], f["height"], base64.b64decode(f.get("png_base64", "")))
            for f in record.get("figures", [])
        ]
        #: Rich results in order: every ``display()`` call, then the value.
        self.results = [DisplayData(r["kind"], dict(r["data"])) for r in record.get("results", [])]
        self.usage = Usage(**record.get("usage", {"wall_ms": 0}))
        #: Why the run ended as it did, when the exit code does not say (a limit, a sandbox error).
        self.message = record.get("message")

    @classmethod
    def _from_native(cls, native: tuple[str, bool, Optional[str]]) -> "RunResult":
        record_json, ok, limit = native
        return cls(json.loads(record_json), ok=ok, limit=limit)

    def __repr__(self) -> str:
        parts = [f"status={self.status!r}", f"exit_code={self.exit_code!r}"]
        if self.limit:
            parts.append(f"limit={self.limit!r}")
        if self.value is not None:
            parts.append(f"value={self.value!r}")
        if self.error:
            parts.append(f"error={self.error.type!r}")
        if self.figures:
            parts.append(f"figures={len(self.figures)}")
        return f"RunResult({', '.join(parts)})"
