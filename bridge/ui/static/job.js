// A job's page: the candidates ranked with their reasons, what each changed next to the others,
// two chosen candidates' diffs side by side, review rounds with their findings, and the job's
// actions. Read again whenever the stream says one of its tasks (or the job) changed.
import {
  act, drawDiff, el, getJSON, live, notice, session, showError, text, withConfirmation,
} from "/ui/static/common.js";

const jobId = decodeURIComponent(location.pathname.split("/").pop());
const base = `/ui/api/jobs/${encodeURIComponent(jobId)}`;
const diffs = new Map();
let job = null;

function candidateName(c) {
  return `${c.label || c.task_id} · ${c.worker}`;
}

function checksOf(c) {
  const checks = c.checks || [];
  const passed = checks.filter((k) => k.exit_code === 0 && (!k.status || k.status === "passed")).length;
  return checks.length ? `${passed}/${checks.length} passed` : "none";
}

function candidates() {
  const rows = job.candidates.map((c) => el("tr", { dataset: { taskId: c.task_id, eligible: String(c.eligible) } },
    el("td", { className: "rank" }, c.rank === null || c.rank === undefined ? "–" : String(c.rank)),
    el("td", {}, el("a", { href: `/ui/tasks/${encodeURIComponent(c.task_id)}` }, c.label || c.task_id)),
    el("td", {}, c.worker),
    el("td", { className: `status status-${c.status}` }, c.status),
    el("td", {}, c.eligible ? "yes" : "no"),
    el("td", {}, checksOf(c)),
    el("td", {}, `+${c.lines_added || 0} −${c.lines_removed || 0}`),
    el("td", {}, String(c.files || 0)),
    el("td", {}, el("ul", { className: "reasons" }, ...(c.reasons || []).map((r) => el("li", {}, r)))),
  ));
  document.querySelector("#candidates tbody").replaceChildren(...rows);
  document.getElementById("candidates-section").hidden = job.candidates.length === 0 && job.kind !== "compete";
}

// Which candidate changed which path, and which checks passed where: the summary across them.
function across() {
  const cands = job.candidates;
  const head = el("tr", {}, el("th", {}, "path / check"), ...cands.map((c) => el("th", {}, c.label || c.task_id)));
  const paths = [...new Set(cands.flatMap((c) => c.paths || []))].sort();
  const rows = paths.map((path) => el("tr", {}, el("td", { className: "path" }, path),
    ...cands.map((c) => el("td", {}, (c.paths || []).includes(path) ? "changed" : ""))));
  const commands = [...new Set(cands.flatMap((c) => (c.checks || []).map((k) => k.command)))];
  for (const command of commands) {
    rows.push(el("tr", {}, el("td", {}, el("code", {}, command)), ...cands.map((c) => {
      const check = (c.checks || []).find((k) => k.command === command);
      return el("td", {}, check ? (check.exit_code === 0 ? "pass" : `exit ${check.exit_code}`) : "");
    })));
  }
  document.querySelector("#across thead").replaceChildren(head);
  document.querySelector("#across tbody").replaceChildren(...rows);
}

function fillSelect(id, chosen) {
  const select = document.getElementById(id);
  const keep = select.value || chosen;
  select.replaceChildren(...job.candidates.map((c) => el("option", { value: c.task_id }, candidateName(c))));
  if (keep) select.value = keep;
}

async function diffOf(taskId) {
  if (!diffs.has(taskId)) diffs.set(taskId, await getJSON(`/ui/api/tasks/${encodeURIComponent(taskId)}/diff`));
  return diffs.get(taskId);
}

async function compare() {
  const section = document.getElementById("compare-section");
  section.hidden = job.candidates.length < 2;
  if (section.hidden) return;
  for (const side of ["left", "right"]) {
    const taskId = document.getElementById(side).value;
    const c = job.candidates.find((x) => x.task_id === taskId);
    text(`${side}-title`, c ? `${candidateName(c)} (rank ${c.rank ?? "–"})` : "");
    const shown = taskId ? await diffOf(taskId) : { text: "", truncated: false, files: [] };
    text(`${side}-cut`, shown.truncated ? `Cut: only the first whole files of a ${Math.round(shown.total_bytes / 2 ** 20)} MiB diff are shown.` : "");
    drawDiff(document.getElementById(`${side}-diff`), shown.text, "line-by-line", shown.files);
  }
}

function rounds() {
  const list = job.rounds || [];
  document.getElementById("rounds-section").hidden = list.length === 0;
  document.getElementById("rounds").replaceChildren(...list.map((r) => el("li", { className: "round" },
    el("div", {}, `round ${r.round ?? ""}: ${r.verdict || "no verdict"}`, r.problem ? ` (${r.problem})` : "",
      r.verification_ok === undefined ? "" : ` · verification ${r.verification_ok === true ? "passed" : r.verification_ok === false ? "FAILED" : "none"}`),
    el("ul", { className: "findings" }, ...(r.findings || []).map((f) => el("li", { className: `finding finding-${f.severity}` },
      el("span", { className: "severity" }, f.severity || ""), " ", el("code", {}, `${f.path || ""}${f.line ? `:${f.line}` : ""}`), " ", f.text || ""))),
  )));
}

async function refresh() {
  job = await getJSON(base);
  text("job-id", job.job_id);
  text("kind", job.kind);
  text("status", job.status);
  document.getElementById("status").className = `status status-${job.status}`;
  text("objective", job.objective);
  const s = job.summary || {};
  text("job-summary", [
    job.kind === "compete" ? `${s.eligible ?? 0} of ${s.candidates ?? 0} candidates eligible` : "",
    job.winner ? `best: ${job.winner}` : "", job.stopped ? `stopped: ${job.stopped}` : "",
    s.judge ? `judge: ${s.judge}` : "", job.error ? `${job.error.kind}: ${job.error.message}` : "",
  ].filter(Boolean).join(" · "));
  candidates();
  across();
  fillSelect("left", job.candidates[0] && job.candidates[0].task_id);
  fillSelect("right", job.candidates[1] && job.candidates[1].task_id);
  fillSelect("accept-choice", job.winner);
  document.getElementById("job-tasks").replaceChildren(...job.tasks.map((t) => el("li", {},
    el("a", { href: `/ui/tasks/${encodeURIComponent(t.task_id)}` }, t.task_id), ` ${t.role}${t.label ? ` ${t.label}` : ""} · ${t.worker} · ${t.status}`)));
  rounds();
  // What cannot apply is not offered: cancel only while the job runs, accept only once it
  // ended with something to take (the bridge still refuses what cannot be accepted).
  document.getElementById("cancel").disabled = !["created", "running"].includes(job.status);
  document.getElementById("accept").disabled = !["succeeded", "unresolved"].includes(job.status);
  await compare();
}

async function main() {
  await session();
  for (const side of ["left", "right"]) document.getElementById(side).addEventListener("change", () => compare().catch((e) => showError(e.message)));
  document.getElementById("accept").addEventListener("click", () => {
    const chosen = document.getElementById("accept-choice").value;
    withConfirmation(`Accept candidate ${chosen || "(the best)"} of job ${jobId} into the working tree, rejecting the others?`,
      () => act(`${base}/accept`, chosen ? { task_id: chosen } : {}),
      async (outcome) => { notice(`Accepted: ${outcome.applied.length} file(s) written to the working tree.`); await refresh(); });
  });
  document.getElementById("cancel").addEventListener("click", () => withConfirmation(
    `Cancel job ${jobId} and every task of it?`, () => act(`${base}/cancel`, {}), async () => { notice("Cancelled."); await refresh(); }));
  await refresh();
  let pending = null;
  const mine = (id) => id === jobId || (job && job.tasks.some((t) => t.task_id === id));
  const changed = (id) => {
    if (!mine(id) || pending) return;
    pending = setTimeout(() => { pending = null; diffs.clear(); refresh().catch((e) => showError(e.message)); }, 200);
  };
  // From the cursor taken before the job was read: nothing between the read and the stream
  // is missed.
  live(`/ui/api/stream?after=${job.cursor}`, { task: (t) => changed(t.task_id), job: (j) => changed(j.job_id) });
}

main().catch((error) => showError(error.message));
