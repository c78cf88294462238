"""A headless Chromium driven by Selenium: the dashboard's end-to-end test and the demo's
screenshot (docs/dashboard.png) open the coordinator's page in a real browser with it.

Needs Debian's ``chromium`` and ``chromium-driver`` (``make test`` and ``make demo`` install
them as root with apt-get) and the ``selenium`` package (the ``browser`` extra: ``pip install
'unicron[browser]'``). ``unavailable()`` says why a browser cannot be started here; callers skip,
they do not fail.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
WINDOW = (1400, 1500)


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUM) if p), None)


def unavailable() -> str | None:
    """Why no headless browser can be started here (None: it can)."""
    if importlib.util.find_spec("selenium") is None:
        return "the selenium package is missing (pip install 'unicron[browser]')"
    if _chromium() is None:
        return "Chromium is not installed (apt-get install chromium chromium-driver)"
    if shutil.which("chromedriver") is None:
        return "chromedriver is not installed (apt-get install chromium-driver)"
    return None


def headless() -> Any:
    """A headless Chromium (a ``selenium.webdriver.Chrome``); quit it when done."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(_chromium())
    # --no-sandbox: Chromium refuses to run its sandbox as root (CI and the test hosts run as root).
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument(f"--window-size={WINDOW[0]},{WINDOW[1]}")
    return webdriver.Chrome(options=options, service=Service(executable_path=shutil.which("chromedriver")))


def dashboard_url(coordinator: str, token: str) -> str:
    """The page with its token in the fragment (read by the page, never sent to the server)."""
    return f"{coordinator.rstrip('/')}/#token={token}"


def screenshot(driver: Any, path: Path) -> Path:
    """The whole page as a PNG at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(WINDOW[0], max(WINDOW[1], height + 40))
    driver.save_screenshot(str(path))
    return path


def photograph_dashboard(coordinator: str, token: str, path: Path, timeout_s: float = 60) -> str:
    """Open the dashboard, wait until it shows an incident, and save the page at ``path``; what
    was done, or why not (never raises: a missing browser or a slow page costs the picture only)."""
    if (reason := unavailable()) is not None:
        return f"no screenshot: {reason}"
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        driver = headless()
    except Exception as exc:
        return f"no screenshot: Chromium did not start ({type(exc).__name__})"
    try:
        driver.get(dashboard_url(coordinator, token))
        WebDriverWait(driver, timeout_s).until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-incident]"))
        screenshot(driver, path)
        return f"dashboard screenshot: {path}"
    except Exception as exc:
        return f"no screenshot: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        driver.quit()
