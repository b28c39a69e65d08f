"""Every setting says which process reads it (examforge/settings_readers.py), and the docs'
settings reference is generated from the model and that map."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from examforge.settings import Settings
from examforge.settings_readers import PROCESSES, READ_BY, RECORDED_ON_EXAM


HOOK = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "reference.py"


def _hook():
    """The MkDocs hook that generates the reference (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("docs_reference_hook", HOOK)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_setting_has_its_readers():
    missing = sorted(set(Settings.model_fields) - set(READ_BY))
    assert not missing, f"add these Settings fields to READ_BY: {missing}"


def test_every_entry_names_a_setting():
    unknown = sorted(set(READ_BY) - set(Settings.model_fields))
    assert not unknown, f"READ_BY names fields Settings does not have: {unknown}"


def test_readers_are_known_processes_and_not_empty():
    for name, readers in READ_BY.items():
        assert readers, name
        assert set(readers) <= set(PROCESSES), (name, readers)
        assert len(set(readers)) == len(readers), name


def test_what_the_exam_records_is_read_at_enqueue():
    assert RECORDED_ON_EXAM <= set(Settings.model_fields)
    for name in RECORDED_ON_EXAM:
        assert "enqueue" in READ_BY[name], name


def test_the_generated_table_has_a_row_per_setting():
    table = _hook().settings_table()
    for name in Settings.model_fields:
        assert f"`{name.upper()}`" in table, name
