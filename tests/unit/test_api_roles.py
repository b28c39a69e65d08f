"""The role matrix (issue 30): every route of the app, read from `app.routes` so that a new
route cannot be missed, against every kind of caller (reader, reviewer, operator, admin,
each scoped to one exam and not, a token of API_TOKENS, a revoked token, no token), on an
exam in the scoped tokens' scope and one out of it.

The expected answers come from this file's own table (ROLE), written from the issue's role
table, never from the code's declarations: a route that the code opens to a lower role, or
closes to a higher one, fails here. A route missing from the table fails too."""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest
from api_support import AUTH, SYLLABUS, api, wait_run

from producer.access import new_token, token_hash

READER, REVIEWER, OPERATOR, ADMIN = "reader", "reviewer", "operator", "admin"
RANK = [READER, REVIEWER, OPERATOR, ADMIN]
PUBLIC = "public"

# The role each route needs, by the table: reader reads exams, questions, runs,
# exports and metrics; reviewer approves, rejects and edits; operator puts syllabi and
# sources, starts and cancels runs (and sets budgets, a run's body); admin reads the audit.
# A HEAD route needs what its GET needs.
ROLE: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/metrics"): READER,
    ("GET", "/me"): READER,
    ("GET", "/audit"): ADMIN,
    ("GET", "/exams"): READER,
    ("GET", "/exams/{slug}"): READER,
    ("PUT", "/exams/{slug}"): OPERATOR,
    ("GET", "/exams/{slug}/sources"): READER,
    ("PUT", "/exams/{slug}/sources/{name:path}"): OPERATOR,
    ("DELETE", "/exams/{slug}/sources/{name:path}"): OPERATOR,
    ("POST", "/exams/{slug}/runs"): OPERATOR,
    ("GET", "/exams/{slug}/runs"): READER,
    ("GET", "/runs/{run_id}"): READER,
    ("POST", "/runs/{run_id}/cancel"): OPERATOR,
    ("GET", "/runs/{run_id}/events"): READER,
    ("GET", "/exams/{slug}/questions"): READER,
    ("GET", "/exams/{slug}/export"): READER,
    ("GET", "/exams/{slug}/review"): READER,
    ("GET", "/exams/{slug}/chapters/{chapter_id}/questions"): READER,
    ("GET", "/exams/{slug}/questions/{question_id}"): READER,
    ("GET", "/exams/{slug}/questions/{question_id}/history"): READER,
    ("POST", "/exams/{slug}/questions/{question_id}/approve"): REVIEWER,
    ("POST", "/exams/{slug}/questions/{question_id}/reject"): REVIEWER,
    ("PATCH", "/exams/{slug}/questions/{question_id}"): REVIEWER,
    ("POST", "/exams/{slug}/review/approve"): REVIEWER,
}
# Routes whose answer covers every exam: a token scoped to some exams is refused (403).
EVERY_EXAM = {("GET", "/metrics")}

IN, OUT = "demo", "other"  # the scoped tokens see IN only
# name -> (role, exams); None role: not a valid token
CALLERS: dict[str, tuple[str | None, list[str] | None]] = {
    "reader": (READER, None), "reviewer": (REVIEWER, None), "operator": (OPERATOR, None),
    "admin": (ADMIN, None), "reader-demo": (READER, [IN]), "reviewer-demo": (REVIEWER, [IN]),
    "operator-demo": (OPERATOR, [IN]), "api-tokens": (ADMIN, None), "revoked": (None, None),
    "none": (None, None)}


def app_routes(app: Any) -> set[tuple[str, str]]:
    """Every (method, path) the app routes, HEAD included, but FastAPI's own (the spec,
    /docs) and the page's static files. Checked against the spec too
    (test_every_route_is_in_the_role_table), so that a route this walk missed fails."""
    from producer.api.auth import api_routes

    return {(method, route.path) for route in api_routes(app) for method in route.methods}


def expected(caller: str, method: str, path: str, exam: str) -> int:
    """The status class (2, or 401, 403, 404) the role table gives."""
    key = ("GET" if method == "HEAD" else method, path)
    needed = ROLE[key]
    if needed == PUBLIC:
        return 2
    role, exams = CALLERS[caller]
    if role is None:
        return 401
    has_exam = "{slug}" in path or "{run_id}" in path
    if has_exam and exams is not None and exam not in exams:
        return 404
    if RANK.index(role) < RANK.index(needed):
        return 403
    if key in EVERY_EXAM and exams is not None:
        return 403
    return 2


def _q(admin: Any, exam: str, n: int) -> dict[str, Any]:
    items = admin.get(f"/exams/{exam}/chapters/a/questions").json()["items"]
    return next(q for q in items if q["number"] == n and q["withdrawn"] is None)


class Builders:
    """Each route's request, made so that it succeeds for a caller allowed to send it (setup
    done with the admin client): (url, request kwargs)."""

    def __init__(self, admin: Any, runs: dict[str, int], cancelled: dict[str, int]) -> None:
        self.admin, self.runs, self.cancelled = admin, runs, cancelled
        self.n = 0
        self.ids: dict[tuple[str, int], int] = {}

    def key(self) -> str:
        self.n += 1
        return f"k{self.n}"

    def build(self, method: str, path: str, exam: str) -> tuple[str, dict[str, Any]]:
        kw: dict[str, Any] = {}
        url = path.replace("{slug}", exam).replace("{chapter_id}", "a")
        url = url.replace("{name:path}", "notes.md")
        if "{run_id}" in url:
            run = self.cancelled[exam] if url.endswith("/cancel") else self.runs[exam]
            url = url.replace("{run_id}", str(run))
        if "{question_id}" in url:
            n = {"approve": 1, "reject": 3}.get(url.rsplit("/", 1)[-1], 2)
            if (exam, n) not in self.ids:  # the same question each time: once rejected,
                self.ids[(exam, n)] = _q(self.admin, exam, n)["id"]  # it has no number
            q = self.admin.get(f"/exams/{exam}/questions/{self.ids[(exam, n)]}").json()
            url = url.replace("{question_id}", str(q["id"]))
            kw["headers"] = {"If-Match": f'"{q["version"]}"'}
            if method == "PATCH":
                kw["json"] = {"explanation": f"Edited {self.key()}."}
        if method == "PUT" and "/sources/" in url:
            kw["content"] = b"# Notes\n\nSome notes on the chapter.\n"
        elif method == "PUT":
            kw["json"] = SYLLABUS
        if method == "DELETE":
            self.admin.put(url, content=b"# Notes\n\nTo delete.\n")
        if method == "POST" and url.endswith("/runs"):
            kw["headers"] = {"Idempotency-Key": self.key()}
            kw["json"] = {}
        if url.endswith("/review/approve"):  # the bulk approve of question 4, at its version
            if (exam, 4) not in self.ids:
                self.ids[(exam, 4)] = _q(self.admin, exam, 4)["id"]
            q = self.admin.get(f"/exams/{exam}/questions/{self.ids[(exam, 4)]}").json()
            kw["json"] = {"items": [{"id": q["id"], "version": q["version"]}]}
        if url.endswith("/events"):
            kw["headers"] = {"Last-Event-ID": "1-done"}  # 204 at once: no stream held open
        if url.endswith("/export"):
            url += "?format=jsonl"
        return url, kw


@pytest.fixture
def world(make_settings, mock_llm):
    """Two exams generated (IN and OUT), a done run and a cancelled run of each, and a token
    of each kind; yields (client, tokens by caller, builders)."""
    with api(make_settings, mock_llm) as c:
        store = c.app.state.ctx.store
        runs, cancelled = {}, {}
        for exam in (IN, OUT):
            assert c.put(f"/exams/{exam}", json=SYLLABUS).status_code == 201
            run = c.post(f"/exams/{exam}/runs", headers={"Idempotency-Key": exam}).json()
            assert wait_run(c, run["id"])["state"] == "done"
            runs[exam] = run["id"]
            extra, _ = store.create_run(exam, f"{exam}-x", "f", None, "someone")
            store.cancel_run(extra)
            cancelled[exam] = extra.id
        tokens: dict[str, str] = {"api-tokens": AUTH["Authorization"].split()[1],
                                  "none": ""}
        for name, (role, exams) in CALLERS.items():
            if name in tokens:
                continue
            secret = new_token()
            store.add_token(name, role or READER, exams, token_hash(secret), "test")
            tokens[name] = secret
        store.revoke_token("revoked")
        yield c, tokens, Builders(c, runs, cancelled)


def test_every_route_is_in_the_role_table(make_settings):
    with api(make_settings) as c:
        routes = app_routes(c.app)
        spec = c.get("/openapi.json").json()
    missing = {(m, p) for m, p in routes if ("GET" if m == "HEAD" else m, p) not in ROLE}
    assert not missing, f"routes with no row in ROLE (decide their role): {sorted(missing)}"
    assert {(m, p) for m, p in ROLE} <= routes, "ROLE names a route the app does not have"
    in_spec = {(m.upper(), p.replace("{name}", "{name:path}"))
               for p, ops in spec["paths"].items() for m in ops}
    assert in_spec <= routes, f"routes the walk missed: {sorted(in_spec - routes)}"


def test_the_role_matrix(world):
    c, tokens, builders = world
    wrong = []
    calls = 0
    for method, path in sorted(app_routes(c.app)):
        exams = [IN, OUT] if "{slug}" in path or "{run_id}" in path else [IN]
        for exam in exams:
            for caller, secret in tokens.items():
                want = expected(caller, method, path, exam)
                url, kw = builders.build(method, path, exam)
                headers = {**kw.pop("headers", {}),
                           "Authorization": f"Bearer {secret}" if secret else ""}
                r = c.request(method, url, headers=headers, **kw)
                calls += 1
                got = 2 if 200 <= r.status_code < 300 else r.status_code
                if got != want:
                    wrong.append(f"{caller:>13} {method} {url}: {r.status_code}, expected "
                                 f"{'2xx' if want == 2 else want}: {r.text[:160]}")
                if want == 403 and got == 403 and method != "HEAD":
                    body = r.json()
                    assert r.headers["content-type"] == "application/problem+json"
                    assert body["required_role"] == ROLE[("GET" if method == "HEAD"
                                                          else method, path)]
                    assert body["required_role"] in body["detail"]
    assert not wrong, f"{len(wrong)} of {calls} calls:\n" + "\n".join(wrong)
    assert calls > 400


def test_a_scoped_token_sees_its_exams_only_and_others_read_as_missing(world):
    c, tokens, builders = world
    scoped = {"Authorization": f"Bearer {tokens['reader-demo']}"}
    listed = [e["exam"] for e in c.get("/exams", headers=scoped).json()["items"]]
    assert listed == [IN]
    assert {e["exam"] for e in c.get("/exams").json()["items"]} == {IN, OUT}
    # An exam out of scope reads exactly as one that does not exist; a run likewise.
    for real, missing in (("/exams/other", "/exams/nosuch"),
                          ("/exams/other/questions", "/exams/nosuch/questions"),
                          (f"/runs/{builders.runs[OUT]}", "/runs/999999")):
        a, b = c.get(real, headers=scoped), c.get(missing, headers=scoped)
        assert a.status_code == b.status_code == 404
        assert a.json()["detail"].replace("other", "X").replace(
            str(builders.runs[OUT]), "N") == b.json()["detail"].replace(
            "nosuch", "X").replace("999999", "N")
    assert c.get("/me", headers=scoped).json() == {"name": "reader-demo", "role": "reader",
                                                   "exams": [IN]}
    assert c.get("/me").json()["role"] == "admin" and c.get("/me").json()["exams"] is None


def test_names_not_hashes_in_the_history_and_runs(world):
    c, tokens, builders = world
    who = {"Authorization": f"Bearer {tokens['reviewer-demo']}"}
    q = _q(c, IN, 1)
    r = c.post(f"/exams/{IN}/questions/{q['id']}/approve", headers={
        **who, "If-Match": f'"{q["version"]}"'})
    assert r.status_code == 200 and r.json()["reviewed_by"] == "reviewer-demo"
    history = c.get(f"/exams/{IN}/questions/{q['id']}/history").json()["items"]
    assert history[-1]["client"] == "reviewer-demo"
    run = c.post(f"/exams/{IN}/runs", json={}, headers={
        "Authorization": f"Bearer {tokens['operator-demo']}", "Idempotency-Key": "named"})
    assert run.status_code == 202 and run.json()["started_by"] == "operator-demo"
    assert c.get(f"/runs/{run.json()['id']}").json()["started_by"] == "operator-demo"


def test_a_revoked_token_is_refused_at_its_next_request(make_settings):
    """No cache: the database is read on each request (`revoke` on any replica holds)."""
    with api(make_settings) as c:
        store = c.app.state.ctx.store
        secret = new_token()
        store.add_token("soon-gone", READER, None, token_hash(secret), "test")
        auth = {"Authorization": f"Bearer {secret}"}
        assert c.get("/exams", headers=auth).status_code == 200
        store.revoke_token("soon-gone")
        r = c.get("/exams", headers=auth)
        assert r.status_code == 401 and "soon-gone" not in r.text
        # Issued again under the same name: a new secret; the old one stays refused.
        again = new_token()
        store.add_token("soon-gone", READER, None, token_hash(again), "test")
        assert c.get("/exams", headers={"Authorization": f"Bearer {again}"}).status_code == 200
        assert c.get("/exams", headers=auth).status_code == 401


def test_the_spec_declares_the_scheme_and_each_operations_role_and_errors(make_settings):
    with api(make_settings) as c:
        spec = c.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer",
        "description": spec["components"]["securitySchemes"]["bearer"]["description"]}
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            needed = ROLE[(method.upper(), path if path in {p for _, p in ROLE} else
                           path.replace("{name}", "{name:path}"))]
            if needed == PUBLIC:
                assert op["security"] == []
                continue
            assert op["security"] == [{"bearer": []}], (method, path)
            assert op["x-required-role"] == needed, (method, path)
            assert {"401", "403"} <= set(op["responses"]), (method, path)
            if "{slug}" in path or "{run_id}" in path:
                assert "404" in op["responses"], (method, path)
            assert op["responses"]["403"]["content"]["application/problem+json"]


def test_no_token_anywhere_refuses_every_request(make_settings):
    """Without API_TOKENS and without a named token, the app is closed, not open."""
    with api(make_settings, api_tokens="") as c:
        r = c.get("/exams", headers={"Authorization": ""})
        assert r.status_code == 401
        assert c.get("/healthz", headers={"Authorization": ""}).status_code == 200


def test_the_audit_reads_in_keyset_pages_for_admins_only(world):
    c, tokens, builders = world
    # The fixture's two runs and syllabi: four rows at least, newest first.
    page = c.get("/audit", params={"limit": 2}).json()
    assert len(page["items"]) == 2 and page["next"]
    rest = c.get("/audit", params={"limit": 1000, "after": page["next"]}).json()
    ids = [r["id"] for r in page["items"] + rest["items"]]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids)
    assert rest["next"] is None
    only = c.get("/audit", params={"exam": OUT}).json()["items"]
    assert only and {r["exam"] for r in only} == {OUT}
    assert c.get("/audit", params={"after": "nonsense"}).status_code == 422
    assert c.get("/audit", params={"since": "1d"}).json()["items"]
    assert not c.get("/audit", params={"since": "2999-01-01T00:00Z"}).json()["items"]
    r = c.get("/audit", headers={"Authorization": f"Bearer {tokens['operator']}"})
    assert r.status_code == 403 and r.json()["required_role"] == "admin"
    json.dumps(page)  # plain JSON


def test_a_change_beyond_the_role_is_audited_and_a_refused_read_is_not(world):
    c, tokens, builders = world
    before = {i["id"] for i in c.get("/audit", params={"limit": 1000}).json()["items"]}
    reviewer = {"Authorization": f"Bearer {tokens['reviewer-demo']}"}
    r = c.post(f"/exams/{IN}/runs", json={},
               headers={**reviewer, "Idempotency-Key": builders.key()})
    assert r.status_code == 403
    reader = {"Authorization": f"Bearer {tokens['reader']}"}
    assert c.get("/audit", headers=reader).status_code == 403  # a read: not audited
    new = [i for i in c.get("/audit", params={"limit": 1000}).json()["items"]
           if i["id"] not in before]
    assert [(i["actor"], i["action"], i["exam"], i["outcome"]) for i in new] == [
        ("reviewer-demo", "access.denied", IN, "refused")]
    assert new[0]["details"] == {"method": "POST", "route": "/exams/{slug}/runs",
                                 "required_role": "operator"}
