"""The CLI's commands about this host rather than one task: workspaces, environments, workers,
images, doctor and the MCP server (the task commands are in commands.py, the jobs' in jobs.py)."""

from __future__ import annotations

import argparse
import json
import sys

from bridge.cli.render import one_line, out_json
from bridge.documents import PruneReport, Removal
from bridge.errors import InvalidSpec
from bridge.service import WorkerBridge


def cmd_workspaces_prune(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    report = bridge.prune_workspaces(apply=args.apply, include_unaccepted=args.include_unaccepted)
    return _show_prune(report, args)


def _show_prune(report: PruneReport, args: argparse.Namespace) -> int:
    if args.json:
        out_json(report)
    else:
        print_prune(report["actions"], args.apply)
    return 0


def print_prune(actions: list[Removal], applied: bool) -> None:
    """What a prune removed (or would remove), one line each, and what to do next."""
    verb = "removed" if applied else "would remove"
    for action in actions:
        owner = f" (task {action['task_id']})" if action.get("task_id") else ""
        print(f"{verb} {action['kind']} {action['target']}{owner}: {action['reason']}")
        for failure in action.get("failed") or []:
            print(f"  could not remove: {failure}")
    if not actions:
        print("nothing to prune")
    elif not applied:
        print(f"{len(actions)} item(s); run again with --apply to remove them")


def cmd_environments_list(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    found = bridge.list_environments()
    if args.json:
        out_json(found)
        return 0
    if not found:
        print("no environment caches")
    for item in found:
        if item["state"] != "ready":
            print(f"{item['key'][:16]}  unreadable ({item['folder']})")
            continue
        size = f"{(item['bytes'] or 0) / 2**20:.1f} MiB, {item['files']} files"
        print(f"{item['key'][:16]}  {item['image']}  {size}  last used {item['last_used']}")
        print(f"    {item['source']} for {item['repository']}: {' && '.join(item['setup'] or [])}")
    return 0


def cmd_environments_prune(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    report = bridge.prune_environments(apply=args.apply, everything=args.all)
    return _show_prune(report, args)


def cmd_workers_list(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    workers = [w.document() for w in bridge.list_workers()]
    if args.json:
        out_json({"workers": workers})
        return 0
    for w in workers:
        state = "healthy" if w["healthy"] else ("installed" if w["installed"] else "not built")
        version = f" (CLI {w['cli_version']})" if w.get("cli_version") else ""
        print(f"{w['name']:<14} {state:<10} {w['image']}{version}")
        if w.get("reason"):
            print(f"{'':<14} {one_line(w['reason'])}")
        circuit = w["circuit"]
        if circuit["state"] in ("open", "half_open"):
            kinds = ", ".join(f"{n} {kind}" for kind, n in circuit["kinds"].items())
            when = (
                f"refusing new tasks until {circuit['retry_at']}"
                if circuit["state"] == "open"
                else f"half-open, tried again by task {circuit['probe_task'] or '(the next one)'}"
            )
            print(f"{'':<14} circuit {when} after {circuit['failures']} failure(s) ({kinds})")
    return 0


def cmd_workers_reset(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    done = bridge.reset_worker(args.name).document()
    if args.json:
        out_json(done)
        return 0
    before = done["before"]
    if before["state"] in ("closed", "disabled"):
        print(f"worker '{args.name}': its circuit was already closed")
    else:
        print(
            f"worker '{args.name}': circuit closed (it was {before['state'].replace('_', '-')} "
            f"after {before['failures']} failure(s)); new tasks for it are taken again"
        )
    return 0


def cmd_workers_link(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    try:
        command = json.loads(args.command_json)
    except ValueError as exc:
        raise InvalidSpec(f"--command-json is not valid JSON ({exc}).") from exc
    if not isinstance(command, list):
        raise InvalidSpec("--command-json must be a JSON list of strings.")
    bridge.link_worker(args.name, command, args.image, tuple(args.route))
    print(f"linked worker '{args.name}'")
    return 0


def cmd_images_build(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    tags = bridge.build_images(
        args.names,
        everything=args.all,
        base_image=args.base_image,
        on_line=lambda line: print(line, flush=True),
    )
    print("built: " + ", ".join(tags))
    if not args.smoke:
        return 0
    from bridge.smoke import run_smoke, smoke_workers  # built on the facade, above it

    built = [tag.split("/", 1)[1].split(":", 1)[0] for tag in tags]
    results = run_smoke(bridge.config, smoke_workers(built), on_line=print)
    failed = [r.worker for r in results if not r.ok]
    if failed:
        print(f"worker-bridge: the smoke task failed for {', '.join(failed)}.", file=sys.stderr)
        return 1
    return 0


def cmd_doctor(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    checks = bridge.doctor()
    failed = [c for c in checks if c["severity"] == "error"]
    if args.json:
        out_json({"ok": not failed, "checks": checks})
    else:
        for c in checks:
            print(f"[{c['severity']:<7}] {c['check']:<13} {c['detail']}")
    return 1 if failed else 0


def cmd_mcp(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    from bridge.mcp.server import run as run_mcp_server

    return run_mcp_server(args, bridge)
