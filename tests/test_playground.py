"""The playground page in a real browser: Debian's headless Chromium through Selenium, against a real
server on loopback with API keys on.

Per panel the test fills the form, submits, and checks what the page shows against what the API
itself answers for the same input (the response cache is off, decoding is greedy or seeded, so both
compute the same thing). The page loads nothing from other hosts (test_docs_offline.py checks the
HTML; here the browser's own resource log is checked too).
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from service.settings import Settings
from tests.servers import LiveServer

KEY = "playground-test-key"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (scripts/setup.sh installs them)",
)


@pytest.fixture(scope="module")
def server(tiny_models: Path) -> Iterator[LiveServer]:
    with LiveServer(Settings(MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=False, API_KEYS=KEY)) as live:
        yield live


@pytest.fixture(scope="module")
def api(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


@pytest.fixture(scope="module")
def browser(server: LiveServer) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1800"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_script_timeout(60)
    try:
        driver.get(f"{server.url}/playground")
        yield driver
    finally:
        driver.quit()


def _wait(browser: Any, condition: Any, timeout: float = 60) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout).until(condition)


def _fill(browser: Any, element_id: str, value: str) -> None:
    from selenium.webdriver.common.by import By

    field = browser.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(value)


def _submit(browser: Any, panel: str) -> Any:
    """Click the panel's button and wait for its metadata line (or an error); return the output element."""
    from selenium.webdriver.common.by import By

    out = browser.find_element(By.ID, f"{panel}-out")
    meta = browser.find_element(By.ID, f"{panel}-meta")
    browser.execute_script("arguments[0].textContent = ''; arguments[1].replaceChildren();", meta, out)
    browser.find_element(By.ID, f"{panel}-go").click()
    _wait(browser, lambda _: meta.text.startswith("model ") or out.find_elements(By.CSS_SELECTOR, ".error"))
    errors = out.find_elements(By.CSS_SELECTOR, ".error")
    assert not errors, errors[0].text
    return out


def _set_key(browser: Any, key: str) -> None:
    _fill(browser, "api-key", key)
    browser.execute_script("document.getElementById('api-key').dispatchEvent(new Event('change'))")


def test_without_the_key_the_page_shows_the_401(browser: Any) -> None:
    from selenium.webdriver.common.by import By

    _set_key(browser, "")
    browser.find_element(By.ID, "classify-go").click()
    error = _wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#classify-out .error"))[0]
    assert error.text.startswith("401 unauthorized")
    _set_key(browser, KEY)


def test_the_models_panel_lists_each_model_with_its_versions_and_state(
    browser: Any, api: httpx.Client
) -> None:
    from selenium.webdriver.common.by import By

    _set_key(browser, KEY)
    out = browser.find_element(By.ID, "models-out")
    browser.execute_script("arguments[0].replaceChildren();", out)
    browser.find_element(By.ID, "models-go").click()
    items = _wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#models-out li"))
    listed = {item.get_attribute("data-model"): item.text for item in items}
    for model in api.get("/v1/models").json()["data"]:
        assert listed[model["name"]] == (
            f"{model['name']} · {model['task']} · READY · versions {', '.join(model['versions'])}"
        )


def test_translate_shows_the_n_best_with_scores(browser: Any, api: httpx.Client) -> None:
    from selenium.webdriver.common.by import By

    _set_key(browser, KEY)
    text = "A man is riding a bicycle."
    _fill(browser, "translate-text", text)
    _fill(browser, "translate-beam", "3")
    _fill(browser, "translate-n", "2")
    out = _submit(browser, "translate")
    expected = api.post(
        "/v1/translate", json={"text": text, "beam_size": 3, "num_return_sequences": 2, "return_scores": True}
    ).json()["results"][0]
    assert out.find_element(By.CSS_SELECTOR, ".translation").text == expected["text"].strip()
    items = out.find_elements(By.CSS_SELECTOR, "ol.nbest li")
    assert len(items) == 2
    assert f"(score {expected['sequences'][1]['score']:.3f})" in items[1].text
    assert "model translator" in browser.find_element(By.ID, "translate-meta").text


def test_classify_draws_one_bar_per_label(browser: Any, api: httpx.Client) -> None:
    from selenium.webdriver.common.by import By

    _set_key(browser, KEY)
    _fill(browser, "classify-text", "a moving and beautiful film")
    out = _submit(browser, "classify")
    expected = api.post("/v1/classify", json={"text": "a moving and beautiful film", "top_k": 10}).json()
    labels = expected["results"][0]["labels"]
    bars = out.find_elements(By.CSS_SELECTOR, ".bar")
    assert [b.find_element(By.CSS_SELECTOR, ".name").text for b in bars] == [x["label"] for x in labels]
    assert bars[0].find_element(By.CSS_SELECTOR, ".value").text == f"{100 * labels[0]['score']:.1f}%"


def test_an_uploaded_image_is_shown_beside_its_top_k(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    _set_key(browser, KEY)
    png = tmp_path / "shirt.png"
    buffer = io.BytesIO()
    Image.new("L", (28, 28), color=200).save(buffer, format="PNG")
    png.write_bytes(buffer.getvalue())
    browser.find_element(By.ID, "image-file").send_keys(str(png))
    out = _submit(browser, "image")
    assert out.find_element(By.TAG_NAME, "img").get_attribute("src").startswith("data:image/png;base64,")
    assert len(out.find_elements(By.CSS_SELECTOR, ".bar")) == 5
    assert "model vit" in browser.find_element(By.ID, "image-meta").text


def test_generate_streams_tokens_before_the_end(browser: Any, api: httpx.Client) -> None:
    from selenium.webdriver.common.by import By

    _set_key(browser, KEY)
    for field, value in (("generate-prompt", "ROMEO:"), ("generate-max", "24"), ("generate-seed", "7")):
        _fill(browser, field, value)
    # Record, in the order the page made its DOM changes, where the first token and the final line came
    # (mutation records, not clock readings: a fast stream's events may all land in one observer call).
    browser.execute_script(
        """
        window.seen = {firstToken: null, done: null};
        let n = 0;
        const meta = document.getElementById('generate-meta');
        new MutationObserver((records) => {
          for (const r of records) {
            n += 1;
            const added = [...r.addedNodes];
            if (seen.firstToken === null && added.some((x) => x.nodeType === 1 && x.matches('.token')))
              seen.firstToken = n;
            if (seen.done === null && r.target === meta && added.some((x) => x.textContent.includes(' tokens ')))
              seen.done = n;
          }
        }).observe(document.body, {subtree: true, childList: true, characterData: true});
        """
    )
    out = _submit(browser, "generate")
    tokens = out.find_elements(By.CSS_SELECTOR, ".token")
    seen = browser.execute_script("return window.seen")
    assert tokens and seen["firstToken"] is not None and seen["firstToken"] < seen["done"]
    expected = api.post(
        "/v1/generate",
        json={"prompt": "ROMEO:", "max_new_tokens": 24, "temperature": 0.8, "top_p": 0.95, "seed": 7},
    ).json()["results"][0]
    shown = browser.execute_script("return document.querySelector('#generate-out .completion').textContent")
    assert shown == expected["text"]  # seeded: the same text, token by token
    assert f"{len(tokens)} tokens" in browser.find_element(By.ID, "generate-meta").text


def test_qa_highlights_the_answer_span(browser: Any, api: httpx.Client) -> None:
    from selenium.webdriver.common.by import By

    _set_key(browser, KEY)
    question, context = "Where is the tower?", "The tower stands in Paris, the capital of France."
    _fill(browser, "qa-question", question)
    _fill(browser, "qa-context", context)
    out = _submit(browser, "qa")
    answer = api.post("/v1/extract", json={"task": "qa", "question": question, "context": context}).json()
    span = answer["results"][0]
    marks = out.find_elements(By.CSS_SELECTOR, "mark.answer")
    if span["end"] > span["start"]:
        assert [m.text for m in marks] == [context[span["start"] : span["end"]].strip()]
    else:
        assert not marks
    assert f"“{span['answer']}”" in out.text


def test_entities_are_highlighted_inline_by_label(browser: Any, api: httpx.Client) -> None:
    from selenium.webdriver.common.by import By

    _set_key(browser, KEY)
    text = "Angela Merkel met Emmanuel Macron in Berlin."
    _fill(browser, "entities-text", text)
    out = _submit(browser, "entities")
    found = api.post("/v1/extract", json={"task": "entities", "text": text}).json()["results"][0]["entities"]
    marks = out.find_elements(By.TAG_NAME, "mark")
    assert [m.get_attribute("data-label") for m in marks] == [e["label"] for e in found]


def test_the_page_fetched_nothing_from_other_hosts(browser: Any, server: LiveServer) -> None:
    urls = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    outside = [u for u in urls if not u.startswith(server.url)]
    assert not outside, outside


@pytest.mark.parametrize(
    ("page", "title_selector"),
    [("/schema/swagger", ".swagger-ui .info .title"), ("/schema/redoc", "h1"), ("/schema", "h1")],
)
def test_the_docs_pages_render_offline(
    browser: Any, server: LiveServer, page: str, title_selector: str
) -> None:
    """Not a blank page: the UI (vendored JavaScript) renders the document's title and operations."""
    from selenium.webdriver.common.by import By

    browser.get(f"{server.url}{page}")
    title = _wait(
        browser,
        lambda b: [
            e for e in b.find_elements(By.CSS_SELECTOR, title_selector) if "Transformer serving" in e.text
        ],
    )
    assert title
    assert "/v1/classify" in browser.find_element(By.TAG_NAME, "body").text
    urls = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert urls and all(u.startswith(server.url) for u in urls), urls


def _on_playground(browser: Any, server: LiveServer) -> None:
    """The docs tests above take the browser to other pages: come back."""
    if not browser.current_url.endswith("/playground"):
        browser.get(f"{server.url}/playground")


def _attention_on(browser: Any, panel: str, on: bool = True) -> None:
    from selenium.webdriver.common.by import By

    box = browser.find_element(By.ID, f"{panel}-attn")
    if box.is_selected() != on:
        box.click()


@pytest.mark.parametrize(
    ("panel", "fields", "path", "body"),
    [
        (
            "translate",
            {"translate-text": "A dog runs.", "translate-beam": "2", "translate-n": "1"},
            "/v1/translate",
            {"text": "A dog runs.", "beam_size": 2},
        ),
        ("classify", {"classify-text": "a dull film"}, "/v1/classify", {"text": "a dull film"}),
        (
            "entities",
            {"entities-text": "Ada Lovelace lived in London."},
            "/v1/extract",
            {"task": "entities", "text": "Ada Lovelace lived in London."},
        ),
        (
            "qa",
            {"qa-question": "Where is it?", "qa-context": "It is in Paris."},
            "/v1/extract",
            {"task": "qa", "question": "Where is it?", "context": "It is in Paris."},
        ),
    ],
)
def test_attention_heatmap_has_a_cell_per_weight(
    browser: Any,
    server: LiveServer,
    api: httpx.Client,
    panel: str,
    fields: dict[str, str],
    path: str,
    body: dict[str, Any],
) -> None:
    """Token x token (BERT) or target x source (translator): one shaded cell per weight, rows labelled."""
    from selenium.webdriver.common.by import By

    _on_playground(browser, server)
    _set_key(browser, KEY)
    for field, value in fields.items():
        _fill(browser, field, value)
    _attention_on(browser, panel)
    out = _submit(browser, panel)
    expected = api.post(path, json={**body, "return_attention": True}).json()["results"][0]["attention"]
    heatmap = out.find_element(By.CSS_SELECTOR, f"[data-testid=heatmap-{panel}]")
    cells = heatmap.find_elements(By.CSS_SELECTOR, ".cell")
    assert len(cells) == len(expected["rows"]) * len(expected["columns"])
    labels = [e.get_attribute("textContent") for e in heatmap.find_elements(By.CSS_SELECTOR, ".rowlabel")]
    assert labels == expected["rows"]
    first = expected["weights"][0][0]
    assert cells[0].get_attribute("title").endswith(f": {first:.4f}")
    _attention_on(browser, panel, on=False)


def test_attention_layer_and_head_can_be_chosen(browser: Any, server: LiveServer, api: httpx.Client) -> None:
    """The selects learn the model's layers and heads from the first map; a chosen pair is what is drawn."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _on_playground(browser, server)
    _set_key(browser, KEY)
    _fill(browser, "classify-text", "a dull film")
    _attention_on(browser, "classify")
    _submit(browser, "classify")
    layers = Select(browser.find_element(By.ID, "classify-layer"))
    heads = Select(browser.find_element(By.ID, "classify-head"))
    expected = api.post("/v1/classify", json={"text": "a dull film", "return_attention": True}).json()
    first = expected["results"][0]["attention"]
    assert len(layers.options) == first["num_layers"] + 1 and len(heads.options) == first["num_heads"] + 1
    layers.select_by_value("0")
    heads.select_by_value("1")
    out = _submit(browser, "classify")
    chosen = api.post(
        "/v1/classify",
        json={"text": "a dull film", "return_attention": True, "attention_layer": 0, "attention_head": 1},
    ).json()["results"][0]["attention"]
    cells = out.find_elements(By.CSS_SELECTOR, "[data-testid=heatmap-classify] .cell")
    titles = [c.get_attribute("title").rsplit(": ", 1)[1] for c in cells]
    assert titles == [f"{w:.4f}" for row in chosen["weights"] for w in row]
    assert "layer 0" in out.find_element(By.TAG_NAME, "figcaption").text
    assert "head 1 of" in out.find_element(By.TAG_NAME, "figcaption").text
    layers.select_by_value("")
    heads.select_by_value("")
    _attention_on(browser, "classify", on=False)


def test_vit_attention_is_overlaid_on_the_image(
    browser: Any, server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    """[CLS] to patches: one semi-transparent cell per patch, laid over the uploaded picture."""
    import base64

    from selenium.webdriver.common.by import By

    _on_playground(browser, server)
    _set_key(browser, KEY)
    png = tmp_path / "bag.png"
    image = Image.new("L", (28, 28), color=0)
    image.paste(220, (6, 8, 22, 24))
    image.save(png, format="PNG")
    browser.find_element(By.ID, "image-file").send_keys(str(png))
    _attention_on(browser, "image")
    out = _submit(browser, "image")
    expected = api.post(
        "/v1/classify",
        json={"image": base64.b64encode(png.read_bytes()).decode(), "return_attention": True},
    ).json()["results"][0]["attention"]
    rows, cols = expected["grid"]
    overlay = out.find_element(By.CSS_SELECTOR, "[data-testid=heatmap-image]")
    cells = overlay.find_elements(By.CSS_SELECTOR, ".cell")
    assert len(cells) == rows * cols
    picture = out.find_element(By.CSS_SELECTOR, ".overlaid img")
    assert picture.get_attribute("src").startswith("data:image/png;base64,")
    assert overlay.size == picture.size and overlay.location == picture.location  # exactly over the image
    assert len(out.find_elements(By.CSS_SELECTOR, ".bar")) == 5
    _attention_on(browser, "image", on=False)
