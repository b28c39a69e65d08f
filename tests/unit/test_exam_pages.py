"""`exams` and GET /exams a keyset page at a time (issue 19): the pages together list every
exam once, newest first; `next` is the cursor of the page after; a cursor no page gave is one
line on the CLI (exit 2) and a 422 from the API; syllabi never run come on the last page.
SQLite, in this process; the same pages on PostgreSQL are in test_history_scale."""

from __future__ import annotations

import json
from typing import Any

from api_support import SYLLABUS, api
from test_cli_first_run import cli, env  # noqa: F401  (the fixture)

from bench.history import build
from storage import open_store


def _history(url: str, exams: int = 5, active: int = 2) -> list[str]:
    """Exams built with SQL; their slugs newest first."""
    store = open_store(url)
    build(store.engine, exams, active)
    slugs = [e.exam for e in store.exams()]
    store.engine.dispose()
    return slugs


def test_the_cli_pages_through_every_exam(env, capsys):  # noqa: F811
    slugs = _history(env["DATABASE_URL"])
    assert slugs[:2] == ["hist-active-000001", "hist-active-000000"]
    seen: list[str] = []
    after: list[str] = []
    while True:
        code, out, err = cli(capsys, "exams", "--json", "--limit", "3", *after)
        assert code == 0, err
        page = json.loads(out)
        seen += [e["exam"] for e in page["items"]]
        if page["next"] is None:
            break
        after = ["--after", page["next"]]
    assert seen == slugs
    code, out, _ = cli(capsys, "exams", "--json", "--all")
    assert [e["exam"] for e in json.loads(out)["items"]] == slugs
    # The table says where the next page is.
    code, out, _ = cli(capsys, "exams", "--limit", "2")
    assert code == 0 and "2 exams" in out and "--after " in out
    code, _, err = cli(capsys, "exams", "--after", "nonsense")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "after" in err


def test_get_exams_pages_and_lists_new_syllabi_on_the_last_page(make_settings):
    settings = make_settings()
    slugs = _history(settings.database_url, 3, 1)
    with api(make_settings) as c:
        assert c.put("/exams/zz-new", json=SYLLABUS).status_code == 201
        whole = c.get("/exams").json()  # a client that ignores paging: one page of all
        assert whole["next"] is None
        assert [e["exam"] for e in whole["items"]] == [*slugs, "zz-new"]
        seen: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": 3}
        while True:
            r = c.get("/exams", params=params)
            assert r.status_code == 200, r.text
            page = r.json()
            seen += page["items"]
            if page["next"] is None:
                break
            assert "zz-new" not in {e["exam"] for e in page["items"]}
            params["after"] = page["next"]
        assert [e["exam"] for e in seen] == [*slugs, "zz-new"]
        assert seen[-1]["state"] == "new" and seen[0]["source"] == "api"
        done = next(e for e in seen if e["exam"] == "hist-done-000000")
        assert (done["state"], done["chapters"], done["questions"]) == (
            "done", {"done": 10, "total": 10}, {"done": 1000, "target": 1000})
        r = c.get("/exams", params={"after": "nonsense"})
        assert r.status_code == 422 and "after" in r.json()["detail"]
        assert c.get("/exams", params={"limit": 0}).status_code == 422
