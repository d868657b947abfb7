"""LibreTranslate's API (``POST /translate``, ``GET /languages``, ``POST /detect``, ``GET /frontend/settings``)
on the inference core's translation, so that LibreTranslate's clients work with only the URL changed."""
