"""toolpool's tools for the OpenAI Agents SDK: each tool of GET /v1/tools?format=openai as a FunctionTool
whose on_invoke_tool runs a toolpool call.

With the SDK installed (pip install openai-agents) and OPENAI_API_KEY set, an Agent runs them with the
Runner. Otherwise the model's turns are scripted (SCRIPT below) and played the way the SDK's Runner plays
a model's function calls: on_invoke_tool(context, arguments JSON text) for each. Either way the run stops
at the first call that waits for a person's approval. Run against ``make run``:

    python3 examples/openai_agents.py
"""

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, List

from toolpool import AsyncClient, Conflict, Result

try:
    from agents import Agent, FunctionTool, Runner  # the OpenAI Agents SDK
except ImportError:  # not installed: the same shape, for the scripted run
    Agent = Runner = None

    @dataclass
    class FunctionTool:  # type: ignore[no-redef]
        name: str
        description: str
        params_json_schema: Dict[str, Any]
        on_invoke_tool: Callable[[Any, str], Awaitable[str]]
        strict_json_schema: bool = True


SCRIPT = [
    ("read_file", {"path": "notes.txt"}),
    ("run_shell", {"command": "ls"}),
    ("run_shell", {"command": "mkdir -p out"}),
    ("run_shell", {"command": "echo never reached"}),
]


class ApprovalNeeded(Exception):
    def __init__(self, result: Result):
        super().__init__(f"call {result.id} waits for approval")
        self.result = result


def toolpool_tools(tp: AsyncClient, specs: List[Dict[str, Any]], ran: List[Dict[str, Any]]) -> List[FunctionTool]:
    """One FunctionTool per toolpool tool (OpenAI's function shape); a call that waits for a person
    raises ApprovalNeeded, which ends the run."""

    def make(name: str):
        async def on_invoke_tool(_ctx: Any, arguments: str) -> str:
            res = await tp.call(name, json.loads(arguments or "{}"))
            if res.pending_approval:
                raise ApprovalNeeded(res)
            ran.append({"tool": name, "status": res.status, "output": res.output})
            return res.output

        return on_invoke_tool

    return [FunctionTool(name=s["function"]["name"], description=s["function"]["description"],
                         params_json_schema=s["function"]["parameters"], on_invoke_tool=make(s["function"]["name"]),
                         strict_json_schema=False) for s in specs]


async def main() -> int:
    tp = AsyncClient(workspace=os.environ.get("TOOLPOOL_EXAMPLE_WORKSPACE", "agents-demo"))
    try:
        await tp.create_workspace(tp.sync.workspace)
    except Conflict:
        pass  # it exists: keep it
    await tp.upload_file(tp.sync.workspace, "notes.txt", "remember: build into out/\n")
    ran: List[Dict[str, Any]] = []
    tools = toolpool_tools(tp, await tp.openai_tools(), ran)
    try:
        if Runner is not None and os.environ.get("OPENAI_API_KEY"):
            agent = Agent(name="builder", instructions="Read notes.txt and do what it says.", tools=tools)
            out = await Runner.run(agent, "Prepare the build.")
            print(json.dumps({"done": True, "ran": ran, "final": str(out.final_output)}))
            return 0
        by_name = {t.name: t for t in tools}
        for name, args in SCRIPT:
            await by_name[name].on_invoke_tool(None, json.dumps(args))
        print(json.dumps({"done": True, "ran": ran}))
    except ApprovalNeeded as e:
        r = e.result
        print(f"call {r.id} waits for approval ({r.decision.rule}: {r.decision.reason}); approve it with:"
              f" toolpool approvals approve {r.id}", file=sys.stderr)
        print(json.dumps({"done": False, "ran": ran, "pending": r.id}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
