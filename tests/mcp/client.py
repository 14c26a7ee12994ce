"""A real MCP client (the official Python SDK) for airlock's tests.

    python3 client.py stdio COMMAND [ARG...] < calls.json
    python3 client.py http URL TOKEN < calls.json

Reads a JSON list of tool calls, [{"name": "run_python", "arguments": {...}}],
connects, lists the tools, makes the calls in order, and prints one JSON
object: {"protocol": ..., "tools": [...], "results": [...]}, where each
result lists its content blocks by type. The test asserts on it.

A call with "abandon_after": SECONDS is given up after that long, which the
SDK says to the server with `notifications/cancelled`; its result is
{"abandoned": true, "seconds": ...}. An entry {"read": URI} reads a resource.
Each result has "seconds", how long it took.
"""

import asyncio
import json
import sys
import time

import anyio

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def block(content):
    kind = content.type
    if kind == "text":
        return {"type": "text", "text": content.text}
    if kind == "image":
        return {"type": "image", "mimeType": content.mime_type, "data": content.data}
    if kind == "resource_link":
        return {"type": kind, "uri": str(content.uri), "name": content.name, "size": content.size}
    if kind == "resource":
        resource = content.resource
        return {
            "type": "resource",
            "uri": str(resource.uri),
            "mimeType": resource.mime_type,
            "blob": getattr(resource, "blob", None),
            "text": getattr(resource, "text", None),
        }
    return {"type": kind}


async def session_run(read, write, calls):
    async with ClientSession(read, write) as session:
        init = await session.initialize()
        tools = await session.list_tools()
        results = []
        for call in calls:
            started = time.monotonic()
            if "read" in call:
                try:
                    read = await session.read_resource(call["read"])
                    contents = [
                        {"uri": str(c.uri), "blob": getattr(c, "blob", None), "text": getattr(c, "text", None)}
                        for c in read.contents
                    ]
                    results.append({"contents": contents})
                except Exception as error:  # the test asserts on the refusal
                    results.append({"error": str(error)})
                continue
            if "abandon_after" in call:
                with anyio.move_on_after(call["abandon_after"]):
                    await session.call_tool(call["name"], call.get("arguments", {}))
                results.append({"abandoned": True, "seconds": time.monotonic() - started})
                continue
            result = await session.call_tool(call["name"], call.get("arguments", {}))
            results.append(
                {
                    "isError": bool(result.is_error),
                    "content": [block(c) for c in result.content],
                    "structuredContent": result.structured_content,
                    "seconds": time.monotonic() - started,
                    "bytes": len(result.model_dump_json()),
                }
            )
        return {
            "protocol": str(init.protocol_version),
            "server": init.server_info.name,
            "tools": [
                {
                    "name": t.name,
                    "description": t.description,
                    "inputSchema": t.input_schema,
                    "annotations": t.annotations.model_dump(by_alias=True, exclude_none=True) if t.annotations else None,
                }
                for t in tools.tools
            ],
            "results": results,
        }


async def main():
    mode = sys.argv[1]
    calls = json.load(sys.stdin)
    if mode == "stdio":
        params = StdioServerParameters(command=sys.argv[2], args=sys.argv[3:], env=None)
        async with stdio_client(params) as streams:
            out = await session_run(streams[0], streams[1], calls)
    elif mode == "http":
        url, token = sys.argv[2], sys.argv[3]
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http:
            async with streamable_http_client(url, http_client=http) as streams:
                out = await session_run(streams[0], streams[1], calls)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    json.dump(out, sys.stdout)


asyncio.run(main())
