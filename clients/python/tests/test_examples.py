"""The examples run as a user runs them (a subprocess, the client from the environment), with the
model's turns scripted, and stop at the approval their script reaches."""

import json
import os
import subprocess
import sys
import uuid

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def run_example(name, url, token):
    env = dict(os.environ, TOOLPOOL_URL=url, TOOLPOOL_TOKEN=token,
               TOOLPOOL_EXAMPLE_WORKSPACE="ex-" + uuid.uuid4().hex[:8])
    for key in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        env.pop(key, None)  # scripted turns: no API key, no outside service
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


@pytest.mark.parametrize("example", ["anthropic_loop.py", "openai_agents.py"])
def test_example_runs_tools_and_stops_at_the_approval(example, url, tp, approver):
    out, stderr = run_example(example, url, tp.token)
    assert out["done"] is False and out["ran"], out
    assert all(r["status"] == "ok" for r in out["ran"]), out
    pending = out["pending"]
    assert f"toolpool approvals approve {pending}" in stderr
    assert tp.get(pending).pending_approval
    approver.approve(pending)
    assert tp.wait(pending, timeout=60).ok


def test_anthropic_loop_ran_the_scripted_tools(url, tp):
    out, _ = run_example("anthropic_loop.py", url, tp.token)
    assert [r["tool"] for r in out["ran"]] == ["run_shell", "run_shell"]
    assert out["ran"][0]["output"].startswith("/workspace\n")
    assert "sandbox" in out["ran"][1]["output"]


def test_openai_agents_read_the_note(url, tp):
    out, _ = run_example("openai_agents.py", url, tp.token)
    assert out["ran"][0]["tool"] == "read_file" and "build into out/" in out["ran"][0]["output"]
