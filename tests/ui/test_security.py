"""The web view refuses what a hostile page or client would try: a read, stream or action with
the session cookie alone (what a page on another loopback port can get), or with a wrong key,
a request for another Host (DNS rebinding) or from another Origin, a token in a URL's query, a
session cookie that is the token, malformed input meant to raise; and it shows nothing of a
task outside `repositories` (list, page, stream, actions). Through `worker-bridge ui` as a
subprocess and plain HTTP; the browser tests are in test_browser.py."""

from __future__ import annotations

import argparse
import re
import uuid

import httpx2
import pytest
from support.cli import cli_runner
from support.mcp_http_server import http_server
from support.repos import calc_repo
from support.tasks import bare_spec, new_job
from support.ui import big_diff_task, file_diff, log_in, shared_site, signed_in, ui_server
from support.waiting import poll

from bridge.errors import ConfigError
from bridge.models import JobStatus
from bridge.ui.security import CODE_TTL_S, HostPolicy, Sessions
from bridge.ui.serve import login_url, ui_options

ACTIONS = ("accept", "reject", "cancel", "follow-up", "answer")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """One `worker-bridge ui` for the module's tests that need no state of their own."""
    with shared_site(tmp_path_factory) as running:
        yield running


@pytest.fixture
def ui(site):
    return site.server


@pytest.fixture
def token(site):
    return site.token


@pytest.fixture
def created(site):
    """A task of this test's own, created and never started (nothing runs)."""
    return site.bridge.create_task(bare_spec(site.repo)).task_id


def test_signing_in_gives_a_cookie_named_for_the_port_and_a_key_in_the_fragment(ui, token):
    port = ui.url.rsplit(":", 1)[1]
    with httpx2.Client(base_url=ui.url) as client:
        answer = client.post("/ui/login", data={"token": token}, headers={"origin": ui.url})
        assert answer.status_code == 303
        location = answer.headers["location"]
        assert location.startswith("/ui/#k=") and token not in location  # the key, not the token
        key = location.removeprefix("/ui/#k=")
        cookie = answer.headers["set-cookie"]
        assert cookie.startswith(f"wb_ui_{port}=")  # `ui` and `mcp --http` keep their own
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
        value = cookie.split(";")[0].split("=", 1)[1]
        assert value and token not in cookie and value != token and value != key
        page = client.get("/ui/")
        assert page.status_code == 200 and token not in page.text and key not in page.text
        assert client.get("/ui/api/session").status_code == 404  # no cookie-for-secret exchange
        assert client.get("/ui/api/tasks", headers={"x-ui-key": key}).status_code == 200


def test_the_token_in_a_query_signs_nobody_in(ui, token):
    with httpx2.Client(base_url=ui.url) as client:
        answer = client.get("/ui/login", params={"token": token})
        assert answer.status_code == 200 and "set-cookie" not in answer.headers
        assert token not in answer.text


def test_the_link_worker_bridge_ui_prints_signs_in_once_and_never_carries_the_token(home):
    """A browser started with the printed link has it in its argv (which every local user can
    read in /proc) and its history: the link carries a code that makes one session and is void
    after; the reusable token made for the run is in no URL, and the form still takes it."""
    with ui_server(
        home, env={"WORKER_BRIDGE_MCP_TOKEN": "", "WORKER_BRIDGE_MCP_TOKEN_FILE": ""}
    ) as ui:
        printed = poll(lambda: "open http" in ui.log_text() and ui.log_text(), "the link", 30)
        [link] = re.findall(r"open (http://\S+)", printed)
        assert link.startswith(f"{ui.url}/ui/login#code=") and "token" not in link
        code = link.partition("#code=")[2]
        with httpx2.Client(base_url=ui.url) as client:
            first = client.post("/ui/login", data={"code": code}, headers={"origin": ui.url})
            assert first.status_code == 303 and first.headers["location"].startswith("/ui/#k=")
            key = first.headers["location"].removeprefix("/ui/#k=")
            assert client.get("/ui/api/tasks", headers={"x-ui-key": key}).status_code == 200
            with httpx2.Client(base_url=ui.url) as reader:  # the other one holding the link
                again = reader.post("/ui/login", data={"code": code}, headers={"origin": ui.url})
                assert again.status_code == 401 and "set-cookie" not in again.headers
                assert "the session it opened is ended" in again.text
                # Whoever won the race (another user reading the browser's argv, say) holds
                # the session only until the browser presents the link in its turn.
                ended = client.get("/ui/api/tasks", headers={"x-ui-key": key})
                assert ended.status_code == 401, ended.text
                third = reader.post("/ui/login", data={"code": code}, headers={"origin": ui.url})
                assert "used already or has expired" in third.text
        with httpx2.Client(base_url=ui.url) as reader:
            [token] = re.findall(r"token made for this run[^:]*: (\S+)", printed)
            assert len(token) >= 32 and token not in link and token != code
            assert log_in(reader, ui.url, token)  # the form, as before


def test_a_sign_in_code_is_void_once_used_or_expired_and_a_guess_is_refused():
    clock = [1000.0]
    sessions = Sessions("a-token-of-enough-length", 8770, clock=lambda: clock[0])
    used, late = sessions.issue_code(), sessions.issue_code()
    assert used != late and len(used) >= 32
    assert not sessions.redeem_code(used + "x") and not sessions.redeem_code("")
    assert sessions.redeem_code(used) and not sessions.redeem_code(used)
    clock[0] += CODE_TTL_S + 1
    assert not sessions.redeem_code(late)


def test_the_login_form_takes_the_token_by_post_and_refuses_a_wrong_one(ui, token):
    with httpx2.Client(base_url=ui.url) as client:
        wrong = client.post("/ui/login", data={"token": token + "x"}, headers={"origin": ui.url})
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
        assert "not this server" in wrong.text
        right = client.post("/ui/login", data={"token": token}, headers={"origin": ui.url})
        assert right.status_code == 303 and "set-cookie" in right.headers


def test_nothing_but_the_login_and_static_files_is_served_without_a_session(ui, created):
    with httpx2.Client(base_url=ui.url) as client:
        assert client.get("/ui/").status_code == 303  # to the login
        assert client.get(f"/ui/tasks/{created}").status_code == 303
        for path in ("/ui/api/tasks", f"/ui/api/tasks/{created}", "/ui/api/stream"):
            assert client.get(path).status_code == 401, path
        assert client.get("/ui/static/app.css").status_code == 200
        assert client.get("/ui/login").status_code == 200


def test_the_session_cookie_alone_reads_streams_and_does_nothing(ui, token, created, site):
    """Cookies are not isolated by port: a page on another loopback port may hold ours. Without
    the key (in the page's sessionStorage, its origin's alone) it gets no data, no stream and
    no action; a wrong key neither."""
    reads = (
        "/ui/api/tasks",
        f"/ui/api/tasks/{created}",
        f"/ui/api/tasks/{created}/diff",
        "/ui/api/stream",
        f"/ui/api/tasks/{created}/stream",
    )
    logged = _refusal_lines(ui, "with the session cookie but without its key")
    with signed_in(ui.url, token) as browser, browser.cookie_only() as thief:
        answers = [thief.get("/ui/")]  # the static shell: no data in it
        assert answers[0].status_code == 200
        for path in reads:
            answers.append(thief.get(path))
            assert answers[-1].status_code == 401, path
            wrong = {"x-ui-key": browser.key[:-1] + ("A" if browser.key[-1] != "A" else "B")}
            answers.append(thief.get(path, headers=wrong))
            assert answers[-1].status_code == 401, path
        for verb in ACTIONS:
            path = f"/ui/api/tasks/{created}/{verb}"
            answers.append(thief.post(path, json={}, headers={"origin": ui.url}))
            assert answers[-1].status_code == 401, verb
        for verb in ("accept", "cancel"):
            answers.append(thief.post(f"/ui/api/jobs/j/{verb}", headers={"origin": ui.url}))
            assert answers[-1].status_code == 401, verb
        answers.append(thief.post("/ui/logout", headers={"origin": ui.url}))
        assert answers[-1].status_code == 401
        # Nothing hands the key out for the cookie: the old cookie-for-CSRF exchange is gone
        # and the login page, under a token, gives no session to a cookie.
        answers += [thief.get("/ui/api/session"), thief.get("/ui/login")]
        assert answers[-2].status_code == 404
        answers.append(thief.post("/ui/login", data={"token": ""}, headers={"origin": ui.url}))
        assert answers[-1].status_code == 401
        for answer in answers:
            assert browser.key not in answer.text and browser.key not in str(answer.headers)
        assert site.bridge.get_task(created).status == "created"  # none of it did anything
        assert browser.client.get("/ui/api/tasks").status_code == 200  # the page still works
    now = _refusal_lines(ui, "with the session cookie but without its key")
    assert now >= 1 and now - logged <= 1  # logged, but not once per request


def test_an_action_without_the_cookie_or_from_elsewhere_is_refused(ui, token, created, site):
    bridge = site.bridge
    with signed_in(ui.url, token) as browser:
        with httpx2.Client(base_url=ui.url) as stranger:  # no cookie, even with the key
            for verb in ACTIONS:
                refused = stranger.post(
                    f"/ui/api/tasks/{created}/{verb}",
                    json={},
                    headers={"origin": ui.url, "x-ui-key": browser.key},
                )
                assert refused.status_code == 401, verb
        for verb in ACTIONS:
            path = f"/ui/api/tasks/{created}/{verb}"
            # the right key from another origin, or with no Origin at all
            assert browser.act(path, origin="http://evil.example").status_code == 403
            assert browser.client.post(path, json={}).status_code == 403
        assert browser.client.post("/ui/api/jobs/x/cancel", json={}).status_code == 403
        assert bridge.get_task(created).status == "created"  # none of it did anything
        done = browser.act(f"/ui/api/tasks/{created}/cancel")  # the page's own request works
        assert done.status_code == 200, done.text
        assert bridge.get_task(created).status == "cancelled"


def test_signing_out_ends_the_session(ui, token):
    with signed_in(ui.url, token) as browser:
        assert browser.client.post("/ui/logout", headers={"origin": ui.url}).status_code == 200
        assert browser.client.get("/ui/api/tasks").status_code == 401
        assert browser.client.get("/ui/").status_code == 303


@pytest.mark.timeout(120)
def test_an_open_stream_ends_with_its_session(ui, token, created):
    """A stream is checked when it opens and then as long as it runs: signed out, it ends
    (it does not go on pushing the task's events to whoever held it)."""
    with signed_in(ui.url, token) as browser:
        with (
            browser.client.stream("GET", "/ui/api/stream") as every,
            browser.client.stream("GET", f"/ui/api/tasks/{created}/stream") as one,
        ):
            readers = [every.iter_lines(), one.iter_lines()]
            assert [next(r) for r in readers] == ["retry: 2000", "retry: 2000"]
            out = browser.client.post("/ui/logout", headers={"origin": ui.url})
            assert out.status_code == 200
            for reader in readers:
                for _ in reader:  # ends: the loop would otherwise get keep-alives forever
                    pass
        assert browser.client.get("/ui/api/stream").status_code == 401


def test_a_refused_action_says_the_bridges_one_sentence(ui, token, created):
    with signed_in(ui.url, token) as browser:
        refused = browser.act(f"/ui/api/tasks/{created}/accept")
        assert refused.status_code == 409
        message = refused.json()["error"]
        assert created in message and "\n" not in message
        empty = browser.act(f"/ui/api/tasks/{created}/follow-up", {"message": " "})
        assert empty.status_code == 409
        assert empty.json()["error"] == (
            "The follow-up message is empty; say what the worker should do."
        )
        unknown = browser.act("/ui/api/tasks/nope/cancel")
        assert unknown.status_code == 404 and "nope" in unknown.json()["error"]


def test_an_answer_is_checked_for_its_shape_before_the_bridge_sees_it(ui, token, created):
    with signed_in(ui.url, token) as browser:
        path = f"/ui/api/tasks/{created}/answer"
        cases = {
            "'decision' must be approve or deny.": {"request_id": "r1", "decision": "yes"},
            "Give a decision (approve or deny) or a text answer, one of them.": {
                "request_id": "r1",
                "decision": "approve",
                "text": "also this",
            },
            "'text' must be text.": {"request_id": "r1", "text": 3},
            "The request must be a JSON object.": ["r1"],
        }
        for message, body in cases.items():
            refused = browser.client.post(path, json=body, headers={"origin": ui.url})
            assert (refused.status_code, refused.json()["error"]) == (409, message)


def _config(home, text: str) -> None:
    path = home / "config.yaml"
    path.write_text((path.read_text() if path.exists() else "") + text)


def test_the_mcp_http_listener_serves_no_pages_unless_config_says_so(home, token_file):
    token = token_file.read_text().strip()
    with http_server(home, "--token-file", str(token_file)) as mcp:
        with httpx2.Client(base_url=mcp.url) as client:
            login = client.post("/ui/login", data={"token": token}, headers={"origin": mcp.url})
            assert login.status_code == 401 and "set-cookie" not in login.headers  # /mcp's gate
            bearer = {"authorization": f"Bearer {token}"}
            assert client.get("/ui/", headers=bearer).status_code == 404


def test_the_mcp_http_listener_serves_the_same_pages_behind_the_same_token(
    home, token_file, bridge, repo
):
    token = token_file.read_text().strip()
    created = bridge.create_task(bare_spec(repo)).task_id
    _config(home, "http:\n  ui: true\n")
    with http_server(home, "--token-file", str(token_file)) as mcp:
        with httpx2.Client(base_url=mcp.url) as client:
            bearer = {"authorization": f"Bearer {token}"}
            assert client.get("/ui/api/tasks", headers=bearer).status_code == 401  # a session
            wrong = client.post(
                "/ui/login", data={"token": "wrong-token-1234"}, headers={"origin": mcp.url}
            )
            assert wrong.status_code == 401
        with signed_in(mcp.url, token) as browser:
            port = mcp.url.rsplit(":", 1)[1]
            assert [c.name for c in browser.client.cookies.jar] == [f"wb_ui_{port}"]
            listed = browser.client.get("/ui/api/tasks").json()["tasks"]
            assert [t["task_id"] for t in listed] == [created]
            assert browser.client.get("/ui/", headers={"host": "evil.example"}).status_code == 421
            # The cookie is no bearer token: /mcp still wants the header.
            assert browser.client.post("/mcp", json={}).status_code == 401
            with browser.cookie_only() as thief:  # nor, without the key, a session here
                assert thief.get("/ui/api/tasks").status_code == 401
                assert thief.get("/ui/api/stream").status_code == 401
                cancel = thief.post(
                    f"/ui/api/tasks/{created}/cancel", json={}, headers={"origin": mcp.url}
                )
                assert cancel.status_code == 401
            assert bridge.get_task(created).status == "created"
            done = browser.act(f"/ui/api/tasks/{created}/cancel")
            assert done.status_code == 200 and done.json()["status"] == "cancelled"


@pytest.mark.parametrize(
    ("bind", "host", "answered"),
    [
        ("127.0.0.1", "127.0.0.1:8770", True),
        ("127.0.0.1", "localhost", True),
        ("127.0.0.1", "[::1]:8770", True),
        ("127.0.0.1", "LOCALHOST:1", True),
        ("127.0.0.1", "127.0.0.1.nip.io:8770", False),  # a name that resolves to loopback
        ("127.0.0.1", "attacker.example", False),
        ("127.0.0.1", "localhost:80x", False),
        ("127.0.0.1", "[::1]x", False),
        ("127.0.0.1", "", False),
        ("192.168.1.5", "192.168.1.5:8770", True),
        ("192.168.1.5", "localhost:8770", False),
        ("0.0.0.0", "bridge.internal:8770", True),  # a wildcard address: the token decides
    ],
)
def test_the_host_policy_answers_only_the_listeners_own_names(bind, host, answered):
    assert HostPolicy(bind).allows(host) is answered


def test_a_request_for_another_host_name_is_refused_whatever_it_carries(ui, token, created):
    with signed_in(ui.url, token) as browser:
        rebound = {"host": "attacker.example:80"}
        for path in ("/ui/", "/ui/login", f"/ui/api/tasks/{created}", "/ui/static/app.css"):
            assert browser.client.get(path, headers=rebound).status_code == 421, path
        action = browser.act(f"/ui/api/tasks/{created}/cancel", host="attacker.example")
        assert action.status_code == 421
        assert browser.client.get("/ui/api/tasks", headers={"host": "localhost:1"}).is_success


def test_a_page_or_read_from_another_origin_or_site_is_refused(ui, token, created):
    with signed_in(ui.url, token) as browser:
        for headers in ({"origin": "http://evil.example"}, {"sec-fetch-site": "cross-site"}):
            for path in ("/ui/", f"/ui/tasks/{created}", "/ui/api/tasks", "/ui/api/stream"):
                assert browser.client.get(path, headers=headers).status_code == 403, path
        assert browser.client.get("/ui/", headers={"sec-fetch-site": "same-origin"}).is_success


def test_every_answer_carries_the_strict_headers(ui, token):
    with signed_in(ui.url, token) as browser:
        for path in ("/ui/", "/ui/api/tasks", "/ui/static/list.js", "/ui/nope"):
            headers = browser.client.get(path).headers
            csp = headers["content-security-policy"]
            assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
            assert headers["x-content-type-options"] == "nosniff"
            assert headers["x-frame-options"] == "DENY"
        page = browser.client.get("/ui/").text
        assert "<script>" not in page and " on" not in page.split("<body>")[1].split("=")[0]


def test_no_token_is_refused_off_loopback_and_a_missing_token_is_made_for_the_run():
    def options(**flags):
        args = argparse.Namespace(
            **{"listen": None, "token_file": None, "no_token": False, **flags}
        )
        return ui_options(args, env={})

    with pytest.raises(ConfigError, match="only on a loopback address"):
        options(listen="0.0.0.0:8770", no_token=True)
    assert options(listen="127.0.0.1:8770", no_token=True).token is None
    made = options()
    assert made.host == "127.0.0.1" and len(made.token) >= 32
    assert options().token != made.token
    with pytest.raises(ConfigError, match="--listen wants HOST:PORT"):
        options(listen="nowhere")
    url = login_url(made, code="c0de")  # a one-time code in the fragment, never the token
    assert url == "http://127.0.0.1:8770/ui/login#code=c0de" and made.token not in url


def test_without_a_token_every_login_gets_the_one_shared_session_and_pages_make_none(
    home, bridge, repo
):
    """Under --no-token anyone local may sign in, so nobody can evict the others' sessions by
    signing in again and again: a page's GET makes no session and every login gets the same."""
    created = bridge.create_task(bare_spec(repo)).task_id
    with ui_server(home, "--no-token") as ui, httpx2.Client(base_url=ui.url) as client:
        first = client.get("/ui/")
        assert first.status_code == 303 and "set-cookie" not in first.headers  # to the login
        login_page = client.get("/ui/login")
        assert login_page.status_code == 200 and 'data-open="1"' in login_page.text
        key = log_in(client, ui.url, "")
        for _ in range(300):  # past MAX_SESSIONS
            with httpx2.Client(base_url=ui.url) as other:
                assert log_in(other, ui.url, "") == key
        path = f"/ui/api/tasks/{created}/cancel"
        assert client.post(path, json={}, headers={"origin": ui.url}).status_code == 401
        sent = {"origin": ui.url, "x-ui-key": key}
        assert client.post(path, json={}, headers=sent).status_code == 200


def test_a_task_outside_repositories_is_absent_from_list_page_stream_and_actions(
    home, workdir, token_file, bridge
):
    token = token_file.read_text().strip()
    for folder in ("allowed", "elsewhere"):
        (workdir / folder).mkdir()
    inside = calc_repo(workdir / "allowed" / "repo")
    outside = calc_repo(workdir / "elsewhere" / "repo")
    kept = bridge.create_task(bare_spec(inside, objective="inside")).task_id
    hidden = bridge.create_task(bare_spec(outside, objective="outside")).task_id
    (home / "config.yaml").write_text(f"repositories: [{workdir / 'allowed'}]\n")
    with ui_server(home, "--token-file", str(token_file)) as ui, signed_in(ui.url, token) as b:
        listed = b.client.get("/ui/api/tasks").json()
        assert [t["task_id"] for t in listed["tasks"]] == [kept]
        for path in (
            f"/ui/api/tasks/{hidden}",
            f"/ui/api/tasks/{hidden}/diff",
        ):
            assert b.client.get(path).status_code == 404, path
        assert b.client.get(f"/ui/api/tasks/{hidden}/stream").status_code == 404
        for verb in ACTIONS:
            refused = b.act(f"/ui/api/tasks/{hidden}/{verb}", {"message": "x"})
            assert refused.status_code == 404, verb
            assert refused.json()["error"].startswith(f"No task '{hidden}' in this store")
        # The live stream: an event on the hidden task, then one on the kept task; only the
        # kept one arrives.
        seen = []
        with b.client.stream("GET", "/ui/api/stream", params={"after": listed["cursor"]}) as s:
            bridge.store.add_event(hidden, "task.note", {"text": "outside"})
            bridge.store.add_event(kept, "task.note", {"text": "inside"})
            for line in s.iter_lines():
                seen.append(line)
                if line.startswith("data:") and kept in line:
                    break
        assert not any(hidden in line for line in seen), seen
    assert bridge.get_task(hidden).status == "created"  # no action reached it


def _refusal_lines(ui, words: str) -> int:
    return sum(1 for line in ui.log_text().splitlines() if words in line)


def test_refusals_and_failed_logins_are_logged_once_per_client_and_interval(ui, token):
    before = _refusal_lines(ui, "ui: refused a request")
    logins = _refusal_lines(ui, "ui: refused a login")
    with httpx2.Client(base_url=ui.url) as client:
        for _ in range(40):
            assert client.get("/ui/", headers={"host": "attacker.example"}).status_code == 421
        for _ in range(20):
            wrong = client.post("/ui/login", data={"token": "nope"}, headers={"origin": ui.url})
            assert wrong.status_code == 401
    assert _refusal_lines(ui, "ui: refused a request") - before <= 1
    assert _refusal_lines(ui, "ui: refused a login") - logins <= 1
    assert _refusal_lines(ui, "ui: refused a login") >= 1  # logged, just not one by one
    assert token not in ui.log_text()


def test_malformed_input_is_refused_in_a_sentence_never_a_traceback(ui, token, created):
    with signed_in(ui.url, token) as browser:
        deep = browser.client.post(
            f"/ui/api/tasks/{created}/follow-up",
            content=b"[" * 30000,
            headers={"origin": ui.url, "content-type": "application/json"},
        )
        assert (deep.status_code, deep.json()["error"]) == (409, "The request is not JSON.")
        huge = "9" * 30
        for path, headers in (
            (f"/ui/api/stream?after={huge}", {}),
            (f"/ui/api/tasks/{created}/stream?after={huge}", {}),
            ("/ui/api/stream", {"last-event-id": huge}),
            ("/ui/api/stream", {"last-event-id": "-" + huge}),
        ):
            with browser.client.stream("GET", path, headers=headers, timeout=10) as stream:
                assert stream.status_code == 200, path
                assert next(stream.iter_lines()) == "retry: 2000"
        # The stream loop reads after its clamped cursor a while: still no error logged.
        with browser.client.stream("GET", f"/ui/api/stream?after={huge}") as stream:
            lines = stream.iter_lines()
            assert next(lines) == "retry: 2000"
        assert browser.client.get("/ui/api/tasks").status_code == 200
    assert "Traceback" not in ui.log_text() and "OverflowError" not in ui.log_text()


def test_an_unknown_status_filter_is_a_bad_request(ui, token):
    with signed_in(ui.url, token) as browser:
        refused = browser.client.get("/ui/api/tasks", params={"status": "nonsense"})
        assert refused.status_code == 400 and "nonsense" in refused.json()["error"]
        assert browser.client.get("/ui/api/tasks", params={"status": "created"}).is_success


def test_a_job_accept_naming_no_task_is_refused_never_read_as_the_best(ui, token):
    with signed_in(ui.url, token) as browser:
        for chosen in ("", " ", 0, [], False):
            refused = browser.act("/ui/api/jobs/no-such-job/accept", {"task_id": chosen})
            assert refused.status_code == 409, chosen
            assert refused.json()["error"] == "'task_id' must name one of the job's tasks."
        assert browser.act("/ui/api/jobs/no-such-job/accept").status_code == 404  # no task_id


def test_one_client_holds_at_most_its_share_of_live_streams(ui, token, created):
    from contextlib import ExitStack

    from bridge.ui.sse import MAX_STREAMS_PER_CLIENT

    with signed_in(ui.url, token) as browser, ExitStack() as streams:
        held = []  # each stream's line reader, kept: a dropped reader closes its connection
        for _ in range(MAX_STREAMS_PER_CLIENT):
            stream = streams.enter_context(browser.client.stream("GET", "/ui/api/stream"))
            assert stream.status_code == 200
            held.append(stream.iter_lines())
            assert next(held[-1]) == "retry: 2000"
        refused = browser.client.get(f"/ui/api/tasks/{created}/stream")
        assert refused.status_code == 503
        assert f"{MAX_STREAMS_PER_CLIENT} live views" in refused.json()["error"]
    with signed_in(ui.url, token) as browser:  # closed streams are counted out
        with browser.client.stream("GET", "/ui/api/stream") as stream:
            assert stream.status_code == 200


def test_a_burst_of_stream_opens_gets_no_more_than_the_clients_share(ui, token):
    """Opened all at once, before any has sent a byte: each is counted when it is granted."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    from bridge.ui.sse import MAX_STREAMS_PER_CLIENT

    tries = MAX_STREAMS_PER_CLIENT * 2
    start = Barrier(tries)
    with signed_in(ui.url, token) as browser:
        cookies, key = dict(browser.client.cookies), browser.key

        def open_one(_: int) -> tuple[int, httpx2.Client, httpx2.Response]:
            client = httpx2.Client(base_url=ui.url, timeout=30, cookies=cookies)
            start.wait()
            request = client.build_request("GET", "/ui/api/stream", headers={"x-ui-key": key})
            return client, client.send(request, stream=True)

        with ThreadPoolExecutor(tries) as pool:
            opened = list(pool.map(open_one, range(tries)))
        try:
            codes = sorted(response.status_code for _, response in opened)
            assert codes.count(200) == MAX_STREAMS_PER_CLIENT, codes
            assert set(codes) == {200, 503}, codes
        finally:
            for client, response in opened:
                response.close()
                client.close()

        def granted() -> bool:
            with browser.client.stream("GET", "/ui/api/stream") as stream:
                return stream.status_code == 200

        poll(granted, "the closed streams to be counted out", 60)


def test_the_diff_comes_with_whether_it_was_cut_and_its_size(ui, token, created):
    with signed_in(ui.url, token) as browser:
        doc = browser.client.get(f"/ui/api/tasks/{created}/diff").json()
        assert doc == {"text": "", "truncated": False, "total_bytes": 0, "files": []}


def test_a_diff_over_the_cap_comes_cut_at_a_whole_file_and_says_so(ui, token, site):
    from bridge.ui.routes import MAX_DIFF_BYTES

    task_id, first, second = big_diff_task(site)
    assert len(first) < MAX_DIFF_BYTES < len(first + second)
    with signed_in(ui.url, token) as browser:
        doc = browser.client.get(f"/ui/api/tasks/{task_id}/diff").json()
    assert doc["truncated"] is True and doc["total_bytes"] == len(first + second)
    assert doc["text"].encode() == first  # the first file whole, none of the second
    assert doc["files"] == [{"path": "a.txt"}]  # the names of the files shown


def test_a_diff_over_the_limit_is_cut_at_the_last_whole_file_or_line(tmp_path):
    from types import SimpleNamespace

    from bridge.ui.views import diff_document

    first, second = file_diff("a.txt", 50), file_diff("b.txt", 50)
    path = tmp_path / "diff"
    path.write_bytes(first + second)
    result = SimpleNamespace(artifacts={"diff": str(path)})
    whole = diff_document(result, len(first + second))
    assert whole["truncated"] is False and whole["text"].encode() == first + second
    # The limit falls inside the second file's `diff --git` header: the first file alone.
    cut = diff_document(result, len(first) + 5)
    assert cut["truncated"] is True and cut["text"].encode() == first
    assert cut["total_bytes"] == len(first + second)
    # One file over the limit: whole lines only.
    path.write_bytes(first)
    one = diff_document(result, len(first) // 2)
    assert one["truncated"] is True and one["text"].endswith("\n")
    assert first.startswith(one["text"].encode()) and len(one["text"]) <= len(first) // 2


def test_cancelling_a_job_that_had_ended_is_refused_as_the_cli_refuses_it(ui, token, site):
    """`jobs cancel` of an ended job exits 1 with "already ended"; the page's cancel must not
    answer 200 as if it had cancelled something."""
    job_id = f"job-ended-{uuid.uuid4().hex[:8]}"
    made = new_job(job_id, repository=str(site.repo), config=site.bridge.config)
    site.bridge.store.jobs.insert(made, {})
    site.bridge.store.jobs.transition(job_id, JobStatus.FAILED, {JobStatus.CREATED})
    with signed_in(ui.url, token) as browser:
        refused = browser.act(f"/ui/api/jobs/{job_id}/cancel")
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"] == f"Job {job_id} already ended failed."
    assert site.bridge.job_status(job_id).status == "failed"
    cli = cli_runner(site.home)("jobs", "cancel", job_id)
    assert cli.code == 1 and f"job {job_id} already ended failed." in cli.stderr


def test_recursion_and_overflow_while_handling_are_a_400_in_one_sentence(bridge, repo):
    """Whatever input makes a parser recurse too deep or a number overflow, deeper in than the
    checks above reach: the request gets a 400 and one sentence, not a 500 with a traceback.
    The app in process, the verbs made to raise as such input would make them."""
    import asyncio

    from bridge.ui.app import build_app
    from bridge.ui.routes import UNREADABLE

    created = bridge.create_task(bare_spec(repo)).task_id
    sessions = Sessions("a-token-of-enough-length", 8770)
    app = build_app(bridge, sessions, host="127.0.0.1")

    def deep(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    def huge(*args, **kwargs):
        raise OverflowError("Python int too large to convert to SQLite INTEGER")

    bridge.get_task, bridge.follow_up, bridge.job_status = deep, huge, huge

    async def run() -> list[httpx2.Response]:
        origin = "http://127.0.0.1:8770"
        transport = httpx2.ASGITransport(app=app, client=("127.0.0.1", 5000))
        async with httpx2.AsyncClient(transport=transport, base_url=origin) as client:
            login = await client.post(
                "/ui/login", data={"token": "a-token-of-enough-length"}, headers={"origin": origin}
            )
            client.headers["x-ui-key"] = login.headers["location"].split("#k=")[1]
            return [
                await client.get(f"/ui/api/tasks/{created}"),
                await client.get(f"/ui/api/tasks/{created}/diff"),
                await client.get(f"/ui/api/tasks/{created}/stream"),
                await client.get("/ui/api/jobs/j1"),
                await client.post(
                    f"/ui/api/tasks/{created}/follow-up",
                    json={"message": "go on"},
                    headers={"origin": origin},
                ),
            ]

    for answer in asyncio.run(run()):
        assert (answer.status_code, answer.json()) == (400, {"error": UNREADABLE}), answer.text
