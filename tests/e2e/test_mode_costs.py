"""Issue 18: the same exam costs less per question in flex and in batch mode than
synchronously, and in every mode the ledger books exactly what the mock's usage log bills.
A small version of the bench part `modes` (bench/modes.py): real `producer run` processes."""

from __future__ import annotations

import pytest

from bench.modes import MODES, Spec, run_mode

pytestmark = pytest.mark.e2e


def test_every_mode_books_the_mocks_bill_and_flex_and_batch_cost_less_per_question(
        db_url, tmp_path):
    # Two chapters, one of two calls (QUESTIONS_PER_CALL=10); rewordings on, so that the
    # near-duplicate check and batch mode's top-up rounds are exercised.
    spec = Spec([5, 15], timeout_s=120, budget_usd=10.0)
    db = db_url.split(":")[0]
    results = {mode: run_mode(mode, spec, tmp_path, db_url, db, slug=f"modes-{mode}")
               for mode in MODES}
    for mode, r in results.items():
        assert r.error is None, (mode, r.error)
        assert r.questions_stored == 20 and r.chapters_done == 2, (mode, r)
        assert r.calls_paid > 0 and r.bill_usd > 0
        # Booked cost equals the mock's bill, priced the same way (discounts included).
        assert abs(r.booked_usd - r.bill_usd) < 1e-6, (mode, r.booked_usd, r.bill_usd)
        assert r.spent_usd == pytest.approx(r.booked_usd, abs=1e-9)
        assert r.ledger_tokens == (r.prompt_tokens, r.cached_tokens, r.completion_tokens)
    assert results["batch"].batch_lines == results["batch"].calls_paid  # nothing sent sync
    assert results["batch"].batches >= 1
    assert results["flex"].tiers == {"flex": results["flex"].calls_booked}
    assert results["sync"].batch_lines == results["flex"].batch_lines == 0
    sync = results["sync"].cost_per_question
    assert results["flex"].cost_per_question < sync
    assert results["batch"].cost_per_question < sync
