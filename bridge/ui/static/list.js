// The task list: loaded once, then kept current by the server's stream (each message is a
// task's new row); filtered in the page by status and text.
import { age, el, getJSON, live, session, showError, verificationLabel } from "/ui/static/common.js";

const rows = new Map();
const jobs = new Map();

function taskRow(task) {
  const link = el("a", { href: `/ui/tasks/${encodeURIComponent(task.task_id)}` }, task.task_id);
  const tr = el(
    "tr",
    { dataset: { taskId: task.task_id, status: task.status } },
    el("td", {}, link),
    el("td", { className: `status status-${task.status}` }, task.status),
    el("td", {}, task.worker),
    el("td", { className: "path" }, task.repository),
    el("td", { className: "objective" }, task.objective),
    el("td", { title: task.created_at }, age(task.created_at)),
    el("td", { className: `verification v-${verificationLabel(task.verification)}` },
      task.checks ? `${verificationLabel(task.verification)} (${task.checks})` : verificationLabel(task.verification)),
    el("td", { className: task.pending ? "pending" : "" },
      task.pending ? el("a", { href: `/ui/tasks/${encodeURIComponent(task.task_id)}` }, `${task.pending} pending: answer`) : ""),
  );
  tr.dataset.search = [task.task_id, task.worker, task.repository, task.objective, task.job_id || ""].join(" ").toLowerCase();
  return tr;
}

function jobRow(job) {
  const link = el("a", { href: `/ui/jobs/${encodeURIComponent(job.job_id)}` }, job.job_id);
  return el(
    "tr",
    { dataset: { jobId: job.job_id } },
    el("td", {}, link),
    el("td", {}, job.kind),
    el("td", { className: `status status-${job.status}` }, job.status),
    el("td", { className: "objective" }, job.objective),
    el("td", {}, String(job.tasks)),
    el("td", { title: job.created_at }, age(job.created_at)),
  );
}

function newestFirst(a, b) {
  return a.created_at < b.created_at ? 1 : a.created_at > b.created_at ? -1 : 0;
}

function render() {
  const status = document.getElementById("filter-status").value;
  const words = document.getElementById("filter-text").value.trim().toLowerCase();
  const body = document.querySelector("#tasks tbody");
  const shown = [...rows.values()].sort(newestFirst).map(taskRow)
    .filter((tr) => (!status || tr.dataset.status === status) && (!words || tr.dataset.search.includes(words)));
  body.replaceChildren(...shown);
  document.getElementById("no-tasks").hidden = shown.length > 0;
  document.querySelector("#jobs tbody").replaceChildren(...[...jobs.values()].sort(newestFirst).map(jobRow));
}

async function main() {
  await session();
  const page = await getJSON("/ui/api/tasks");
  for (const task of page.tasks) rows.set(task.task_id, task);
  for (const job of page.jobs) jobs.set(job.job_id, job);
  render();
  document.getElementById("filter-status").addEventListener("change", render);
  document.getElementById("filter-text").addEventListener("input", render);
  document.getElementById("filters").addEventListener("submit", (event) => event.preventDefault());
  live(`/ui/api/stream?after=${page.cursor}`, {
    task: (task) => { rows.set(task.task_id, task); render(); },
    job: (job) => { jobs.set(job.job_id, job); render(); },
  });
}

main().catch((error) => showError(error.message));
