// What every page shares: the API calls (the CSRF token sent with each action), building
// elements from text (textContent only: nothing a worker wrote is ever parsed as HTML), the
// confirmation dialog, errors as one sentence, and the live stream (EventSource).

let csrf = null;

export async function session() {
  const response = await fetch("/ui/api/session", { credentials: "same-origin" });
  if (response.status === 401) {
    location.assign("/ui/login");
    throw new Error("Sign in first.");
  }
  csrf = (await response.json()).csrf;
}

async function answer(response) {
  const type = response.headers.get("content-type") || "";
  const body = type.includes("json") ? await response.json() : await response.text();
  if (!response.ok) {
    const message = typeof body === "object" && body && body.error ? body.error : `HTTP ${response.status}`;
    throw new Error(message);
  }
  return body;
}

export async function getJSON(path) {
  return answer(await fetch(path, { credentials: "same-origin" }));
}

export async function getText(path) {
  return answer(await fetch(path, { credentials: "same-origin" }));
}

export async function act(path, body = {}) {
  const response = await fetch(path, {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/json", "x-csrf-token": csrf || "" },
    body: JSON.stringify(body),
  });
  return answer(response);
}

// el("td", {className: "x"}, "text", otherNode): children are text or nodes, never markup.
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "href") node.setAttribute("href", value);
    else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function text(id, value) {
  document.getElementById(id).textContent = value === null || value === undefined ? "" : String(value);
}

export function showError(message) {
  const box = document.getElementById("error");
  box.textContent = message;
  box.hidden = !message;
}

export function notice(message) {
  const box = document.getElementById("notice");
  if (!box) return;
  box.textContent = message;
  box.hidden = !message;
}

export function confirmAction(question) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = question;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

// Ask, then run the action; its refusal shown as the bridge's one sentence.
export async function withConfirmation(question, run, done) {
  if (!(await confirmAction(question))) return;
  showError("");
  try {
    const outcome = await run();
    if (done) await done(outcome);
  } catch (error) {
    showError(error.message);
  }
}

export function age(iso) {
  if (!iso) return "";
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (seconds < 60) return `${seconds} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h`;
  return `${Math.floor(seconds / 86400)} d`;
}

export function verificationLabel(ok) {
  if (ok === true) return "passed";
  if (ok === false) return "FAILED";
  return "none";
}

// The server's stream: handlers by message kind; the state shown in the header.
export function live(url, handlers) {
  const source = new EventSource(url, { withCredentials: true });
  const badge = document.getElementById("live");
  source.addEventListener("open", () => {
    badge.textContent = "live";
    badge.dataset.state = "open";
  });
  source.addEventListener("error", () => {
    badge.textContent = "reconnecting…";
    badge.dataset.state = "closed";
  });
  for (const [kind, handler] of Object.entries(handlers)) {
    source.addEventListener(kind, (message) => handler(JSON.parse(message.data)));
  }
  return source;
}

// A diff rendered by diff2html (it escapes the diff's text and names; highlight.js colours it).
export function drawDiff(target, diffText, outputFormat) {
  target.replaceChildren();
  if (!diffText.trim()) {
    target.append(el("p", { className: "muted" }, "No changes."));
    return;
  }
  const ui = new window.Diff2HtmlUI(target, diffText, {
    outputFormat,
    drawFileList: true,
    fileListToggle: false,
    matching: "lines",
    highlight: true,
    synchronisedScroll: true,
  });
  ui.draw();
  ui.highlightCode();
}
