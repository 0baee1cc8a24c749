"""Tool calls in the shapes of model APIs: run an Anthropic Messages ``tool_use`` block or an OpenAI
``tool_call`` through toolpool, and turn the Result into the message the model reads next."""

from __future__ import annotations

import json
from typing import Any, Dict, Optional

from .client import Client
from .models import Result


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key)


def _content(result: Result) -> str:
    if result.pending_approval:
        d = result.decision
        why = f" ({d.rule}: {d.reason})" if d is not None and d.rule else ""
        return f"call {result.id} waits for a person's approval{why}; it has not run yet"
    return result.output


def run_anthropic_tool_use(client: Client, block: Any, *, workspace: Optional[str] = None, **kw: Any) -> Result:
    """Run an Anthropic ``tool_use`` content block ({"type": "tool_use", "id", "name", "input"}, a dict or
    the SDK's object) as a toolpool call, and return its Result."""
    return client.call(_get(block, "name"), dict(_get(block, "input") or {}), workspace=workspace, **kw)


def anthropic_tool_result(result: Result, tool_use_id: str) -> Dict[str, Any]:
    """The ``tool_result`` content block for a Result: its output, is_error unless it ran ok."""
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": _content(result),
            "is_error": not result.ok and not result.pending_approval}


def run_openai_tool_call(client: Client, tool_call: Any, *, workspace: Optional[str] = None, **kw: Any) -> Result:
    """Run an OpenAI Chat Completions ``tool_call`` ({"id", "type": "function", "function": {"name",
    "arguments": JSON text}}, a dict or the SDK's object) as a toolpool call, and return its Result."""
    fn = _get(tool_call, "function")
    raw = _get(fn, "arguments") or "{}"
    try:
        args = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except ValueError as e:
        raise ValueError(f"tool call {_get(tool_call, 'id')}: arguments are not JSON: {e}") from e
    return client.call(_get(fn, "name"), args, workspace=workspace, **kw)


def openai_tool_message(result: Result, tool_call_id: str) -> Dict[str, Any]:
    """The ``tool`` role message for a Result, as Chat Completions takes it."""
    return {"role": "tool", "tool_call_id": tool_call_id, "content": _content(result)}
