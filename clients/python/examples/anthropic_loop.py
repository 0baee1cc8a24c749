"""An agent loop in the Anthropic Messages tool-use format, its tools run by toolpool.

The model's turns are scripted (SCRIPT below) unless ANTHROPIC_API_KEY is set and the ``anthropic``
package is installed: then Claude (TOOLPOOL_EXAMPLE_MODEL, default claude-sonnet-4-5) plays them. Every
tool_use block runs as a toolpool call; the loop stops when a call waits for a person's approval and
prints what to do. Run against ``make run``:

    python3 examples/anthropic_loop.py            # TOOLPOOL_URL, TOOLPOOL_TOKEN as for the client
"""

import json
import os
import sys

from toolpool import Client, anthropic_tool_result, run_anthropic_tool_use

TASK = "Look around the workspace, then create a build directory."

# The scripted model: each turn is what the Messages API would answer (stop_reason and content blocks).
SCRIPT = [
    {"stop_reason": "tool_use", "content": [
        {"type": "text", "text": "Let me look at the workspace first."},
        {"type": "tool_use", "id": "toolu_01", "name": "run_shell", "input": {"command": "pwd; ls -la"}},
    ]},
    {"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "toolu_02", "name": "run_shell", "input": {"command": "uname -s; id -un"}},
    ]},
    {"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "toolu_03", "name": "run_shell", "input": {"command": "mkdir -p build"}},
    ]},
    {"stop_reason": "end_turn", "content": [{"type": "text", "text": "The build directory is ready."}]},
]


def scripted_model():
    turns = iter(SCRIPT)

    def create(messages, tools):
        return next(turns)

    return create


def claude_model():
    import anthropic  # only with ANTHROPIC_API_KEY set

    api = anthropic.Anthropic()
    model = os.environ.get("TOOLPOOL_EXAMPLE_MODEL", "claude-sonnet-4-5")

    def create(messages, tools):
        msg = api.messages.create(model=model, max_tokens=1024, tools=tools, messages=messages)
        return {"stop_reason": msg.stop_reason, "content": [b.model_dump() for b in msg.content]}

    return create


def main():
    tp = Client(workspace=os.environ.get("TOOLPOOL_EXAMPLE_WORKSPACE", "agent-demo"))
    create = claude_model() if os.environ.get("ANTHROPIC_API_KEY") else scripted_model()
    tools = tp.anthropic_tools()
    messages = [{"role": "user", "content": TASK}]
    ran = []
    while True:
        turn = create(messages, tools)
        messages.append({"role": "assistant", "content": turn["content"]})
        if turn["stop_reason"] != "tool_use":
            print(json.dumps({"done": True, "ran": ran}))
            return 0
        results = []
        for block in turn["content"]:
            if block["type"] != "tool_use":
                continue
            res = run_anthropic_tool_use(tp, block)
            if res.pending_approval:
                print(f"call {res.id} waits for approval ({res.decision.rule}: {res.decision.reason});"
                      f" approve it with: toolpool approvals approve {res.id}", file=sys.stderr)
                print(json.dumps({"done": False, "ran": ran, "pending": res.id}))
                return 0
            ran.append({"tool": block["name"], "status": res.status, "output": res.output})
            results.append(anthropic_tool_result(res, block["id"]))
        messages.append({"role": "user", "content": results})


if __name__ == "__main__":
    sys.exit(main())
