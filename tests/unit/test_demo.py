"""demo.sh's control flow, with a stand-in for .venv/bin/python that records what it is asked to
run: the options, and what a rerun says about the demo-run/ it reuses (issue 10)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Records each call; asks REAL_PYTHON (when set) whether .venv holds the lock, else says it
# does not; plays the mock and the worker as a process the demo's cleanup kills, and
# `run` and `export` as the files they leave behind.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/../../calls.log"
case "$*" in
  "-I -") [ -n "${REAL_PYTHON:-}" ] && exec "$REAL_PYTHON" "$@"; exit 1 ;;
  *mock-llm*) echo "mock-llm listening on http://127.0.0.1:8089/v1"; exec sleep 60 ;;
  *"-m celery"*) exec sleep 60 ;;
  *"producer run"*) touch demo-run/examforge.db ;;
  *"producer export"*) mkdir -p "exams/$4"
                       echo '{"question": "Q?"}' > "exams/$4/generated.jsonl" ;;
esac
"""


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "demo.sh", tmp_path / "demo.sh")
    # What the install stamp hashes (stand-ins: the stamp compares, it does not parse).
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'examforge'\n")
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "lock.txt").write_text("click==8.5.1\n")
    fake = tmp_path / ".venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    return tmp_path


def run(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "HOME": str(folder)}
    return subprocess.run(["bash", str(folder / "demo.sh"), *args], cwd=folder,
                          env={**base, **env}, capture_output=True, text=True, timeout=60)


def calls(folder: Path) -> str:
    log = folder / "calls.log"
    return log.read_text() if log.exists() else ""


def test_demo_sh_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "demo.sh")]).returncode == 0


def test_help_lists_the_options_and_installs_nothing(demo):
    result = run(demo, "--help")
    assert result.returncode == 0, result.stderr
    assert "--local" in result.stdout and "--fresh" in result.stdout
    assert calls(demo) == ""


def test_an_unknown_option_is_one_line_and_exit_2(demo):
    result = run(demo, "--lcoal")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "demo.sh: unknown option '--lcoal' (see ./demo.sh --help)"]
    assert calls(demo) == ""


def test_a_rerun_says_it_reuses_demo_run_and_fresh_starts_over(demo):
    first = run(demo, "--local")
    assert first.returncode == 0, first.stderr
    assert "reusing" not in first.stdout + first.stderr
    # The last line is the exact command to look again, with the venv's python (a plain
    # `python` outside .venv fails with "No module named 'rich'").
    assert first.stdout.strip().splitlines()[-1] == (
        f"demo.sh: done; to look at it again: DATABASE_URL=sqlite:///{demo}/demo-run/"
        "examforge.db .venv/bin/python -m producer status cloud-practitioner")
    assert "producer run cloud-practitioner" in calls(demo)

    second = run(demo)  # the workers' mode, on what --local left
    assert second.returncode == 0, second.stderr
    assert "reusing demo-run/examforge.db" in second.stdout and "--fresh" in second.stdout
    assert "-m celery -A tasks worker -P threads -c 16 -l info" in calls(demo)

    (demo / "demo-run" / "stale").write_text("x")
    fresh = run(demo, "--local", "--fresh")
    assert fresh.returncode == 0, fresh.stderr
    assert "removed demo-run/" in fresh.stdout and "reusing" not in fresh.stdout
    assert not (demo / "demo-run" / "stale").exists()


def test_fresh_refuses_to_touch_a_database_it_does_not_own(demo):
    (demo / "demo-run").mkdir()
    (demo / "demo-run" / "examforge.db").write_text("kept")
    result = run(demo, "--fresh", DATABASE_URL="postgresql://postgres@127.0.0.1/demo")
    assert result.returncode == 2 and "DATABASE_URL is set" in result.stderr
    assert (demo / "demo-run" / "examforge.db").read_text() == "kept"
    assert calls(demo) == ""


INSTALL = "-m pip install -c requirements/lock.txt -e .[dev]"


def test_the_install_goes_through_the_lock_shows_progress_and_a_rerun_skips_it(demo):
    first = run(demo, "--local")
    assert first.returncode == 0, first.stderr
    assert calls(demo).count(INSTALL) == 1
    assert " -q" not in calls(demo)  # pip's own progress is shown, not silenced
    assert "installing examforge into .venv, pinned by requirements/lock.txt" in first.stdout
    assert "install skipped" not in first.stdout

    second = run(demo, "--local")  # nothing changed: no install, and it says so
    assert second.returncode == 0, second.stderr
    assert calls(demo).count(INSTALL) == 1
    assert "demo.sh: .venv is up to date (pyproject.toml and requirements/lock.txt " \
        "unchanged since its install): install skipped" in second.stdout

    (demo / "requirements" / "lock.txt").write_text("click==8.5.2\n")  # a new lock
    third = run(demo, "--local")
    assert third.returncode == 0, third.stderr
    assert calls(demo).count(INSTALL) == 2 and "install skipped" not in third.stdout
    (demo / "pyproject.toml").write_text("[project]\nname = 'examforge'\nversion = '2'\n")
    assert run(demo, "--local").returncode == 0
    assert calls(demo).count(INSTALL) == 3
    assert "install skipped" in run(demo, "--local").stdout
    assert calls(demo).count(INSTALL) == 3


def test_a_venv_that_already_holds_the_lock_is_not_installed_again(demo, tmp_path):
    """README's own install line leaves no stamp: demo.sh reads the installed packages (a
    real interpreter, in a venv whose metadata stands in for an install) and skips only when
    each is at the lock's version and examforge is installed editable from here."""
    real = tmp_path / "real"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(real)], check=True)
    site = next(real.glob("lib/python*/site-packages"))

    def installed(name: str, version: str, source: Path | None = None) -> None:
        info = site / f"{name}-{version}.dist-info"
        for old in site.glob(f"{name}-*.dist-info"):
            shutil.rmtree(old)
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        if source is not None:
            (info / "direct_url.json").write_text(json.dumps(
                {"url": source.as_uri(), "dir_info": {"editable": True}}))

    env = {"REAL_PYTHON": str(real / "bin" / "python")}
    installed("click", "8.5.1")
    installed("examforge", "0.1.0", tmp_path / "elsewhere")  # another checkout's
    assert "install skipped" not in run(demo, "--local", **env).stdout
    assert calls(demo).count(INSTALL) == 1

    (demo / ".venv" / "examforge-install.sha256").unlink()  # as after README's install line
    installed("click", "8.5.0")
    assert "install skipped" not in run(demo, "--local", **env).stdout
    assert calls(demo).count(INSTALL) == 2

    (demo / ".venv" / "examforge-install.sha256").unlink()
    installed("click", "8.5.1")
    installed("examforge", "0.1.0", demo)
    held = run(demo, "--local", **env)
    assert held.returncode == 0, held.stderr
    assert "demo.sh: .venv already holds examforge and every package at " \
        "requirements/lock.txt's version: install skipped" in held.stdout
    assert calls(demo).count(INSTALL) == 2
    assert "unchanged since its install): install skipped" in run(demo, "--local", **env).stdout
    # A pyproject.toml changed since the install (a new package, a new script): installed
    # again, though every package is still at the lock's version.
    (demo / "pyproject.toml").write_text("[project]\nname = 'examforge'\nversion = '2'\n")
    again = run(demo, "--local", **env)
    assert "install skipped" not in again.stdout and calls(demo).count(INSTALL) == 3


def test_a_failed_install_leaves_no_stamp_and_the_next_run_installs_again(demo):
    fake = demo / ".venv" / "bin" / "python"
    fake.write_text(FAKE_PYTHON.replace("case \"$*\" in", "case \"$*\" in\n  *pip*) exit 1 ;;"))
    failed = run(demo, "--local")
    assert failed.returncode != 0
    assert not (demo / ".venv" / "examforge-install.sha256").exists()
    fake.write_text(FAKE_PYTHON)
    again = run(demo, "--local")
    assert again.returncode == 0, again.stderr
    assert calls(demo).count(INSTALL) == 2


def test_language_picks_the_sample_exam_in_it_and_exports_a_csv_with_a_mark(demo):
    result = run(demo, "--local", "--language", "fa")
    assert result.returncode == 0, result.stderr
    log = calls(demo)
    assert "-m producer run cloud-practitioner-fa --concurrency 8" in log
    assert "-m producer export cloud-practitioner-fa --format moodle-xml" in log
    assert "-m producer export cloud-practitioner-fa --format csv --bom" in log
    english = run(demo, "--local", "--language=en")
    assert english.returncode == 0, english.stderr
    assert "export cloud-practitioner --format csv --bom" not in calls(demo)


def test_an_unknown_language_is_one_line_and_exit_2(demo):
    result = run(demo, "--language", "xx")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "demo.sh: --language 'xx': no sample exam in that language (known: en, fa, ar, ru)"]
    assert calls(demo) == ""


@pytest.mark.parametrize("tag", ["fa", "ar", "ru"])
def test_each_language_s_sample_exam_is_a_valid_syllabus_in_it(tag):
    from examforge.syllabus import load_syllabus

    syllabus = load_syllabus(ROOT / "exams" / f"cloud-practitioner-{tag}" / "syllabus.json",
                             max_questions=1000)
    assert syllabus.language == tag
