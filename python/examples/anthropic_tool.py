"""airlock as a tool for Anthropic tool use (the Messages format).

    from anthropic_tool import TOOL, answer_tool_uses

    with Sandbox() as sb:
        while True:
            reply = client.messages.create(model=..., max_tokens=..., messages=messages, tools=[TOOL])
            messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
            if reply.stop_reason != "tool_use":
                break
            messages.append(answer_tool_uses(sb, messages[-1]))

Works on plain dicts in Anthropic's format; the anthropic package is not needed here.
"""

import base64
from typing import Any

from code_tool import DESCRIPTION, NAME, PARAMETERS, ToolInputError, describe, run_code

from airlock import Sandbox

TOOL = {"name": NAME, "description": DESCRIPTION, "input_schema": PARAMETERS}


def answer_tool_uses(sandbox: Sandbox, message: dict[str, Any]) -> dict[str, Any]:
    """The user message that answers an assistant message's ``tool_use``
    blocks: one ``tool_result`` each, with the text and the figures as images;
    ``is_error`` when the code failed or the call was wrong."""
    results: list[dict[str, Any]] = []
    for block in message.get("content") or []:
        if not isinstance(block, dict) or block.get("type") != "tool_use":
            continue
        content: list[dict[str, Any]]
        if block.get("name") != NAME:
            content, failed = [_text(f"there is no tool called {block.get('name')!r}; use {NAME!r}")], True
        else:
            try:
                result = run_code(sandbox, block.get("input") or {})
            except ToolInputError as error:
                content, failed = [_text(str(error))], True
            else:
                content = [_text(describe(result))] + [_image(f.png) for f in result.figures]
                failed = not result.ok
        results.append({"type": "tool_result", "tool_use_id": block["id"], "content": content, "is_error": failed})
    return {"role": "user", "content": results}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _image(png: bytes) -> dict[str, Any]:
    data = base64.b64encode(png).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
