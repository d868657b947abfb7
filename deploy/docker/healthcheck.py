"""Container health check: exit 0 when the service answers 200 on /health/ready, else 1.

    python healthcheck.py [URL]

URL defaults to http://127.0.0.1:$PORT/health/ready. Standard library only, so the image needs no curl.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main(argv: list[str]) -> int:
    url = argv[0] if argv else f"http://127.0.0.1:{os.environ.get('PORT', '8000')}/health/ready"
    try:
        with urllib.request.urlopen(
            url, timeout=float(os.environ.get("HEALTHCHECK_TIMEOUT_S", "4"))
        ) as response:
            status = response.status
    except urllib.error.HTTPError as error:  # 503 while loading or draining
        status = error.code
    except OSError as error:  # refused (not listening yet), timed out
        print(f"{url}: {error}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"{url}: HTTP {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
