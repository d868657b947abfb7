"""The gRPC door's server: ``grpc.aio`` in the service's own event loop, on ``GRPC_PORT``.

Started by the app's lifespan once the core is ready, stopped before the engines: requests in
flight get the shutdown timeout to finish (``grace``), new ones meet the core's drain (UNAVAILABLE).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import grpc
from tritonclient.grpc import service_pb2_grpc as rpc

from service.access.keys import ApiKeys, ControlAccess
from service.access.quotas import Quotas
from service.api.grpc.auth import ApiKeyInterceptor
from service.api.grpc.servicer import InferenceServicer
from service.inference import InferenceService
from service.lifecycle import Lifecycle
from service.observe.metrics import Metrics
from service.settings import Settings

log = logging.getLogger(__name__)


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """gRPC over TLS with the HTTP door's certificate (TLS_*); with TLS_CLIENT_CA_FILE, clients must present
    a certificate that CA signed (mutual TLS). None: plain gRPC."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    ca = settings.tls_client_ca_file
    return grpc.ssl_server_credentials(
        [(settings.tls_key_file.read_bytes(), settings.tls_cert_file.read_bytes())],
        root_certificates=ca.read_bytes() if ca is not None else None,
        require_client_auth=ca is not None,
    )


class GrpcServer:
    def __init__(
        self,
        core: InferenceService,
        lifecycle: Lifecycle,
        settings: Settings,
        metrics: Metrics,
        quotas: Quotas | None = None,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    ) -> None:
        """``interceptors`` run first, before the key check (traces: ``Tracing.grpc_interceptors``)."""
        assert settings.grpc_port is not None, "GRPC_PORT is set"
        limit = settings.max_body_bytes  # the same bound on a request as MAX_BODY_BYTES on HTTP
        keys = ApiKeys.from_settings(settings)
        credentials = server_credentials(settings)
        options: list[tuple[str, int]] = [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", -1),
        ]
        if (
            credentials is not None
        ):  # a TLS handshake within TLS_HANDSHAKE_TIMEOUT_S, as on HTTP (gRPC: 120 s)
            options.append(("grpc.server_handshake_timeout_ms", int(settings.tls_handshake_timeout_s * 1000)))
        self.server = grpc.aio.server(
            interceptors=[*interceptors, *([ApiKeyInterceptor(keys)] if keys.enabled else [])],
            options=options,
        )
        rpc.add_GRPCInferenceServiceServicer_to_server(
            InferenceServicer(
                core,
                lifecycle,
                metrics,
                keys,
                settings.access_log,
                settings.model_control_mode,
                ControlAccess.from_settings(settings),
                quotas,
            ),
            self.server,
        )
        self.address = f"{settings.host}:{settings.grpc_port}"
        self.port = (
            self.server.add_insecure_port(self.address)
            if credentials is None
            else self.server.add_secure_port(self.address, credentials)
        )
        self.grace_s = settings.shutdown_timeout_s

    async def start(self) -> None:
        await self.server.start()
        log.info("gRPC (Open Inference Protocol v2) on %s", self.address.rsplit(":", 1)[0] + f":{self.port}")

    async def stop(self) -> None:
        await self.server.stop(self.grace_s)
