"""Screenshots of every playground panel, answered by a real server: docs/playground/<panel>.png.

    .venv/bin/python scripts/playground_screenshots.py --models models
    .venv/bin/python scripts/playground_screenshots.py --models models --only-attention

Starts ``python -m service`` on a free port over ``--models`` (docs/PLAYGROUND.md's pictures come from the
default models), opens /playground in Debian's headless Chromium, fills and submits each panel as a
user would (the inputs are the page's own examples; the image is a Fashion-MNIST validation picture
when the data folder is there), and saves each panel's element as a PNG.

Then the panels with an attention map (translate, classify, image, entities) once more, the
"attention map" box ticked (last layer, mean over heads: the page's defaults), as
``<panel>-attention.png``: in a window one grid column wide, so that no neighbour stretches the
panel (as wide as in the plain pictures, the image panel wider for its score bars, any panel wider
where the heatmap would otherwise scroll), and as tall as the page. ``--only-attention`` takes only these.
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
ATTENTION_PANELS = ("translate", "classify", "image", "entities")
# The page's grid is repeat(auto-fill, minmax(420px, 1fr)): below ~890 px of viewport it is one column,
# and a 516 px viewport makes a panel as wide as in the plain pictures' 1500 px window (~477 px). The
# image panel puts its 224 px overlay beside the score bars: those need more room.
ATTENTION_WIDTH = {"translate": 516, "classify": 516, "image": 760, "entities": 516}


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


def set_viewport(driver: webdriver.Chrome, width: int) -> None:
    """Make the page's viewport ``width`` wide and as tall as the whole page, so that it has no scroll bar
    (one would take its width from the panels) and every panel is in view."""
    size = (
        "const d = document.documentElement; return [innerWidth, innerHeight, d.clientWidth, d.scrollHeight];"
    )
    for _ in range(5):  # the page's height follows its width, and the window's outside is not the viewport
        height = driver.execute_script(size)[3] + 50
        driver.set_window_size(width, height)
        inner_w, inner_h, _, _ = driver.execute_script(size)
        driver.set_window_size(2 * width - inner_w, 2 * height - inner_h)
        inner_w, inner_h, client_w, page_h = driver.execute_script(size)
        if inner_w == client_w == width and page_h <= inner_h:
            return


def attention_shot(driver: webdriver.Chrome, panel: str, path: Path) -> str:
    """Tick the panel's attention box, submit, wait for its heatmap, fit the window, save the panel."""
    set_viewport(driver, ATTENTION_WIDTH[panel])
    box = driver.find_element(By.ID, f"{panel}-attn")
    if not box.is_selected():
        box.click()
    out = driver.find_element(By.ID, f"{panel}-out")
    meta = driver.find_element(By.ID, f"{panel}-meta")
    driver.execute_script("arguments[0].textContent = ''; arguments[1].replaceChildren();", meta, out)
    driver.find_element(By.ID, f"{panel}-go").click()
    WebDriverWait(driver, 120).until(
        lambda _: (
            (
                meta.text.startswith("model ")
                and out.find_elements(By.CSS_SELECTOR, f"[data-testid=heatmap-{panel}]")
            )
            or out.find_elements(By.CSS_SELECTOR, ".error")
        )
    )
    errors = out.find_elements(By.CSS_SELECTOR, ".error")
    if errors:
        sys.exit(f"{panel}: {errors[0].text}")
    # A map wider than the panel scrolls inside its <figure>: widen the window by what is hidden (again if
    # the grid then gained a column and the panel got narrower).
    width = ATTENTION_WIDTH[panel]
    for _ in range(6):
        set_viewport(driver, width)  # the page grew with the map: as tall again
        hidden = driver.execute_script(
            "const f = arguments[0].querySelector('figure'); return f.scrollWidth - f.clientWidth;", out
        )
        if hidden <= 0:
            break
        width += hidden
    else:
        sys.exit(f"{panel}: the heatmap still scrolls in a {width} px window")
    section = driver.find_element(By.ID, panel)
    section.screenshot(str(path))
    return meta.text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / "models")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "playground")
    parser.add_argument(
        "--only-attention",
        action="store_true",
        help="only the <panel>-attention.png pictures (the six plain ones are left as they are)",
    )
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
            for panel in () if args.only_attention else PANELS:
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
            for panel in ATTENTION_PANELS:
                path = args.out / f"{panel}-attention.png"
                print(f"{path}: {attention_shot(driver, panel, path)}")
        finally:
            driver.quit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
