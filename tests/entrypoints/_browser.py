"""Headless Chromium (Debian's `chromium` + `chromium-driver`) driven by selenium.

scripts/install_browser.sh installs both (scripts/test.sh runs it). Without
them the browser tests skip only where apt-get is unavailable; on a machine
that has apt-get a missing browser is a failure, so CI cannot pass by skipping.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "playground"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,900"]

T = TypeVar("T")


def require_browser() -> None:
    """Skip (no apt-get here) or fail (apt-get exists: the set-up should have installed it)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if not missing:
        return
    why = f"{', '.join(missing)} missing"
    if shutil.which("apt-get") is None:
        print(f"SKIP browser tests: {why} and apt-get is unavailable to install them")
        pytest.skip(f"{why}; apt-get is unavailable (install chromium and chromedriver)")
    pytest.fail(f"{why}: run `bash scripts/install_browser.sh` (scripts/test.sh does)")


@contextmanager
def chromium() -> Iterator[Any]:
    """A fresh headless Chromium (its own profile folder), quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    require_browser()
    with tempfile.TemporaryDirectory(prefix="radixlm-chromium-") as profile:
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for flag in [*FLAGS, f"--user-data-dir={profile}"]:
            opts.add_argument(flag)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
        driver.set_page_load_timeout(30)
        driver.set_script_timeout(30)
        try:
            yield driver
        finally:
            driver.quit()


def wait_for(driver: Any, what: Callable[[Any], T], timeout: float, message: str) -> T:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(what, message)  # type: ignore[no-any-return]


def set_viewport(driver: Any, width: int, height: int, mobile: bool) -> None:
    """Emulate a screen of this CSS size (a phone with `mobile`), not just a window."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile})


def screenshot(driver: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    driver.save_screenshot(str(path))
    return path
