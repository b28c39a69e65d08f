"""The blind solve's catch rates on the mock (bench/verify.py, the bench's `verify` part) at
a small size: the issue's targets (at least 95 % of wrong keys caught, at most 2 % of right
keys disputed at a solver error rate of 1 %), and replace leaves no wrong key in the count
at the cost of the solves and the replacements."""

from __future__ import annotations

import pytest

from bench.verify import measure


@pytest.mark.slow
def test_the_blind_solve_catches_wrong_keys_at_the_issues_targets(tmp_path):
    m = measure(tmp_path, questions=300, wrong_key_rate=0.1, solver_error_rate=0.01)
    flag, replace, off = m["runs"]["flag"], m["runs"]["replace"], m["runs"]["off"]
    assert flag["wrong_keys"] > 15 and flag["right_keys"] > 200
    assert m["caught"] >= 0.95 and m["falsely_disputed"] <= 0.02
    assert m["replace_wrong_keys_left"] == 0 and m["replace_withdrawn"] >= flag["wrong_keys"]
    # Every generation call has its solve; the solves and the replacements cost extra.
    assert flag["solve_calls"] == flag["generation_calls"] and off["solve_calls"] == 0
    assert replace["generation_calls"] > flag["generation_calls"]
    assert 0 < m["extra_cost_per_question_flag"] < m["extra_cost_per_question_replace"]
