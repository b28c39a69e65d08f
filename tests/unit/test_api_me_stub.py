"""GET /me, the stub of issue 30's named tokens: every token of API_TOKENS is an admin of
every exam, and a request without one is refused like any other."""

from __future__ import annotations

from api_support import api


def test_every_token_is_an_admin_of_every_exam(make_settings):
    with api(make_settings) as c:
        assert c.get("/me").json() == {"name": "api-token", "role": "admin", "exams": None}
        assert c.get("/me", headers={"Authorization": "Bearer wrong"}).status_code == 401
