"""Recovery's listing over providers and gateways whose batch objects are not exactly
OpenAI's: an ISO 8601 `created_at` (Anthropic's shape, some gateways) or none at all. The
listing must neither crash the pass nor stop before the submission's own batch."""

from __future__ import annotations

import httpx

from examforge.batch_api import BatchAPI


def _api(make_settings, pages) -> BatchAPI:
    settings = make_settings(llm_base_url="https://gateway.example/v1", llm_api_key="k")

    def handler(request: httpx.Request) -> httpx.Response:
        after = request.url.params.get("after")
        return httpx.Response(200, json=pages[after])

    return BatchAPI(settings, transport=httpx.MockTransport(handler))


def test_iso_and_missing_created_at_neither_crash_nor_end_the_listing(make_settings):
    since = 1_700_000_000.0
    pages = {
        None: {"data": [{"id": "b3", "created_at": "2023-11-14T22:20:00Z"},
                        {"id": "b2"}],
               "has_more": True, "last_id": "b2"},
        "b2": {"data": [{"id": "b1", "created_at": since + 5},
                        {"id": "b0", "created_at": "2023-11-14T00:00:00+00:00"},
                        {"id": "old", "created_at": since - 10}],
               "has_more": True, "last_id": "old"},
    }
    api = _api(make_settings, pages)
    # 2023-11-14T22:20:00Z is 1_700_000_400; b2 has no time (kept: it may be ours);
    # 2023-11-14T00:00:00 is before `since`: the listing ends there, before "old".
    assert [b["id"] for b in api.batches_since(since)] == ["b3", "b2", "b1"]
