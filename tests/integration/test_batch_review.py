"""Batch mode under an adversarial review: the promises README's "Batch mode" section makes,
tried against providers and timings the happy path does not meet."""

from __future__ import annotations

from typing import Any

from examforge.batching import run_pass
from helpers import wait_for
from storage.models import BatchState
from test_batch_mode import (_custom_ids, _paid_batch_lines, _provider_batches, _rows, _setup,
                             _until_done, rt_of)  # noqa: F401  (rt_of: a fixture)


class _NoMetadata:
    """A provider (or gateway) that accepts a batch's metadata and never gives it back."""

    def __init__(self, api: Any) -> None:
        self._api = api

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def page(self, after: str | None = None, limit: int = 100) -> dict[str, Any]:
        page = self._api.page(after, limit)
        for batch in page.get("data") or []:
            batch["metadata"] = None
        return page

    def batches_since(self, since: float):
        # The real paging, over this page().
        return type(self._api).batches_since(self, since)


def test_a_provider_that_drops_metadata_never_gets_a_second_create(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    # The create makes the batch and its reply is lost; the listing cannot match metadata.
    mock_llm.configure(batch_create_lost=1)
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5)],
                             batch_submit_lease_s=2.0, batch_http_timeout_s=1.0)
    rt = rt_of(settings, store)
    rt.api = _NoMetadata(rt.api)
    run_pass(rt, ["bx"])
    (row,) = store.exam_batches("bx")
    assert row.state == BatchState.creating.value and row.provider_batch_id is None
    wait_for(lambda: (run_pass(rt, ["bx"]), store.exam_batches("bx")[0].provider_batch_id)[1],
             20, "the recovery to record a batch")
    (row,) = store.exam_batches("bx")
    assert row.create_attempts == 1  # adopted by its file, never created again
    batches = _provider_batches(mock_llm)
    assert [b["id"] for b in batches] == [row.provider_batch_id]
    _until_done(rt)
    calls, questions, _ = _rows(store)
    assert len(questions) == 5 and [c.outcome for c in calls] == ["used"]
    assert len(_paid_batch_lines(mock_llm)) == 1
