"""The MCP tools' input schemas as agent SDKs read them.

    python strict_schemas.py MCP_URL TOKEN

Lists the tools of a running `airlock serve` with the official MCP SDK, and
for each input schema checks that it is a valid JSON Schema (2020-12), that
the strict-schema transformation agent SDKs apply (the OpenAI Agents SDK's
strict mode: every object closed, every property required) leaves it valid,
and that the call a model makes under that transformation, every limit set
to null because it has none of its own, both fits the original schema and
runs. Exits non-zero, saying why, on any problem.
"""

import asyncio
import copy
import json
import sys

import jsonschema
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def strict(schema):
    """What a strict mode makes of a schema: objects closed, every property
    required, `None` defaults dropped; an open object is refused, as the
    OpenAI Agents SDK refuses it."""
    schema = copy.deepcopy(schema)

    def walk(node, path):
        if not isinstance(node, dict):
            return
        if node.get("type") == "object" or "properties" in node:
            if node.get("additionalProperties", False) is not False:
                raise ValueError(f"{path}: an open object (additionalProperties) is refused in strict mode")
            node["additionalProperties"] = False
            node["required"] = list(node.get("properties", {}))
        if "default" in node and node["default"] is None:
            del node["default"]
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{name}")
        for key in ("items", "not"):
            walk(node.get(key), f"{path}.{key}")
        for key in ("anyOf", "oneOf", "allOf"):
            for index, sub in enumerate(node.get(key, [])):
                walk(sub, f"{path}.{key}[{index}]")

    walk(schema, "$")
    return schema


def problems_of(tool):
    schema = tool.input_schema
    jsonschema.Draft202012Validator.check_schema(schema)
    strict_schema = strict(schema)
    jsonschema.Draft202012Validator.check_schema(strict_schema)
    # The model's call under strict mode: code, and null for every option.
    call = {name: None for name in strict_schema["properties"]}
    call["code"] = "6 * 7" if tool.name == "run_python" else "echo 42"
    for name, validated in (("strict", strict_schema), ("original", schema)):
        errors = [e.message for e in jsonschema.Draft202012Validator(validated).iter_errors(call)]
        if errors:
            yield f"{tool.name}: a strict-mode call does not fit the {name} schema: {errors}"
    # A limit past the schema's maximum is refused by the schema; the server must refuse it too.
    over = dict(call, timeout_s=schema["properties"]["timeout_s"]["maximum"] + 1)
    if jsonschema.Draft202012Validator(schema).is_valid(over):
        yield f"{tool.name}: the schema states no maximum for timeout_s"
    return call, over


async def main(url, token):
    failures = []
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, streamable_http_client(url, http_client=http) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            tools = (await session.list_tools()).tools
            if sorted(t.name for t in tools) != ["run_python", "run_shell"]:
                failures.append(f"unexpected tools: {[t.name for t in tools]}")
            for tool in tools:
                generator = problems_of(tool)
                try:
                    while True:
                        failures.append(next(generator))
                except StopIteration as done:
                    call, over = done.value
                result = await session.call_tool(tool.name, call)
                if result.is_error or "42" not in json.dumps(result.structured_content):
                    failures.append(f"{tool.name}: the strict-mode call did not run: {result.content}")
                refused = await session.call_tool(tool.name, over)
                if not refused.is_error:
                    failures.append(f"{tool.name}: a limit past the schema's maximum was run")
    for failure in failures:
        print(f"strict_schemas: {failure}", file=sys.stderr)
    if failures:
        raise SystemExit(1)
    print(f"strict_schemas: {len(tools)} tool schemas valid, strict-mode calls fit and run")


asyncio.run(main(sys.argv[1], sys.argv[2]))
