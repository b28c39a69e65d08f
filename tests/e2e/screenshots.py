"""The browser tests' pictures: each is taken into the test's directory, and the docs' copy is
replaced only when asked (EXAMFORGE_UPDATE_SCREENSHOT=1) or missing, so that running the
tests leaves the work tree clean."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any


def keep_for_docs(shot: Path, target: Path) -> None:
    """Copy `shot` over the docs' picture `target` when asked, or when it is missing."""
    if os.environ.get("EXAMFORGE_UPDATE_SCREENSHOT") == "1" or not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)


def element_shot(driver: Any, element: Any, shot: Path, height: int | None = None) -> None:
    """`element` as a picture: the window 1100 wide and tall enough for it (or `height`)."""
    if height is None:
        height = int(driver.execute_script(
            "return arguments[0].getBoundingClientRect().height", element)) + 200
    driver.set_window_size(1100, height)
    driver.execute_script("arguments[0].scrollIntoView()", element)
    assert element.screenshot(str(shot))
