"""TLS on both doors (TLS_CERT_FILE, TLS_KEY_FILE) and mutual TLS (TLS_CLIENT_CA_FILE), with certificates
this test makes: HTTPS through httpx and the openai client, gRPC over TLS through tritonclient, and a client
without a certificate refused by both doors under mutual TLS."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import ValidationError
from servers import LiveServer
from tritonclient.utils import InferenceServerException

from harness.ports import free_port
from service.settings import Settings


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _certificate(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer if issuer is not None else (name, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(
    folder: Path, name: str, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pki")
    ca_key = _key()
    ca = _certificate("test CA", ca_key, None)
    server_key, client_key = _key(), _key()
    paths = {}
    paths["ca"], _ = _write(folder, "ca", ca, ca_key)
    paths["server_cert"], paths["server_key"] = _write(
        folder, "server", _certificate("127.0.0.1", server_key, (ca.subject, ca_key)), server_key
    )
    paths["client_cert"], paths["client_key"] = _write(
        folder, "client", _certificate("a client", client_key, (ca.subject, ca_key)), client_key
    )
    return paths


def _classify_v2_grpc(client: tgrpc.InferenceServerClient) -> str:
    text = tgrpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"a fine film"], dtype=object))
    return str(client.infer("bert-classifier", [text]).as_numpy("label")[0])


def test_both_doors_serve_over_tls_and_plain_connections_are_refused(
    tiny_models: Path, pki: dict[str, Path]
) -> None:
    grpc_port = free_port()
    settings = Settings(
        MODEL_REPOSITORY=tiny_models,
        SERVED_MODELS=["bert-classifier"],
        TLS_CERT_FILE=pki["server_cert"],
        TLS_KEY_FILE=pki["server_key"],
        GRPC_PORT=grpc_port,
    )
    with LiveServer(settings) as server:
        url = server.url.replace("http://", "https://")
        answer = httpx.post(
            f"{url}/v1/classify", json={"text": "a fine film"}, verify=str(pki["ca"]), timeout=60
        )
        assert answer.status_code == 200 and answer.json()["model"] == "bert-classifier", answer.text
        with pytest.raises(httpx.ConnectError):  # an unknown CA: the client refuses the server
            httpx.get(f"{url}/health/ready", timeout=30)
        with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP on the TLS port: no answer
            httpx.get(f"{server.url}/health/ready", timeout=30)

        secure = tgrpc.InferenceServerClient(
            f"127.0.0.1:{grpc_port}", ssl=True, root_certificates=str(pki["ca"])
        )
        assert _classify_v2_grpc(secure)
        secure.close()
        plain = tgrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        with pytest.raises(InferenceServerException):
            plain.is_server_live()
        plain.close()


def test_mutual_tls_refuses_a_client_without_a_certificate_on_both_doors(
    tiny_models: Path, pki: dict[str, Path]
) -> None:
    grpc_port = free_port()
    settings = Settings(
        MODEL_REPOSITORY=tiny_models,
        SERVED_MODELS=["bert-classifier"],
        TLS_CERT_FILE=pki["server_cert"],
        TLS_KEY_FILE=pki["server_key"],
        TLS_CLIENT_CA_FILE=pki["ca"],
        GRPC_PORT=grpc_port,
    )
    with LiveServer(settings) as server:
        url = server.url.replace("http://", "https://")
        with_cert = ssl.create_default_context(cafile=str(pki["ca"]))
        with_cert.load_cert_chain(str(pki["client_cert"]), str(pki["client_key"]))
        answer = httpx.post(f"{url}/v1/classify", json={"text": "a fine film"}, verify=with_cert, timeout=60)
        assert answer.status_code == 200, answer.text
        without = ssl.create_default_context(cafile=str(pki["ca"]))
        with pytest.raises((httpx.ReadError, httpx.ConnectError, httpx.RemoteProtocolError)):
            httpx.get(f"{url}/health/ready", verify=without, timeout=30)

        mutual = tgrpc.InferenceServerClient(
            f"127.0.0.1:{grpc_port}",
            ssl=True,
            root_certificates=str(pki["ca"]),
            private_key=str(pki["client_key"]),
            certificate_chain=str(pki["client_cert"]),
        )
        assert _classify_v2_grpc(mutual)
        mutual.close()
        anonymous = tgrpc.InferenceServerClient(
            f"127.0.0.1:{grpc_port}", ssl=True, root_certificates=str(pki["ca"])
        )
        with pytest.raises(InferenceServerException):
            anonymous.is_server_live()
        anonymous.close()


def test_tls_settings_go_together_and_name_a_missing_file(tmp_path: Path, pki: dict[str, Path]) -> None:
    with pytest.raises(ValidationError, match="TLS_CERT_FILE and TLS_KEY_FILE go together"):
        Settings(TLS_CERT_FILE=pki["server_cert"])
    with pytest.raises(ValidationError, match="needs TLS_CERT_FILE"):
        Settings(TLS_CLIENT_CA_FILE=pki["ca"])
    with pytest.raises(ValidationError, match=r"TLS_KEY_FILE .* is not a readable file"):
        Settings(TLS_CERT_FILE=pki["server_cert"], TLS_KEY_FILE=tmp_path / "nowhere.key")
