"""HEAD and OPTIONS on every route of the API, read from the app's routes (those of the
included routers too: review, /me, /audit), so that a new route cannot be missed.

- Every path answers OPTIONS with a 405 problem whose `Allow` lists exactly the methods its
  routes accept (RFC 9110: a 405 must carry Allow), HEAD wherever GET is.
- HEAD is routed wherever GET is (but on the event stream: its headers promise an endless
  body), and answers as the GET does, without a body."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from api_support import SYLLABUS, api

NO_HEAD = {"/runs/{run_id}/events"}
# A concrete URL for each path parameter; what the route answers to it does not matter here
# (an exam that does not exist is still routed: the 405 comes before any handler).
SAMPLE = {"{slug}": "demo", "{run_id}": "1", "{chapter_id}": "a", "{question_id}": "1",
          "{name:path}": "notes/ch1.md"}


def _methods_by_path(app: Any) -> dict[str, set[str]]:
    from producer.api.auth import api_routes

    found: dict[str, set[str]] = defaultdict(set)
    for route in api_routes(app):
        found[route.path] |= set(route.methods or ())
    return found


def _url(path: str) -> str:
    for name, value in SAMPLE.items():
        path = path.replace(name, value)
    assert "{" not in path, f"no sample value for a parameter of {path}: add it to SAMPLE"
    return path


def test_the_walk_finds_the_included_routers_routes(make_settings):
    with api(make_settings) as c:
        paths = _methods_by_path(c.app)
    # A walk that stops at `app.routes` sees none of these (each router is one entry there).
    assert {"/me", "/audit", "/exams/{slug}/review",
            "/exams/{slug}/questions/{question_id}/approve"} <= set(paths)
    assert len(paths) >= 18


def test_every_route_answers_options_with_405_and_allow(make_settings):
    with api(make_settings) as c:
        paths = _methods_by_path(c.app)
        wrong = {}
        for path, methods in sorted(paths.items()):
            r = c.options(_url(path))
            allow = sorted(m.strip() for m in r.headers.get("allow", "").split(",") if m.strip())
            if (r.status_code, allow) != (405, sorted(methods)) or \
                    r.headers.get("content-type") != "application/problem+json":
                wrong[path] = (r.status_code, r.headers.get("allow"), sorted(methods))
    assert not wrong, wrong


def test_head_is_routed_wherever_get_is(make_settings):
    with api(make_settings) as c:
        paths = _methods_by_path(c.app)
    missing = sorted(p for p, m in paths.items()
                     if "GET" in m and "HEAD" not in m and p not in NO_HEAD)
    assert not missing, f"GET routes without HEAD: {missing}"
    assert all("HEAD" not in paths[p] for p in NO_HEAD)


def test_head_answers_as_get_without_a_body(make_settings):
    with api(make_settings) as c:
        c.put("/exams/demo", json=SYLLABUS)
        paths = _methods_by_path(c.app)
        for path, methods in sorted(paths.items()):
            if "HEAD" not in methods:
                continue
            url = _url(path)
            got, head = c.get(url), c.head(url)
            assert head.status_code == got.status_code, (path, head.status_code, got.text)
            assert head.content == b"", path
            assert head.headers.get("content-type") == got.headers.get("content-type"), path
