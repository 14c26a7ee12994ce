"""airlock as a LangChain tool that answers ``(content, artifact)``: the text
for the model, and the run's figures (``airlock.Figure``, PNG bytes) as the
artifact, which the application sees and the model does not.

    from langchain_tool import make_tool

    with Sandbox() as sb:
        tool = make_tool(sb)
        model = chat_model.bind_tools([tool])
        ai = model.invoke(messages)
        for call in ai.tool_calls:
            message = tool.invoke(call)          # a ToolMessage
            message.content, message.artifact    # text; list of figures

Needs langchain-core (``pip install langchain-core``).
"""

from typing import Any

from code_tool import DESCRIPTION, NAME, PARAMETERS, ToolInputError, check_arguments, describe
from langchain_core.tools import StructuredTool, ToolException

from airlock import Figure, RunResult, Sandbox


def make_tool(sandbox: Sandbox) -> StructuredTool:
    """A tool running code in ``sandbox``. ``ainvoke`` uses
    ``Sandbox.run_async``: the event loop goes on while the code runs."""

    def run(**arguments: Any) -> tuple[str, list[Figure]]:
        code, lang = _checked(arguments)
        return _answer(sandbox.run(code, lang=lang))

    async def run_async(**arguments: Any) -> tuple[str, list[Figure]]:
        code, lang = _checked(arguments)
        return _answer(await sandbox.run_async(code, lang=lang))

    return StructuredTool.from_function(
        func=run,
        coroutine=run_async,
        name=NAME,
        description=DESCRIPTION,
        args_schema=PARAMETERS,
        response_format="content_and_artifact",
        # A ToolException becomes an error ToolMessage for the model.
        handle_tool_error=True,
    )


def _checked(arguments: Any) -> tuple[str, str]:
    try:
        return check_arguments(arguments)
    except ToolInputError as error:
        raise ToolException(str(error)) from None


def _answer(result: RunResult) -> tuple[str, list[Figure]]:
    return describe(result), result.figures
