"""``python -m service``: run the API with uvicorn, configured by the environment (see service.settings).

With WORKERS > 1 uvicorn starts that many processes from the import string
``service.app:create_app`` (a factory), so each worker loads its own models
and reads the same environment; with one worker the app is built here.
"""

from __future__ import annotations

import uvicorn

from service.app import create_app
from service.settings import Settings


def main() -> None:
    settings = Settings()
    grace = int(settings.shutdown_timeout_s)
    if settings.workers > 1:
        uvicorn.run(
            "service.app:create_app",
            factory=True,
            workers=settings.workers,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            timeout_graceful_shutdown=grace,
        )
    else:
        uvicorn.run(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            timeout_graceful_shutdown=grace,
        )


if __name__ == "__main__":
    main()
