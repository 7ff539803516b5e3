"""The local web view (`worker-bridge ui`, and under /ui on the MCP HTTP listener): the task
list, a task's page and a job's page, live from the store's events, with the diffs rendered by
the bundled diff2html, and the actions the CLI has (accept, reject, cancel, follow-up, answer).

app.py builds the ASGI app and its gate, security.py holds sessions (a cookie and a per-tab
key) and the Host/Origin policy, routes.py the pages and read API, actions.py the verbs, sse.py
the event streams, views.py the documents the pages get, serve.py `worker-bridge ui`'s
listener; static/ the pages' own HTML, JS and CSS and the vendored third-party files
(static/vendor/VENDOR.md)."""
