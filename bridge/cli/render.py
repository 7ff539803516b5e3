"""How the CLI prints task results and events for people (--json prints the documents)."""

from __future__ import annotations

import json
import sys
from typing import Any


def out_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def print_result(result: dict[str, Any]) -> None:
    print(f"task {result['task_id']}: {result['status']}")
    print(f"  worker: {result['worker']}   objective: {result['objective'].strip()[:200]}")
    if result.get("summary"):
        print(f"  summary: {result['summary'].strip()[:500]}")
    if result.get("error"):
        print(f"  error ({result['error']['kind']}): {result['error']['message']}")
    if result["changed_files"]:
        print("  changed files:")
        for entry in result["changed_files"]:
            extra = f" (from {entry['from']})" if entry.get("from") else ""
            print(f"    {entry['change']:<12} {entry['path']}{extra}")
    verification = result.get("verification")
    if verification is not None:
        ok = verification.get("ok")
        label = {True: "ok", False: "FAILED", None: "none (no verify commands)"}[ok]
        print(f"  verification: {label}")
        for cmd in verification.get("commands", []):
            mark = "pass" if cmd["exit_code"] == 0 else f"exit {cmd['exit_code']}"
            print(f"    [{mark}] {cmd['command']} ({cmd['duration_s']} s)")
    for name, path in result.get("artifacts", {}).items():
        print(f"  {name}: {path}")


def print_event(event: dict[str, Any]) -> None:
    data = event["data"]
    if event["kind"] == "worker.progress":
        text = data.get("line", "")
    else:
        text = json.dumps(data, ensure_ascii=False)
    print(f"{event['event_id']:>6} {event['at']} {event['kind']:<22} {text}")
