// Interoperability check: drive worker-bridge-mcp with the TypeScript MCP SDK, a client written
// by nobody on this project. Run by tests/mcp/test_interop.py:
//
//   node tests/interop/mcp_client.mjs --command /path/to/worker-bridge-mcp \
//        --home /path/to/state-root --repo /path/to/git/repo [--deadline-s 60]
//
// Starts the server over stdio, lists its tools, delegates a mock task (wait=false), polls
// worker_status until the task is terminal, and prints one JSON line on stdout:
//   {"tools": [...], "task_id": "...", "status": "...", "changed_files": [...], "error": ...}
// Exits 0 when that line was printed, 1 on any failure (with the reason on stderr).

import { parseArgs } from "node:util";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const TERMINAL = new Set(["succeeded", "failed", "cancelled", "timed_out", "accepted", "rejected"]);

const { values: opts } = parseArgs({
  options: {
    command: { type: "string", default: process.env.WORKER_BRIDGE_MCP_COMMAND },
    home: { type: "string", default: process.env.WORKER_BRIDGE_HOME },
    repo: { type: "string", default: process.env.WORKER_BRIDGE_INTEROP_REPO },
    "deadline-s": { type: "string", default: "60" },
  },
});

for (const name of ["command", "home", "repo"]) {
  if (!opts[name]) {
    console.error(`mcp_client.mjs: --${name} is required`);
    process.exit(1);
  }
}
const deadline = Date.now() + Number(opts["deadline-s"]) * 1000;

/** The structured result of a tool call that must succeed. */
async function call(client, name, args) {
  const result = await client.callTool({ name, arguments: args });
  const text = result.content?.[0]?.text ?? "";
  if (result.isError) {
    throw new Error(`${name} failed: ${text}`);
  }
  return result.structuredContent ?? JSON.parse(text);
}

async function main() {
  const transport = new StdioClientTransport({
    command: opts.command,
    args: [],
    env: { ...process.env, WORKER_BRIDGE_HOME: opts.home },
    stderr: "inherit",
  });
  const client = new Client({ name: "worker-bridge-interop", version: "0.1.0" });
  await client.connect(transport);
  try {
    const { tools } = await client.listTools();
    const names = tools.map((tool) => tool.name).sort();
    console.error(`tools: ${names.join(", ")}`);

    const queued = await call(client, "worker_delegate", {
      objective: "Add interop.txt",
      repository: opts.repo,
      wait: false,
      verify: ["test -f interop.txt"],
      metadata: { mock: { write: { "interop.txt": "written via the TypeScript SDK\n" } } },
    });
    if (queued.status !== "queued") {
      throw new Error(`worker_delegate(wait=false) returned status ${queued.status}`);
    }

    let result = queued;
    while (!TERMINAL.has(result.status)) {
      if (Date.now() > deadline) {
        throw new Error(`task ${queued.task_id} still ${result.status} at the deadline`);
      }
      await new Promise((resolve) => setTimeout(resolve, 200));
      result = await call(client, "worker_status", { task_id: queued.task_id });
    }

    console.log(
      JSON.stringify({
        tools: names,
        task_id: result.task_id,
        status: result.status,
        changed_files: result.changed_files,
        error: result.error,
      }),
    );
  } finally {
    await client.close();
  }
}

main().then(
  () => process.exit(0),
  (error) => {
    console.error(`mcp_client.mjs: ${error?.stack ?? error}`);
    process.exit(1);
  },
);
