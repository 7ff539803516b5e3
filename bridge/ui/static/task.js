// A task's page: its result (read again whenever its stream says it changed), its diff, its
// live events, and the actions on it.
import {
  act, age, drawDiff, el, getJSON, live, notice, session, showError, text, verificationLabel,
  withConfirmation,
} from "/ui/static/common.js";

const taskId = decodeURIComponent(location.pathname.split("/").pop());
const base = `/ui/api/tasks/${encodeURIComponent(taskId)}`;
const MAX_EVENT_ROWS = 2000;  // the page keeps the newest; `worker-bridge tasks logs` has all
let format = "line-by-line";
let diff = { text: "", truncated: false, total_bytes: 0, files: [] };
let shownSnapshot = null;
let shownRequests = null;
let current = null;

function facts(task) {
  const rows = [
    ["worker", task.worker],
    ["repository", task.repository],
    ["phase", task.phase],
    ["base commit", task.base_commit],
    ["branch", task.branch],
    ["created", task.created_at ? `${task.created_at} (${age(task.created_at)} ago)` : ""],
    ["finished", task.finished_at],
    ["session", task.session_id],
    ["worker's node", task.worker_node],
    ["checks' node", task.verify_node],
  ];
  for (const [name, seconds] of Object.entries(task.timings || {})) rows.push([name.replace(/_s$/, ""), `${seconds} s`]);
  const nodes = [];
  for (const [name, value] of rows) {
    if (value === null || value === undefined || value === "") continue;
    nodes.push(el("dt", {}, name), el("dd", {}, value));
  }
  if (task.job_id) {
    nodes.push(el("dt", {}, "job"), el("dd", {}, el("a", { href: `/ui/jobs/${encodeURIComponent(task.job_id)}` }, task.job_id), ` (${task.job_role || ""})`));
  }
  document.getElementById("facts").replaceChildren(...nodes);
}

function checkStatus(cmd) {
  if (cmd.status && cmd.status !== "passed" && cmd.status !== "failed") return cmd.status.replace(/_/g, " ");
  return cmd.exit_code === 0 ? "passed" : `exit ${cmd.exit_code}`;
}

function verification(task) {
  const box = document.getElementById("verification");
  const v = task.verification;
  if (!v) { box.replaceChildren(el("p", { className: "muted" }, "Not verified yet.")); return; }
  const items = (v.commands || []).map((cmd) => el(
    "li",
    { className: `check check-${checkStatus(cmd) === "passed" ? "pass" : "fail"}` },
    el("div", { className: "check-head" }, el("code", {}, cmd.command), ` ${checkStatus(cmd)}`, cmd.duration_s !== null ? ` · ${cmd.duration_s} s` : ""),
    cmd.note ? el("p", { className: "muted" }, cmd.note) : null,
    cmd.stdout_tail ? el("details", { open: true }, el("summary", {}, "stdout (tail)"), el("pre", {}, cmd.stdout_tail)) : null,
    cmd.stderr_tail ? el("details", {}, el("summary", {}, "stderr (tail)"), el("pre", {}, cmd.stderr_tail)) : null,
  ));
  box.replaceChildren(
    el("p", { className: `v-${verificationLabel(v.ok)}` }, `verification: ${verificationLabel(v.ok)}`, v.image ? ` · image ${v.image}` : ""),
    el("ol", { className: "checks" }, ...items),
  );
}

function usage(task) {
  const u = task.usage;
  const box = document.getElementById("usage");
  if (!u) { box.replaceChildren(el("p", { className: "muted" }, "No network use recorded.")); return; }
  const tokens = Object.entries(u.tokens || {}).map(([model, t]) => `${model}: ${t.input} in / ${t.output} out`);
  box.replaceChildren(el("p", {}, `${u.requests} request(s), ${u.bytes_up} B up, ${u.bytes_down} B down`),
    ...tokens.map((line) => el("p", {}, line)));
}

// A file git shows as binary: its diff below is its text (escaped) when it is new or was text in
// the base, and the lines counted are its text's either way.
function binaryNote(f) {
  if (!f.binary) return null;
  const counted = `+${f.binary.lines_added} −${f.binary.lines_removed} counted`;
  const words = f.binary.flagged
    ? `binary: git shows no text for it; its text is shown below, NULs and other bytes that are not text escaped (${counted})`
    : `binary, as in the base (${counted})`;
  return el("span", { className: `binary-note${f.binary.flagged ? " flagged" : ""}` }, ` · ${words}`);
}

function changedFiles(task) {
  const items = (task.changed_files || []).map((f) => el("li", {}, el("span", { className: `change change-${f.change}` }, f.change), " ", f.path, f.from ? ` (from ${f.from})` : "", binaryNote(f)));
  for (const d of task.dropped || []) items.push(el("li", { className: "muted" }, `left out: ${d.path} (${d.reason})`));
  document.getElementById("changed-files").replaceChildren(...items);
}

// Drawn again only when a request came or changed status: a refresh in between (the live
// stream's) must not wipe an answer being typed or a choice just picked.
function requests(task) {
  const list = task.requests || [];
  const snapshot = list.map((r) => `${r.request_id}:${r.status}`).join("|");
  if (snapshot === shownRequests) return;
  shownRequests = snapshot;
  document.getElementById("requests-section").hidden = list.length === 0;
  document.getElementById("requests").replaceChildren(...list.map((r) => {
    const detail = r.detail || {};
    const what = r.what || JSON.stringify(detail);
    const item = el("li", { className: `request request-${r.status}`, dataset: { requestId: r.request_id } },
      el("span", { className: "request-kind" }, r.kind), " ", el("span", { className: "request-what" }, what),
      detail.reason ? el("span", { className: "muted" }, ` (${detail.reason})`) : null, ` · ${r.status}`);
    if (r.status !== "pending") return item;
    const send = (body, question) => withConfirmation(question, () => act(`${base}/answer`, { request_id: r.request_id, ...body }), refresh);
    if (r.kind === "question") {
      const input = el("input", { className: "answer-text", placeholder: "your answer" });
      const choices = (detail.choices || []).map((choice) => el("button", { type: "button", className: "choice", onclick: () => { input.value = choice; } }, choice));
      const form = el("form", { className: "inline-form" }, input, " ", el("button", { type: "submit", className: "answer" }, "Answer…"), ...choices);
      form.addEventListener("submit", (event) => { event.preventDefault(); send({ text: input.value }, `Answer “${input.value}”?`); });
      item.append(form);
    } else {
      item.append(" ",
        el("button", { type: "button", className: "approve", onclick: () => send({ decision: "approve" }, `Approve ${r.kind} request ${what}?`) }, "Approve…"), " ",
        el("button", { type: "button", className: "deny", onclick: () => send({ decision: "deny" }, `Deny ${r.kind} request ${what}?`) }, "Deny…"));
    }
    return item;
  }));
}

function actions(task) {
  const status = task.status;
  document.getElementById("accept").disabled = status !== "succeeded";
  document.getElementById("reject").disabled = status !== "succeeded";
  document.getElementById("cancel").disabled = ["succeeded", "failed", "cancelled", "timed_out", "accepted", "rejected"].includes(status);
  document.getElementById("follow-up").disabled = !["succeeded", "failed"].includes(status);
}

function mib(bytes) {
  return `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}

// The diff is read and drawn again only when the snapshot changed (not on every refresh).
async function drawChanges(task) {
  const snapshot = `${task.status}|${(task.changed_files || []).map((f) => f.path).join(",")}|${task.finished_at}`;
  if (snapshot === shownSnapshot) return;
  shownSnapshot = snapshot;
  diff = await getJSON(`${base}/diff`);
  const banner = document.getElementById("diff-cut");
  banner.hidden = !diff.truncated;
  banner.textContent = diff.truncated
    ? `The diff is ${mib(diff.total_bytes)}: only its first ${mib(diff.text.length)} (whole files) are shown. Accept writes all of it; see the rest with git diff in the task's worktree or branch.`
    : "";
  drawDiff(document.getElementById("diff"), diff.text, format, diff.files);
}

function waiting(task) {
  const pending = (task.requests || []).filter((r) => r.status === "pending").length;
  const box = document.getElementById("waiting");
  box.hidden = task.status !== "waiting_input";
  box.textContent = pending
    ? `Waiting for input: ${pending} request(s) below need an answer; the task resumes once they are answered.`
    : "Waiting for input.";
}

async function refresh() {
  const task = await getJSON(base);
  current = task;
  text("task-id", task.task_id);
  text("status", task.status);
  document.getElementById("status").className = `status status-${task.status}`;
  text("objective", task.objective);
  text("summary", task.summary || "");
  text("task-error", task.error ? `${task.error.kind}: ${task.error.message}` : "");
  facts(task);
  verification(task);
  usage(task);
  changedFiles(task);
  requests(task);
  waiting(task);
  actions(task);
  await drawChanges(task);
}

function wireActions() {
  const done = (message) => async () => { notice(message); await refresh(); };
  // A diff shown cut is accepted only when the question says so and the user confirms it.
  document.getElementById("accept").addEventListener("click", () => withConfirmation(
    `Write task ${taskId}'s change into ${current ? current.repository : "the repository"} (uncommitted)?` +
      (diff.truncated ? ` The diff shown was cut: this writes all ${mib(diff.total_bytes)} of it, including what you have not seen here.` : ""),
    () => act(`${base}/accept`, { allow_unverified: document.getElementById("allow-unverified").checked }),
    async (outcome) => {
      let words = `Accepted: ${outcome.applied.length} file(s) written to the working tree.`;
      if (outcome.reverified === true) words += ` HEAD had moved since the task's base; the checks passed on ${outcome.head.slice(0, 12)}.`;
      if (outcome.reverified === false) words += ` Warning: HEAD had moved since the task's base; the change is unverified on ${outcome.head.slice(0, 12)}.`;
      notice(words);
      await refresh();
    }));
  document.getElementById("reject").addEventListener("click", () => withConfirmation(
    `Reject task ${taskId}'s change?`, () => act(`${base}/reject`, {}), done("Rejected.")));
  document.getElementById("cancel").addEventListener("click", () => withConfirmation(
    `Cancel task ${taskId} and kill its containers?`, () => act(`${base}/cancel`, {}), done("Cancelled.")));
  document.getElementById("follow-up-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const message = document.getElementById("follow-up-text").value;
    withConfirmation(`Queue a follow-up turn: “${message}”?`, () => act(`${base}/follow-up`, { message }),
      async () => { document.getElementById("follow-up-text").value = ""; notice("Follow-up queued."); await refresh(); });
  });
  for (const [id, value] of [["view-unified", "line-by-line"], ["view-split", "side-by-side"]]) {
    document.getElementById(id).addEventListener("click", () => {
      format = value;
      document.body.dataset.diffFormat = value;
      drawDiff(document.getElementById("diff"), diff.text, format, diff.files);
    });
  }
}

function appendEvent(line) {
  const list = document.getElementById("events");
  list.append(el("li", { dataset: { kind: line.kind, eventId: String(line.event_id) } },
    el("time", { title: line.at }, line.at.slice(11, 19)), " ", el("span", { className: "event-line" }, line.line)));
  let dropped = false;
  while (list.children.length > MAX_EVENT_ROWS) { list.firstElementChild.remove(); dropped = true; }
  if (dropped) document.getElementById("events-cut").hidden = false;
}

async function main() {
  await session();
  wireActions();
  document.body.dataset.diffFormat = format;
  await refresh();
  let pending = null;
  live(`${base}/stream?after=0`, {
    line: appendEvent,
    changed: () => {
      if (pending) return;
      pending = setTimeout(() => { pending = null; refresh().catch((error) => showError(error.message)); }, 150);
    },
  });
}

main().catch((error) => showError(error.message));
