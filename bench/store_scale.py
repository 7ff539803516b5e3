"""The store at scale: 10,000 tasks and 1,000,000 events, inserted in bulk into the store's own
schema (migrations applied by Store), then the latency of the reads users make, in a process of
its own (`python -m bench.store_scale ROOT TASKS EVENTS SAMPLES` prints the figures)."""

from __future__ import annotations

import gc
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from bench.common import median, percentile


def _fill(store, tasks: int, events: int) -> tuple[list[str], str]:
    conn = store.db.conn
    spec = json.dumps(
        {
            "objective": "bench",
            "worker": "mock",
            "workspace": {"repository": "/r", "base_ref": "HEAD"},
        }
    )
    result = json.dumps(
        {
            "ok": True,
            "image": "worker-bridge/verify",
            "commands": [
                {
                    "command": "pytest -q",
                    "exit_code": 0,
                    "duration_s": 1.0,
                    "stdout_tail": "x" * 400,
                    "stderr_tail": "",
                }
            ],
        }
    )
    ids = [f"t{i:08d}" for i in range(tasks)]
    rows = [
        (
            tid,
            "succeeded",
            "mock",
            f"objective {i}",
            "/r",
            "HEAD",
            "0" * 40,
            50,
            spec,
            "{}",
            f"2026-01-01T00:{i // 600 % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z",
            result,
            json.dumps([{"path": "a.py", "change": "modified"}]),
            json.dumps({"worker_s": 1.0}),
        )
        for i, tid in enumerate(ids)
    ]
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO tasks (task_id, status, worker, objective, repository, base_ref,"
        " base_commit, priority, spec, config, created_at, verification, changed_files, timings)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    big = ids[len(ids) // 2]  # one long-running task holds a fifth of the events
    data = json.dumps({"line": "worker output line " + "y" * 60})
    batch = []
    for n in range(events):
        tid = big if n % 5 == 0 else ids[n % len(ids)]
        batch.append((tid, "worker.progress", "2026-01-01T00:00:00.000Z", data))
        if len(batch) == 50_000:
            conn.executemany(
                "INSERT INTO events (task_id, kind, at, data) VALUES (?, ?, ?, ?)", batch
            )
            batch.clear()
    if batch:
        conn.executemany("INSERT INTO events (task_id, kind, at, data) VALUES (?, ?, ?, ?)", batch)
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    return ids, big


def bench_store(root: Path, tasks: int, events: int, samples: int) -> dict:
    """Measured in a process of its own (a fresh interpreter, as a reader of the store is), so
    the figure does not grow with the heap the other benchmarks left in this one."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.store_scale",
            str(root),
            str(tasks),
            str(events),
            str(samples),
        ],
        check=True,
        stdout=subprocess.PIPE,  # its stderr is the bench's: a failure shows its traceback
        text=True,
        cwd=Path(__file__).resolve().parent.parent,  # where `bench` imports from
    ).stdout
    return json.loads(out)


def _measure(root: Path, tasks: int, events: int, samples: int) -> dict:
    """The reads in blocks, each twice: as a library caller's loop reads (the heap as it is)
    and as the long-lived servers read (start-up's heap frozen, `freeze_start_up_heap`, which
    the MCP server and `worker-bridge ui` call before they serve). The figure is the servers'."""
    from bridge import WorkerBridge
    from bridge.host.heap import freeze_start_up_heap

    home = root / "store-home"
    bridge = WorkerBridge(home=home)
    t0 = time.perf_counter()
    ids, big = _fill(bridge.store, tasks, events)
    fill_s = time.perf_counter() - t0
    rng = random.Random(7)
    big_events = bridge.store.query(
        "SELECT min(event_id) AS lo, max(event_id) AS hi FROM events WHERE task_id = ?", (big,)
    )[0]
    middle = (big_events["lo"] + big_events["hi"]) // 2
    reads = {"server": ([], [], []), "library": ([], [], [])}
    blocks = 5
    for _ in range(blocks):
        for regime in ("library", "server"):
            if regime == "server":
                freeze_start_up_heap()
            show, listing, logs = reads[regime]
            for _ in range(samples // blocks):
                tid = rng.choice(ids)
                t = time.perf_counter()
                bridge.get_task(tid)
                show.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                bridge.list_tasks(limit=50)
                listing.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                page = bridge.task_logs(big, after=middle, limit=200)
                logs.append((time.perf_counter() - t) * 1000)
                assert len(page.events) == 200
            gc.unfreeze()
    full = []
    for _ in range(3):
        t = time.perf_counter()
        bridge.list_tasks()
        full.append((time.perf_counter() - t) * 1000)
    bridge.close()

    def stats(values: list[float]) -> dict:
        return {"p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99)}

    def figures(show: list[float], listing: list[float], logs: list[float]) -> dict:
        return {
            "show": stats(show),
            "list_50": stats(listing),
            "logs_page_200": stats(logs),
            "read_p99_ms": max(percentile(show, 99), percentile(listing, 99), percentile(logs, 99)),
        }

    show, listing, logs = reads["server"]
    return {
        "tasks": tasks,
        "events": events,
        "fill_s": fill_s,
        **figures(show, listing, logs),
        "library_loop": figures(*reads["library"]),
        "list_all_median_ms": median(full),
        "samples": {"show_ms": show, "list_50_ms": listing, "logs_page_ms": logs},
    }


if __name__ == "__main__":
    where, *counts = sys.argv[1:]
    tasks, events, samples = map(int, counts)
    print(json.dumps(_measure(Path(where), tasks, events, samples)))
