"""The tool examples, each driven by a fake model turn in its vendor's format:
real sandboxes, no network, no vendor package (LangChain's core aside)."""

import asyncio
import base64
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))

import anthropic_tool
import code_tool
import openai_tool

PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nprint('plotted')\nsum([1, 4, 9])"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_the_tool_schemas_are_what_the_vendors_expect():
    assert openai_tool.TOOL["type"] == "function"
    assert openai_tool.TOOL["function"]["name"] == "run_code"
    assert openai_tool.TOOL["function"]["parameters"]["required"] == ["code"]
    assert set(anthropic_tool.TOOL) == {"name", "description", "input_schema"}
    json.dumps([openai_tool.TOOL, anthropic_tool.TOOL])  # sent as JSON


def test_openai_tool_calls_get_answers_and_figures(sandbox):
    # The assistant message of a Chat Completions reply, as model_dump() gives it.
    turn = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_plot",
                "type": "function",
                "function": {"name": "run_code", "arguments": json.dumps({"code": PLOT})},
            },
            {"id": "call_fail", "type": "function", "function": {"name": "run_code", "arguments": '{"code": "1/0"}'}},
            {"id": "call_json", "type": "function", "function": {"name": "run_code", "arguments": '{"code": '}},
            {"id": "call_name", "type": "function", "function": {"name": "rm_rf", "arguments": "{}"}},
            {
                "id": "call_sh",
                "type": "function",
                "function": {"name": "run_code", "arguments": '{"code": "echo $((6*7))", "lang": "sh"}'},
            },
        ],
    }
    answers = openai_tool.answer_tool_calls(sandbox, turn)
    tool_messages = [a for a in answers if a["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_plot", "call_fail", "call_json", "call_name", "call_sh"]
    plot, fail, bad_json, bad_name, shell = (m["content"] for m in tool_messages)
    assert plot.startswith("status: ok (exit code 0)")
    assert "stdout:\nplotted" in plot and "value: 14" in plot and "figures: 1" in plot
    assert fail.startswith("status: failed (exit code 1)") and "ZeroDivisionError: division by zero" in fail
    assert bad_json.startswith("error: the arguments are not valid JSON")
    assert bad_name == "error: there is no tool called 'rm_rf'; use 'run_code'"
    assert "stdout:\n42" in shell
    (images,) = [a for a in answers if a["role"] == "user"]
    (image,) = [part for part in images["content"] if part["type"] == "image_url"]
    url = image["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]).startswith(PNG_MAGIC)


def test_anthropic_tool_uses_get_results_with_images(sandbox):
    # The assistant message of a Messages reply whose stop_reason is tool_use.
    turn = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me plot that."},
            {"type": "tool_use", "id": "toolu_plot", "name": "run_code", "input": {"code": PLOT}},
            {"type": "tool_use", "id": "toolu_fail", "name": "run_code", "input": {"code": "import nosuchmodule"}},
            {"type": "tool_use", "id": "toolu_args", "name": "run_code", "input": {"source": "1"}},
        ],
    }
    answer = anthropic_tool.answer_tool_uses(sandbox, turn)
    assert answer["role"] == "user"
    plot, fail, bad_args = answer["content"]
    assert [r["tool_use_id"] for r in answer["content"]] == ["toolu_plot", "toolu_fail", "toolu_args"]
    assert all(r["type"] == "tool_result" for r in answer["content"])
    assert plot["is_error"] is False
    text, image = plot["content"]
    assert "value: 14" in text["text"]
    assert image["source"]["media_type"] == "image/png"
    assert base64.b64decode(image["source"]["data"]).startswith(PNG_MAGIC)
    assert fail["is_error"] is True and "ModuleNotFoundError" in fail["content"][0]["text"]
    assert bad_args["is_error"] is True
    assert bad_args["content"][0]["text"] == "unknown arguments: source; pass only 'code' and 'lang'"


def test_the_model_sees_limits_and_truncation():
    from airlock import Sandbox

    with Sandbox(timeout_s=1) as sb:
        text = code_tool.describe(code_tool.run_code(sb, {"code": "while True: pass"}))
    assert text.startswith("status: timeout")
    assert "stopped by the wall_time limit" in text


def test_langchain_tool_answers_content_and_artifact(sandbox):
    pytest.importorskip("langchain_core", reason="the LangChain example needs langchain-core")
    import langchain_tool
    from langchain_core.messages import AIMessage, ToolMessage

    from airlock import Figure

    tool = langchain_tool.make_tool(sandbox)
    ai = AIMessage(
        content="",
        tool_calls=[
            {"name": "run_code", "args": {"code": PLOT}, "id": "call_1", "type": "tool_call"},
            {"name": "run_code", "args": {"code": "1", "lang": "ruby"}, "id": "call_2", "type": "tool_call"},
        ],
    )
    plotted, refused = (tool.invoke(call) for call in ai.tool_calls)
    assert isinstance(plotted, ToolMessage) and plotted.tool_call_id == "call_1"
    assert "value: 14" in plotted.content
    (figure,) = plotted.artifact
    assert isinstance(figure, Figure) and figure.png.startswith(PNG_MAGIC)
    assert refused.status == "error" and "lang='ruby'" in refused.content

    async def call_async():
        return await tool.ainvoke({"name": "run_code", "args": {"code": "6 * 7"}, "id": "call_3", "type": "tool_call"})

    message = asyncio.run(call_async())
    assert "value: 42" in message.content and message.artifact == []
