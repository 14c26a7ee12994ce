"""airlock as a tool for OpenAI function calling (the Chat Completions format).

    from openai_tool import TOOL, answer_tool_calls

    with Sandbox() as sb:
        while True:
            reply = client.chat.completions.create(model=..., messages=messages, tools=[TOOL])
            message = reply.choices[0].message.model_dump()
            messages.append(message)
            if not message.get("tool_calls"):
                break
            messages += answer_tool_calls(sb, message)

Works on plain dicts in OpenAI's format; the openai package is not needed here.
"""

import base64
import json
from typing import Any

from code_tool import DESCRIPTION, NAME, PARAMETERS, ToolInputError, describe, run_code

from airlock import Sandbox

TOOL = {"type": "function", "function": {"name": NAME, "description": DESCRIPTION, "parameters": PARAMETERS}}


def answer_tool_calls(sandbox: Sandbox, message: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages that answer an assistant message's tool calls: one ``tool``
    message per call, then, when the code drew figures, one ``user`` message
    with them as images (tool messages carry text only)."""
    answers: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        if function.get("name") != NAME:
            text = f"error: there is no tool called {function.get('name')!r}; use {NAME!r}"
        else:
            try:
                arguments = json.loads(function.get("arguments") or "{}")
                if not isinstance(arguments, dict):
                    raise ToolInputError("the arguments must be a JSON object")
                result = run_code(sandbox, arguments)
            except json.JSONDecodeError as error:
                text = f"error: the arguments are not valid JSON: {error}"
            except ToolInputError as error:
                text = f"error: {error}"
            else:
                text = describe(result)
                for figure in result.figures:
                    data = base64.b64encode(figure.png).decode()
                    images.append({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}})
        answers.append({"role": "tool", "tool_call_id": call["id"], "content": text})
    if images:
        answers.append({"role": "user", "content": [{"type": "text", "text": "The figures from the code:"}, *images]})
    return answers
