// What every page shares: the session's key (from the login's redirect fragment, kept in this
// tab's sessionStorage, which no other origin, port included, can read; sent as X-UI-Key with
// every read, stream and action: the cookie alone gets nothing), building elements from text
// (textContent only, with what a terminal or a page would act on shown as escapes), the
// confirmation dialog, errors as one sentence, and the live stream (fetch(), which can send
// the key, unlike EventSource).

const KEY = "wb-ui-key";
const CHANNEL = "wb-ui-key";  // same-origin tabs hand a new tab the key (BroadcastChannel)
let announce = null;  // a key from a login's fragment: told to the other tabs once it worked

function takeKeyFromFragment() {
  const match = location.hash.match(/^#k=([A-Za-z0-9_-]+)$/);
  if (!match) return false;
  sessionStorage.setItem(KEY, match[1]);
  history.replaceState(null, "", location.pathname + location.search);  // out of the URL
  return true;
}

// Answers a new tab's "want" with this tab's key; takes a fresh key from a tab that has just
// signed in (its login replaced the browser's one cookie, so only its key matches it now).
function shareKey() {
  const channel = new BroadcastChannel(CHANNEL);
  channel.onmessage = (message) => {
    const key = sessionStorage.getItem(KEY);
    if (message.data === "want" && key) channel.postMessage({ key });
    else if (message.data && message.data.fresh === true && typeof message.data.key === "string") {
      sessionStorage.setItem(KEY, message.data.key);
    }
  };
  return channel;
}

function askOtherTabs() {
  return new Promise((resolve) => {
    const channel = new BroadcastChannel(CHANNEL);
    const timer = setTimeout(() => { channel.close(); resolve(null); }, 400);
    channel.onmessage = (message) => {
      if (!message.data || typeof message.data.key !== "string") return;
      clearTimeout(timer);
      channel.close();
      resolve(message.data.key);
    };
    channel.postMessage("want");
  });
}

function key() {
  return sessionStorage.getItem(KEY) || "";
}

function signIn() {
  sessionStorage.removeItem(KEY);
  location.assign("/ui/login");
  return new Error("Sign in first.");
}

// Every page starts here: the key from the fragment, this tab or another tab of this view.
export async function session() {
  const fresh = takeKeyFromFragment();
  if (!key()) {
    const given = await askOtherTabs();
    if (!given) throw signIn();
    sessionStorage.setItem(KEY, given);
  }
  const channel = shareKey();
  if (fresh) announce = channel;  // any page can link to `#k=...`: only a key that works is told
  const logout = document.getElementById("logout");
  if (logout) {
    logout.hidden = false;
    logout.addEventListener("click", async () => {
      await fetch("/ui/logout", { method: "POST", credentials: "same-origin", headers: { "x-ui-key": key() } });
      signIn();
    });
  }
}

async function answer(response) {
  const type = response.headers.get("content-type") || "";
  const body = type.includes("json") ? await response.json() : await response.text();
  if (response.status === 401) throw signIn();
  if (response.ok && announce) {
    announce.postMessage({ key: key(), fresh: true });
    announce = null;
  }
  if (!response.ok) {
    const message = typeof body === "object" && body && body.error ? body.error : `HTTP ${response.status}`;
    throw new Error(message);
  }
  return body;
}

export async function getJSON(path) {
  return answer(await fetch(path, { credentials: "same-origin", headers: { "x-ui-key": key() } }));
}

export async function act(path, body = {}) {
  const response = await fetch(path, {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/json", "x-ui-key": key() },
    body: JSON.stringify(body),
  });
  return answer(response);
}

// What a terminal or a page would act on rather than show, as bridge/display.py's
// terminal_safe has it: C0 controls but tab and newline, DEL, C1 controls, the bidirectional
// overrides and isolates (a worker's U+202E cannot reorder what is shown), line separators,
// and the code points no one sees (display.py's INVISIBLE_RANGES: zero-width and tag
// characters, variation selectors, fillers: a payload spelt in them would show as nothing).
const INVISIBLE = "\\u00ad\\u034f\\u061c\\u115f\\u1160\\u17b4\\u17b5\\u180b-\\u180f\\u200b-\\u200f\\u202a-\\u202e\\u2060-\\u206f\\u3164\\ufe00-\\ufe0f\\ufeff\\uffa0\\ufff0-\\ufff8\\u{1bca0}-\\u{1bca3}\\u{1d173}-\\u{1d17a}\\u{e0000}-\\u{e0fff}";
const UNSAFE = new RegExp(`[\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f\\u2028\\u2029${INVISIBLE}]`, "gu");
const UNSAFE_IN_DIFF = new RegExp(`[\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f-\\u009f\\u2028\\u2029${INVISIBLE}]`, "gu");

function escapeOf(c) {
  const code = c.codePointAt(0);
  if (code < 0x100) return `\\x${code.toString(16).padStart(2, "0")}`;
  return code <= 0xffff ? `\\u${code.toString(16).padStart(4, "0")}` : `\\U${code.toString(16).padStart(8, "0")}`;
}

export function safe(value) {
  return String(value).replace(UNSAFE, escapeOf);
}

// el("td", {className: "x"}, "text", otherNode): children are text or nodes, never markup;
// text is shown display-safe (safe()).
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "href") node.setAttribute("href", value);
    else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(safe(child)));
  }
  return node;
}

export function text(id, value) {
  document.getElementById(id).textContent = value === null || value === undefined ? "" : safe(value);
}

export function showError(message) {
  const box = document.getElementById("error");
  box.textContent = safe(message);
  box.hidden = !message;
}

export function notice(message) {
  const box = document.getElementById("notice");
  if (!box) return;
  box.textContent = safe(message);
  box.hidden = !message;
}

// The question is what the user decides on: a worker's words in it (a path it asks for, a
// choice it offers) are shown display-safe too, so an override cannot reorder them there.
export function confirmAction(question) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = safe(question);
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

// The server's stream, read with fetch() (so it carries the key), parsed as server-sent events;
// after an error or its end, opened again after the last id it got. Handlers by message kind;
// the state shown in the header.
export function live(url, handlers) {
  const badge = document.getElementById("live");
  let after = new URL(url, location.href).searchParams.get("after");
  const show = (state, words) => { badge.textContent = words; badge.dataset.state = state; };
  const dispatch = (block) => {
    let kind = "message";
    const data = [];
    for (const line of block.split("\n")) {
      const colon = line.indexOf(":");
      if (colon === 0) continue;  // a comment: keep-alive
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "id") after = value;
      else if (field === "event") kind = value;
      else if (field === "data") data.push(value);
    }
    if (data.length && handlers[kind]) handlers[kind](JSON.parse(data.join("\n")));
  };
  async function run() {
    for (;;) {
      try {
        const target = new URL(url, location.href);
        if (after !== null) target.searchParams.set("after", after);
        const response = await fetch(target, { credentials: "same-origin", headers: { "x-ui-key": key(), accept: "text/event-stream" } });
        if (response.status === 401) throw signIn();
        if (!response.ok) throw new Error(`HTTP ${response.status}`);
        show("open", "live");
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            dispatch(buffer.slice(0, end));
            buffer = buffer.slice(end + 2);
          }
        }
      } catch (error) {
        if (error.message === "Sign in first.") return;
      }
      show("closed", "reconnecting…");
      await new Promise((resolve) => setTimeout(resolve, 2000));
    }
  }
  run();
}

// A diff rendered by diff2html (it escapes the diff's text and names; highlight.js colours it
// unless the diff is big: highlighting half a megabyte stalls the page). Bidirectional
// overrides and controls in it are shown as escapes (a change cannot hide what it does).
export const HIGHLIGHT_LIMIT = 500_000;
// diff2html reads a lone CR as a line break: a CR inside a worker's added line would start a
// line of its own there, drawn as removed (`\r-...`), unchanged (`\r ...`) or as another
// file (`\rdiff --git ...`). Shown as its escape it stays in its line; a CRLF line's CR (the
// file's own line end) is left to diff2html, which drops it.
const LONE_CR = /\r(?!\n)/g;

export function drawDiff(target, diffText, outputFormat, files = []) {
  target.replaceChildren();
  if (!diffText.trim()) {
    target.append(el("p", { className: "muted" }, "No changes."));
    return;
  }
  const shown = diffText.replace(LONE_CR, "\\x0d").replace(UNSAFE_IN_DIFF, escapeOf);
  const ui = new window.Diff2HtmlUI(target, shown, {
    outputFormat,
    drawFileList: true,
    fileListToggle: false,
    matching: diffText.length > HIGHLIGHT_LIMIT ? "none" : "lines",
    highlight: diffText.length <= HIGHLIGHT_LIMIT,
    synchronisedScroll: true,
  });
  ui.draw();
  if (diffText.length <= HIGHLIGHT_LIMIT) ui.highlightCode();
  nameFiles(target, files);
}

// diff2html reads file names out of git's headers its own way (git's quoting left in, a
// backslash made a slash, a header cut at its first " b/", a name that looks like a timestamp
// dropped...): each file's name, in the file list and its header, is put back as the server
// read it from git's header (`files`, in the diff's order: diff2html makes one file of each
// `diff --git` line), as text; a rename's two names are two elements with an arrow apart.
function nameFiles(target, files) {
  const headers = target.querySelectorAll(".d2h-file-wrapper .d2h-file-header .d2h-file-name");
  const listed = target.querySelectorAll(".d2h-file-list .d2h-file-name");
  if (headers.length !== files.length || listed.length !== files.length) {
    if (files.length) showError("The diff's files could not be matched with their names: the names above the files may be cut or escaped; the changed files list has them exactly.");
    return;
  }
  files.forEach((file, i) => {
    if (file === null) return;
    for (const node of [headers[i], listed[i]]) {
      node.replaceChildren(...(file.from === undefined ? [] : [
        el("span", { className: "file-from" }, file.from),
        el("span", { className: "file-arrow", title: "renamed to" }, " → "),
      ]), el("span", { className: "file-path" }, file.path));
    }
  });
}
