// The login page's one script: a token given in the URL's fragment (`/ui/login#token=...`, the
// URL `worker-bridge ui` prints; no server sees a fragment) is taken out of the address bar and
// posted with the form; under `--no-token` (data-open) the form is posted at once.
const form = document.getElementById("login");
const match = location.hash.match(/^#token=(.+)$/);
if (match) {
  history.replaceState(null, "", location.pathname);
  let token = match[1];
  try { token = decodeURIComponent(token); } catch { /* a stray %: posted as given */ }
  form.elements.token.value = token;
  form.submit();
} else if (document.body.dataset.open === "1") {
  form.submit();
}
