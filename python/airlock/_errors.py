"""airlock's exceptions. The native module raises these; see errors.rs."""

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ._result import RunResult


class SandboxError(Exception):
    """The sandbox could not do what was asked. The base of airlock's exceptions.

    Code that runs and fails is not an exception: it is a ``RunResult`` whose
    ``ok`` is false. A ``SandboxError`` from ``Sandbox.run`` means the sandbox
    itself failed; its ``result`` then holds the run's record.
    """

    _result: Optional[tuple[str, bool, Optional[str]]] = None

    @property
    def result(self) -> "Optional[RunResult]":
        """The result of the run the sandbox could not carry out (status
        ``"sandbox_error"``, with its record), when a run raised this."""
        if self._result is None:
            return None
        from ._result import RunResult

        return RunResult._from_native(self._result)


class PolicyError(SandboxError, ValueError):
    """A setting or argument that cannot be used: a limit out of range, a bad
    host rule, a path outside /work, an image that does not exist. The message
    names the setting and the fix."""


class ArtifactError(SandboxError):
    """A file that could not be copied out (missing, above the size cap, or not
    a regular file: a link, a directory, a FIFO) or in (above the size caps,
    or through a link the sandbox planted)."""


class SandboxUnavailable(SandboxError):
    """This host cannot give the isolation asked for (a missing kernel
    feature, no cgroup for an ordinary user, the sandbox helper missing). The
    message says what is missing, and whether it may be accepted with
    ``allow_degraded``."""
