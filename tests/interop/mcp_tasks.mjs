// MCP tasks (the 2025-11-25 utility) as a host drives them, with the TypeScript MCP SDK's own
// task client (`client.experimental.tasks`). Run by tests/mcp/test_interop.py:
//
//   node tests/interop/mcp_tasks.mjs --command /path/to/worker-bridge-mcp \
//        --home /path/to/state-root --repo /path/to/git/repo [--deadline-s 90]
//
// Lists the tools (the SDK learns which support tasks), then:
// 1. worker_delegate through `callToolStream`: the SDK creates a task, polls `tasks/get` and
//    fetches `tasks/result`; every message it yielded is kept;
// 2. `tasks/get` and `tasks/list` for that task afterwards;
// 3. a second delegate (its worker sleeps a minute) cancelled with `tasks/cancel` once created;
// 4. a compete as a task, then a follow-up of one of its candidates as a task;
// 5. `tasks/get` of an id that does not exist.
// Prints one JSON line on stdout with what it saw; exits 1 on any failure (reason on stderr).

import { parseArgs } from "node:util";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const { values: opts } = parseArgs({
  options: {
    command: { type: "string" },
    home: { type: "string" },
    repo: { type: "string" },
    "deadline-s": { type: "string", default: "90" },
  },
});
for (const name of ["command", "home", "repo"]) {
  if (!opts[name]) {
    console.error(`mcp_tasks.mjs: --${name} is required`);
    process.exit(1);
  }
}
const timeout = Number(opts["deadline-s"]) * 1000;

/** Every message `callToolStream` yields for one call, as plain data. */
async function streamed(client, name, args, onCreated) {
  const seen = [];
  const stream = client.experimental.tasks.callToolStream({ name, arguments: args }, undefined, {
    timeout,
  });
  for await (const message of stream) {
    if (message.type === "taskCreated") {
      seen.push({ type: "taskCreated", task: message.task });
      if (onCreated) await onCreated(message.task);
    } else if (message.type === "taskStatus") {
      seen.push({ type: "taskStatus", status: message.task.status, said: message.task.statusMessage });
    } else if (message.type === "result") {
      seen.push({ type: "result", result: message.result });
    } else {
      seen.push({ type: message.type, error: String(message.error?.message ?? message.error) });
    }
  }
  return seen;
}

async function main() {
  const transport = new StdioClientTransport({
    command: opts.command,
    args: [],
    env: { ...process.env, WORKER_BRIDGE_HOME: opts.home },
    stderr: "inherit",
  });
  const client = new Client({ name: "worker-bridge-tasks", version: "0.1.0" });
  await client.connect(transport);
  try {
    const { tools } = await client.listTools();
    const taskTools = tools.filter((t) => t.execution?.taskSupport).map((t) => t.name).sort();
    const capabilities = client.getServerCapabilities();

    const delegated = await streamed(client, "worker_delegate", {
      objective: "Add tasks.txt",
      repository: opts.repo,
      verify: ["test -f tasks.txt"],
      metadata: { mock: { sleep: 2, write: { "tasks.txt": "through an MCP task\n" } } },
    });
    const taskId = delegated.find((m) => m.type === "taskCreated")?.task?.taskId;
    const got = await client.experimental.tasks.getTask(taskId);
    const listed = await client.experimental.tasks.listTasks();

    let cancelled = null;
    const long = await streamed(
      client,
      "worker_delegate",
      { objective: "Sleep", repository: opts.repo, metadata: { mock: { sleep: 60 } } },
      async (task) => {
        cancelled = await client.experimental.tasks.cancelTask(task.taskId);
      },
    );

    // A compete as a task (its id the job's), then a follow-up of one candidate as a task
    // (its id the candidate's own, not its job's).
    const competed = await streamed(client, "worker_compete", {
      objective: "Write c.txt",
      repository: opts.repo,
      workers: ["mock", "mock"],
      verify: ["test -f c.txt"],
      metadata: {
        candidates: [{ mock: { write: { "c.txt": "one\n" } } }, { mock: { write: { "c.txt": "two\n" } } }],
      },
    });
    const job = competed.find((m) => m.type === "result")?.result?.structuredContent;
    const candidate = job?.tasks?.find((t) => t.role === "candidate")?.task_id;
    const followed = await streamed(client, "worker_follow_up", {
      task_id: candidate,
      message: "once more",
    });

    let unknown = null;
    try {
      await client.experimental.tasks.getTask("feedfacecafe");
    } catch (error) {
      unknown = String(error?.message ?? error);
    }

    console.log(
      JSON.stringify({
        protocol: transport.protocolVersion ?? null,
        capabilities: capabilities?.tasks ?? null,
        task_tools: taskTools,
        delegated,
        got,
        listed: listed.tasks.map((t) => [t.taskId, t.status]),
        long,
        cancelled,
        competed,
        candidate,
        followed,
        unknown,
      }),
    );
  } finally {
    await client.close();
  }
}

main().then(
  () => process.exit(0),
  (error) => {
    console.error(`mcp_tasks.mjs: ${error?.stack ?? error}`);
    process.exit(1);
  },
);
