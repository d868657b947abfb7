"""Screenshots of every playground panel, answered by a real server: docs/playground/<panel>.png.

    .venv/bin/python scripts/playground_screenshots.py --models models

Starts ``python -m service`` on a free port over ``--models`` (the README's pictures come from the
default models), opens /playground in Debian's headless Chromium, fills and submits each panel as a
user would (the inputs are the page's own examples; the image is a Fashion-MNIST validation picture
when the data folder is there), and saves each panel's element as a PNG.
"""

from __future__ import annotations

import argparse
import gzip
import io
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from harness.service_process import ServiceProcess

ROOT = Path(__file__).resolve().parents[1]
PANELS = ("translate", "classify", "image", "generate", "qa", "entities")


def fashion_image(data_dir: Path, index: int = 0) -> bytes:
    """One validation image as PNG (28 x 28, grey), or a plain square without the data."""
    path = data_dir / "fashion_mnist" / "validation-images-idx3-ubyte.gz"
    if path.is_file():
        raw = gzip.decompress(path.read_bytes())
        pixels = raw[16 + index * 784 : 16 + (index + 1) * 784]
        image = Image.frombytes("L", (28, 28), pixels)
    else:
        image = Image.new("L", (28, 28), color=180)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / "models")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "playground")
    args = parser.parse_args()
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        sys.exit("needs Debian's chromium and chromium-driver (scripts/setup.sh installs them)")
    args.out.mkdir(parents=True, exist_ok=True)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1500,2000"):
        options.add_argument(flag)
    env = {"MODEL_REPOSITORY": str(args.models), "REDIS_URL": None, "API_KEYS": None, "LOG_LEVEL": "warning"}
    with ServiceProcess(env) as server, tempfile.TemporaryDirectory() as tmp:
        image = Path(tmp) / "fashion.png"
        image.write_bytes(fashion_image(args.data_dir))
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
        try:
            driver.get(f"{server.url}/playground")
            driver.find_element(By.ID, "image-file").send_keys(str(image))
            seed = driver.find_element(By.ID, "generate-seed")
            seed.clear()
            seed.send_keys("7")
            for panel in PANELS:
                meta = driver.find_element(By.ID, f"{panel}-meta")
                driver.find_element(By.ID, f"{panel}-go").click()
                WebDriverWait(driver, 120).until(
                    lambda _, meta=meta, panel=panel: (
                        (meta.text.startswith("model ") and "streaming" not in meta.text)
                        or driver.find_elements(By.CSS_SELECTOR, f"#{panel}-out .error")
                    )
                )
                section = driver.find_element(By.ID, panel)
                path = args.out / f"{panel}.png"
                section.screenshot(str(path))
                print(f"{path}: {meta.text}")
        finally:
            driver.quit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
