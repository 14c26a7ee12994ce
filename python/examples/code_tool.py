"""What the three tool examples share: the tool's description, its
parameters, and how a run is told to the model.

A model calls the tool with ``{"code": "...", "lang": "python"}``; the tool
runs the code in the caller's sandbox and answers with text (status, output,
value, error) and the figures as PNGs. Code that fails is a normal answer: the
model reads the error and tries again. A bad argument is an error answer.
Only a sandbox that cannot run at all raises, for the application to handle.
"""

from collections.abc import Mapping
from typing import Any

from airlock import RunResult, Sandbox

NAME = "run_code"

DESCRIPTION = (
    "Run Python (or POSIX shell) code in a disposable sandbox with no network. "
    "Python runs like a notebook cell: the value of the last expression is returned, "
    "print() output is captured, and matplotlib figures come back as images. "
    "numpy, pandas, matplotlib and scipy are installed. Files in /work (the working "
    "directory) stay between calls; variables do not."
)

#: JSON Schema of the arguments, as every vendor's tool format takes it.
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "The code to run."},
        "lang": {"type": "string", "enum": ["python", "sh"], "description": "The language (default python)."},
    },
    "required": ["code"],
    "additionalProperties": False,
}


class ToolInputError(ValueError):
    """The model's arguments cannot be used; the message is for the model."""


def check_arguments(arguments: Mapping[str, Any]) -> tuple[str, str]:
    """The code and the language the model asked for.

    :raises ToolInputError: the arguments are not what PARAMETERS says.
    """
    unknown = set(arguments) - set(PARAMETERS["properties"])
    if unknown:
        raise ToolInputError(f"unknown arguments: {', '.join(sorted(unknown))}; pass only 'code' and 'lang'")
    code = arguments.get("code")
    if not isinstance(code, str):
        raise ToolInputError("the 'code' argument is required and must be a string")
    lang = arguments.get("lang", "python")
    if lang not in ("python", "sh"):
        raise ToolInputError(f"lang={lang!r}: use 'python' or 'sh'")
    return code, lang


def run_code(sandbox: Sandbox, arguments: Mapping[str, Any]) -> RunResult:
    """Runs the code the model asked for.

    :raises ToolInputError: the arguments are not what PARAMETERS says.
    """
    code, lang = check_arguments(arguments)
    return sandbox.run(code, lang=lang)


def describe(result: RunResult) -> str:
    """The run, told in a few lines a model reads well."""
    lines = [f"status: {result.status}" + (f" (exit code {result.exit_code})" if result.exit_code is not None else "")]
    if result.limit:
        lines.append(f"stopped by the {result.limit} limit: {result.message}")
    if result.stdout:
        lines += ["stdout:", result.stdout.rstrip("\n")]
    if result.stderr and not result.error:
        lines += ["stderr:", result.stderr.rstrip("\n")]
    if result.value is not None:
        lines.append(f"value: {result.value}")
    if result.error:
        lines += ["error:", result.error.traceback.rstrip("\n")]
    if result.figures:
        lines.append(f"figures: {len(result.figures)}, attached as images")
    return "\n".join(lines)
