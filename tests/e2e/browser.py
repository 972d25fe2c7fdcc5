"""What every real-browser test shares: Debian's Chromium, its launch flags, the screenshot folder.

Never ``playwright install`` (it downloads a browser): Playwright drives the system's Chromium
with these flags (no sandbox in a container, no GPU, nothing fetched in the background).
"""

from __future__ import annotations

import os
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def artifacts() -> Path:
    """Return the folder for screenshots: ``$POSTTRAIN_TEST_ARTIFACTS`` or ``test-artifacts/``."""
    folder = Path(os.environ.get("POSTTRAIN_TEST_ARTIFACTS") or "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
