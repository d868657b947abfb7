"""LibreTranslate's API, driven by LibreTranslate's own Python client (``libretranslatepy``, unchanged) and, for
what that client cannot send (a list, HTML, alternatives), by LibreTranslate's JSON body over httpx; every
translation compared with the REST door's answer for the same input. A real server on loopback with the
tiny translator and API keys (API_KEYS_FILE): ``api_key`` in the body is the caller's key, and its quota is
charged the tokens."""

from __future__ import annotations

import hashlib
import json
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from libretranslatepy import LibreTranslateAPI
from servers import LiveServer, metric

from service.settings import Settings

KEY, OTHER = "lt-key-of-team-a", "lt-key-of-team-b"
TEXT = "A man is walking. A dog runs."
HTML = '<p class="c">A man is <b>walking</b>.<br>A dog runs.</p><script>var a = "A dog.";</script>'


@pytest.fixture(scope="module")
def api(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(
        "".join(
            f'[[keys]]\nid = "{name}"\nsha256 = "{hashlib.sha256(key.encode()).hexdigest()}"\n'
            f"requests_per_minute = 10000\n"
            for name, key in (("team-a", KEY), ("team-b", OTHER))
        )
    )
    settings = Settings(
        MODEL_REPOSITORY=tiny_models,
        SERVED_MODELS=["translator"],
        API_KEYS_FILE=keys,
        CACHE_ENABLED=False,
        MAX_ITEMS=8,
    )
    with LiveServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def rest(api: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


def rest_translate(rest: httpx.Client, **body: Any) -> dict[str, Any]:
    r = rest.post("/v1/translate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def lt_post(api: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{api.url}{path}", json={"api_key": KEY, **body}, timeout=120)


def test_the_client_translates_as_the_rest_door(api: LiveServer, rest: httpx.Client) -> None:
    lt = LibreTranslateAPI(api.url, api_key=KEY)
    assert lt.translate(TEXT, "en", "de") == rest_translate(rest, text=TEXT)["results"][0]["text"]
    assert lt.translate("A dog.", "auto", "de") == rest_translate(rest, text="A dog.")["results"][0]["text"]


def test_languages_detect_and_settings(api: LiveServer) -> None:
    lt = LibreTranslateAPI(api.url, api_key=KEY)
    assert lt.languages() == [
        {"code": "de", "name": "German", "targets": []},
        {"code": "en", "name": "English", "targets": ["de"]},
    ]
    assert lt.detect("Ein Hund.") == [{"confidence": 0.0, "language": "en"}]  # no detector: the one source
    settings = httpx.get(f"{api.url}/frontend/settings", timeout=30).json()  # open, as LibreTranslate's
    assert settings["language"] == {
        "source": {"code": "en", "name": "English"},
        "target": {"code": "de", "name": "German"},
    }
    assert settings["charLimit"] == 4096 and settings["apiKeys"] is True


def _refusal(call: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(urllib.error.HTTPError) as caught:
        call()
    return caught.value.code, json.loads(caught.value.read())


def test_refused_pairs_and_keys_answer_as_libretranslate(api: LiveServer) -> None:
    lt = LibreTranslateAPI(api.url, api_key=KEY)
    assert _refusal(lambda: lt.translate("A dog.", "en", "fr")) == (400, {"error": "fr is not supported"})
    assert _refusal(lambda: lt.translate("A dog.", "de", "en")) == (
        400,
        {"error": "English (en) is not available as a target language from German (de)"},
    )
    assert _refusal(lambda: lt.translate("A dog.", "en", "en")) == (
        400,
        {"error": "English (en) is not available as a target language from English (en)"},
    )
    status, body = _refusal(lambda: LibreTranslateAPI(api.url, api_key="not-a-key").translate("A dog."))
    assert status == 401 and "not valid" in body["error"]
    status, body = _refusal(lambda: LibreTranslateAPI(api.url).translate("A dog.", "en", "de"))
    assert status == 401 and "API key" in body["error"]
    r = lt_post(api, "/translate", {"q": "A dog.", "source": "en", "target": "de", "format": "pdf"})
    assert (r.status_code, r.json()) == (400, {"error": "pdf format is not supported"})
    r = lt_post(api, "/translate", {"source": "en", "target": "de"})
    assert (r.status_code, r.json()) == (400, {"error": "Invalid request: missing q parameter"})
    r = lt_post(api, "/translate", {"q": "A dog.", "source": "en", "target": "de", "alternatives": "x"})
    assert (r.status_code, r.json()) == (
        400,
        {"error": "Invalid request: alternatives parameter is not a number"},
    )
    r = lt_post(api, "/translate", {"q": "a" * 4097, "source": "en", "target": "de"})
    assert r.status_code == 400 and r.json()["error"].startswith("q: 4097 characters")


def test_a_list_html_and_alternatives(api: LiveServer, rest: httpx.Client) -> None:
    texts = ["A man is walking.", "  ", "Two dogs run. A cat sits."]
    r = lt_post(api, "/translate", {"q": texts, "source": "auto", "target": "de"})
    assert r.status_code == 200, r.text
    expected = rest_translate(rest, texts=[texts[0], texts[2]])["results"]
    assert r.json() == {
        "translatedText": [expected[0]["text"], "  ", expected[1]["text"]],  # nothing to translate: as sent
        "detectedLanguage": [{"confidence": 0.0, "language": "en"}] * 3,
    }
    r = lt_post(api, "/translate", {"q": HTML, "source": "en", "target": "de", "format": "html"})
    assert r.json() == {
        "translatedText": rest_translate(rest, text=HTML, format="html")["results"][0]["text"]
    }
    assert '<script>var a = "A dog.";</script>' in r.json()["translatedText"]
    r = lt_post(
        api, "/translate", {"q": "A man is walking.", "source": "en", "target": "de", "alternatives": 2}
    )
    beams = rest_translate(rest, text="A man is walking.", beam_size=3, num_return_sequences=3)["results"][0]
    best, *others = [s["text"] for s in beams["sequences"]]
    unique = [t for i, t in enumerate(others) if t != best and t not in others[:i]]
    assert r.json() == {"translatedText": best, "alternatives": unique}


def test_api_key_in_the_body_is_charged(api: LiveServer, rest: httpx.Client) -> None:
    """The body's key is the caller's: its requests and tokens go to that key's quota."""
    before = metric(api.url, "tserve_quota_tokens_total", key="team-b")
    r = httpx.post(
        f"{api.url}/translate",
        data={
            "q": "A woman sings.",
            "source": "en",
            "target": "de",
            "api_key": OTHER,
        },  # a form, as the client
        timeout=60,
    )
    assert r.status_code == 200, r.text
    usage = rest_translate(rest, text="A woman sings.")["usage"]["total_tokens"]
    assert metric(api.url, "tserve_quota_tokens_total", key="team-b") - before == usage
