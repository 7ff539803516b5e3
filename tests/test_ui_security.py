"""The web view refuses what a hostile page or client would try: an action without the session
cookie or with a wrong CSRF token, a request for another Host (DNS rebinding) or from another
Origin, a token kept in the URL, a session cookie that is the token; and it shows nothing of a
task outside `repositories` (list, page, stream, actions). Through `worker-bridge ui` as a
subprocess and plain HTTP; the browser tests are in test_ui_browser.py."""

from __future__ import annotations

import argparse
import json
import uuid

import httpx2
import pytest
from support.mcp_http_server import http_server
from support.repos import calc_repo
from support.scratch import TEST_ROOT
from support.tasks import bare_spec
from support.ui import shared_site, signed_in, ui_server

from bridge.errors import ConfigError
from bridge.ui.security import HostPolicy
from bridge.ui.serve import ui_options

ACTIONS = ("accept", "reject", "cancel", "follow-up", "answer")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """One `worker-bridge ui` for the module's tests that need no state of their own."""
    base = TEST_ROOT or tmp_path_factory.getbasetemp()
    with shared_site(base / f"wb-ui-{uuid.uuid4().hex[:10]}") as running:
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


def test_signing_in_exchanges_the_token_for_a_session_cookie_that_is_not_the_token(ui, token):
    with httpx2.Client(base_url=ui.url) as client:
        answer = client.get("/ui/login", params={"token": token})
        assert answer.status_code == 303
        assert answer.headers["location"] == "/ui/"  # the token does not stay in the URL
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
        value = cookie.split(";")[0].split("=", 1)[1]
        assert value and token not in cookie and value != token
        page = client.get("/ui/")
        assert page.status_code == 200 and token not in page.text
        session = client.get("/ui/api/session").json()
        assert session["csrf"] and token not in json.dumps(session)


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


def test_an_action_without_the_cookie_or_with_a_wrong_csrf_token_is_refused(
    ui, token, created, site
):
    bridge = site.bridge
    with signed_in(ui.url, token) as browser:
        with httpx2.Client(base_url=ui.url) as stranger:  # no cookie, even with the CSRF token
            for verb in ACTIONS:
                refused = stranger.post(
                    f"/ui/api/tasks/{created}/{verb}",
                    json={},
                    headers={"origin": ui.url, "x-csrf-token": browser.csrf},
                )
                assert refused.status_code == 401, verb
        for verb in ACTIONS:
            path = f"/ui/api/tasks/{created}/{verb}"
            assert browser.act(path, **{"x-csrf-token": browser.csrf[:-1] + "A"}).status_code == 403
            assert browser.client.post(path, json={}, headers={"origin": ui.url}).status_code == 403
            # the right token from another origin, or with no Origin at all
            assert browser.act(path, origin="http://evil.example").status_code == 403
            no_origin = {"x-csrf-token": browser.csrf}
            assert browser.client.post(path, json={}, headers=no_origin).status_code == 403
        assert browser.client.post("/ui/api/jobs/x/cancel", json={}).status_code == 403
        assert bridge.get_task(created).status == "created"  # none of it did anything
        done = browser.act(f"/ui/api/tasks/{created}/cancel")  # the page's own request works
        assert done.status_code == 200, done.text
        assert bridge.get_task(created).status == "cancelled"


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
            refused = browser.client.post(
                path, json=body, headers={"origin": ui.url, "x-csrf-token": browser.csrf}
            )
            assert (refused.status_code, refused.json()["error"]) == (409, message)


def test_the_mcp_http_listener_serves_the_same_pages_behind_the_same_token(
    home, token_file, bridge, repo
):
    token = token_file.read_text().strip()
    created = bridge.create_task(bare_spec(repo)).task_id
    with http_server(home, "--token-file", str(token_file)) as mcp:
        with httpx2.Client(base_url=mcp.url) as client:
            bearer = {"authorization": f"Bearer {token}"}
            assert client.get("/ui/api/tasks", headers=bearer).status_code == 401  # a session
            assert client.get("/ui/login", params={"token": "wrong-token-1234"}).status_code == 401
        with signed_in(mcp.url, token) as browser:
            listed = browser.client.get("/ui/api/tasks").json()["tasks"]
            assert [t["task_id"] for t in listed] == [created]
            assert browser.client.get("/ui/", headers={"host": "evil.example"}).status_code == 421
            # The cookie is no bearer token: /mcp still wants the header.
            assert browser.client.post("/mcp", json={}).status_code == 401
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


def test_without_a_token_a_session_is_handed_out_but_actions_still_need_its_csrf(
    home, bridge, repo
):
    created = bridge.create_task(bare_spec(repo)).task_id
    with ui_server(home, "--no-token") as ui, httpx2.Client(base_url=ui.url) as client:
        assert client.get("/ui/").status_code == 200  # a session made on the spot
        csrf = client.get("/ui/api/session").json()["csrf"]
        path = f"/ui/api/tasks/{created}/cancel"
        assert client.post(path, json={}, headers={"origin": ui.url}).status_code == 403
        with httpx2.Client(base_url=ui.url) as other:  # another client: no cookie
            sent = {"origin": ui.url, "x-csrf-token": csrf}
            assert other.post(path, json={}, headers=sent).status_code == 401
        sent = {"origin": ui.url, "x-csrf-token": csrf}
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
            f"/ui/tasks/{hidden}",
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
