"""`make demo`: one delegated task end to end with the `mock` worker on a throwaway repository.

Creates a tiny repository with a test, asks the mock worker (in its container) to add a
function and its test, re-runs `pytest` in a clean verification container, and prints the
outcome and the diff. Everything lives in a temporary folder, removed at the end (--keep keeps).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CALC = "def add(a, b):\n    return a + b\n"
CALC_NEW = CALC + "\n\ndef multiply(a, b):\n    return a * b\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
TEST_NEW = "from calc import multiply\n\n\ndef test_multiply():\n    assert multiply(4, 5) == 20\n"


def sh(*args: str, cwd: Path) -> None:
    subprocess.run(args, cwd=cwd, check=True, capture_output=True)


def main() -> int:
    keep = "--keep" in sys.argv
    root = Path(tempfile.mkdtemp(prefix="worker-bridge-demo-"))
    repo, home = root / "repo", root / "home"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    (repo / "test_calc.py").write_text(TEST)
    sh("git", "init", "-q", "-b", "main", cwd=repo)
    sh("git", "add", "-A", cwd=repo)
    sh(
        "git",
        "-c",
        "user.name=demo",
        "-c",
        "user.email=demo@example.com",
        "commit",
        "-qm",
        "calculator",
        cwd=repo,
    )

    mock = {
        "write": {"calc.py": CALC_NEW, "test_multiply.py": TEST_NEW},
        "summary": "Added multiply() and a test for it.",
    }
    cmd = [str(Path(sys.executable).parent / "worker-bridge"), "tasks", "run", "--json"]
    cmd += ["--repo", str(repo), "--worker", "mock"]
    cmd += ["--objective", "Add a multiply(a, b) function with a test"]
    cmd += ["--verify", "python3 -m pytest -q -p no:cacheprovider"]
    cmd += ["--metadata-json", json.dumps({"mock": mock})]
    print(
        f"$ worker-bridge tasks run --repo {repo} --worker mock --verify 'python3 -m pytest -q' ..."
    )
    env = {**os.environ, "WORKER_BRIDGE_HOME": str(home)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.stderr:
        sys.stderr.write(proc.stderr)
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        print(proc.stdout)
        return proc.returncode or 1
    verification = result.get("verification") or {}
    print(f"\ntask:          {result['task_id']}")
    print(f"status:        {result['status']}")
    print(f"summary:       {result.get('summary')}")
    print(f"verification.ok: {str(verification.get('ok')).lower()}")
    for command in verification.get("commands", []):
        print(
            f"  $ {command['command']}  -> exit {command['exit_code']} ({command['duration_s']} s)"
        )
        tail = command["stdout_tail"].strip().splitlines()
        if tail:
            print(f"    {tail[-1]}")
    print(
        "changed files: "
        + ", ".join(f"{c['path']} ({c['change']})" for c in result["changed_files"])
    )
    print(f"timings:       {result['timings']}")
    diff = result.get("artifacts", {}).get("diff")
    if diff:
        print(f"\n--- diff ({diff}) ---")
        print(Path(diff).read_text(), end="")
    if keep:
        print(f"\nkept: repository {repo}, state root {home}")
    else:
        from bridge.workspace.fs import remove_tree
        from bridge.workspace.overlay import unmount_under

        unmount_under(root)  # a layered worktree stays mounted until accepted or pruned
        remove_tree(root)
    return 0 if result["status"] == "succeeded" and verification.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
