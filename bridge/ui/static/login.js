// The login page's one script: a one-time sign-in code given in the URL's fragment
// (`/ui/login#code=...`, the link `worker-bridge ui` prints; no server sees a fragment) is taken
// out of the address bar and posted with the form; under `--no-token` (data-open) the form is
// posted at once. The token itself is never taken from a URL: whatever else a fragment holds
// (an old `#token=` link) only leaves the address bar.
const form = document.getElementById("login");
const match = location.hash.match(/^#code=(.+)$/);
if (location.hash) {
  history.replaceState(null, "", location.pathname);
}
if (match) {
  let code = match[1];
  try { code = decodeURIComponent(code); } catch { /* a stray %: posted as given */ }
  form.elements.code.value = code;
  form.submit();
} else if (document.body.dataset.open === "1") {
  form.submit();
}
