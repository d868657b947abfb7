"""What the harnesses around the service share: tests/, benchmarks/, loadtests/.

- ``ports``: a free loopback port.
- ``processes``: stopping a child's process group, tying a child to its parent, a process's CPU time.
- ``service_process``: ``python -m service`` as a child process, started, awaited until ready, stopped.
- ``http_client``: a minimal HTTP/1.1 client on asyncio streams (one connection, or a pool of them).
- ``sse``: Server-Sent Events out of a streamed response.
- ``event_loop``: running a client coroutine on uvloop.
- ``stats``: percentile, median, ratio.
- ``json_file``: strict JSON (NaN and infinities written as null).
- ``otlp``: OTLP trace receivers (gRPC and HTTP/protobuf) that keep every span they are sent.
- ``podman``: podman in the project's private state, and scripts/podman_build.sh's builds.
- ``compose``: docker-compose.yml brought up by Docker Compose v2 on podman's Docker API, with the health
  checks podman leaves to systemd run at their intervals.

Standard library only (``otlp`` aside: grpcio and opentelemetry-proto, which the service installs), and
never imported by the service: the service image does not hold it. It is
found on ``sys.path`` from the repository root: pytest adds the root (``pythonpath`` in
pyproject.toml) and the scripts under benchmarks/ and loadtests/ insert it themselves.
"""
