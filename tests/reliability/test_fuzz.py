"""Property-based fuzzing of the served OpenAPI schema (schemathesis) against a real ``python -m service``.

The service runs as its own process on loopback with the tiny models; the
schema is the one it serves (``GET /schema/openapi.json``). Two passes over
every documented operation:

1. schemathesis itself: its coverage phase (boundary values, missing and
   wrongly-typed fields, unexpected methods and content types) and its
   fuzzing phase (valid and invalid requests from the schema: NUL bytes,
   arbitrary Unicode, huge numbers, wrong types, multipart bodies);
2. transport mutations on top of schemathesis cases, for what a schema-driven
   generator does not send: odd Content-Types, empty, truncated and spliced
   bodies, invalid UTF-8 and lone surrogates, numbers no float holds, deep
   nesting, multipart bodies without a boundary or with undecodable fields,
   odd Accept / Cache-Control / X-Request-ID headers.

Every response must not be a 5xx (but the 504 a request that set its own deadline asked for), must use a status code, content type and
headers the operation documents, and must match the documented schema
(error responses included); afterwards the process must still be up and
ready. The fuzzed process has small limits (MAX_NEW_TOKENS=8, MAX_ITEMS=4,
...) so that requests that reach a model stay cheap. Generation is seeded and
derandomized: CI runs the same cases every time.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given
from schemathesis import Case
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Err, Ok
from schemathesis.pytest.lazy import get_all_tests
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)
from servers import ServiceProcess

from harness.ports import free_port

SEED = 20240611
EXAMPLES_PER_OPERATION = 300  # schemathesis's fuzzing phase; its coverage phase adds its own cases
MIN_CASES = 1000
LIMITS = {
    "MAX_NEW_TOKENS": "8",
    "MAX_ITEMS": "4",
    "MAX_TEXT_CHARS": "256",
    "MAX_CONTEXT_CHARS": "1024",
    "MAX_BODY_BYTES": "65536",
    "MAX_IMAGE_BYTES": "32768",
    "MAX_IMAGE_PIXELS": "262144",
}


@schemathesis.check
def not_a_server_error_but_the_clients_deadline(ctx: Any, response: Any, case: Case) -> bool | None:
    """No 5xx, but for the 504 a request that set its own deadline (``timeout_ms``, ``parameters.timeout``)
    gets when the deadline passed while it waited: the client asked for that answer."""
    if response.status_code == 504 and "passed its deadline" in response.text:
        return None
    return not_a_server_error(ctx, response, case)  # type: ignore[no-any-return]


CHECKS = [
    not_a_server_error_but_the_clients_deadline,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    unsupported_method,  # the coverage phase's undocumented methods: 405 with an Allow header
]
SETTINGS = hypothesis.settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)

CASES: Counter[str] = Counter()  # cases per operation, both passes
STATUSES: Counter[int] = Counter()  # the answers they got


@pytest.fixture(scope="module")
def service(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    env = {
        "MODEL_REPOSITORY": str(tiny_models),
        "LOG_LEVEL": "warning",
        "INTRA_OP_THREADS": "1",
        "MAX_QUEUE_DELAY_MS": "0",
        # chat answers with the template, so its requests reach the engine as completions' do
        "CHAT_TEMPLATE": str(Path(__file__).parents[1] / "data" / "chat_template.jinja"),
        **LIMITS,
    }
    log_path = tmp_path_factory.mktemp("fuzz") / "service.log"
    with ServiceProcess(free_port(), env, log_path) as proc:
        yield proc


@pytest.fixture(scope="module")
def api_schema(service: ServiceProcess) -> schemathesis.BaseSchema:
    config = SchemathesisConfig.from_dict(
        {
            "seed": SEED,
            "generation": {
                "mode": "all",  # valid and invalid requests
                "max-examples": EXAMPLES_PER_OPERATION,
                "allow-x00": True,
                "database": "none",
            },
            "phases": {"stateful": {"enabled": False}},
            "request-timeout": 60,
        }
    )
    return schemathesis.openapi.from_url(f"{service.url}/schema/openapi.json", config=config)


# --- pass 2: transport mutations ------------------------------------------------------------------
#
# A catalogue, applied in full to every operation (each entry to its own valid request from
# schemathesis), rather than drawn at random: a few dozen random draws would leave most of it untried.

ODD_CONTENT_TYPES = [
    "",
    "text/plain",
    "application/json; charset=latin-1",
    "APPLICATION/JSON",
    "application/problem+json",
    "application/x-www-form-urlencoded",
    "application/octet-stream",
    "multipart/form-data",
    "multipart/form-data; boundary=",
    "multipart/form-data; boundary=not-the-one",
    "multipart/mixed; boundary=x",
    ";",
    "application/json;;;charset",
    "*/*",
]
ODD_BYTES = [
    b"\x00",
    b"\xff",
    b"\xc3",  # a truncated UTF-8 sequence
    b"\xed\xa0\x80",  # a UTF-8-encoded surrogate
    b"\xef\xbb\xbf",  # BOM
    b"\\ud800",
    b"\\u0000",
    b'"',
    b"\\",
    b"{",
    b"]",
    b",",
    b"\r\n",
    b"--",
    b"NaN",
    b"1e999",
    b"9" * 400,
]
ODD_VALUES: list[Any] = [
    "\ud800",  # a lone surrogate: escaped, or as invalid UTF-8
    "a\udfffb",
    "a\x00b",
    "\x00",
    " \t\n\x0b\x1c",
    "",
    "x" * 70000,  # over MAX_BODY_BYTES
    "\u202e\u0301\U0010ffff\ufeff",
    10**400,
    -(10**30),
    2**63,
    1e308,
    -0.0,
    True,
    None,
    [],
    {},
    [[[[[[[[[[[[]]]]]]]]]]]],
    {"question": "q", "context": "c"},
]
ODD_HEADERS = [
    ("Accept", "application/openmetrics-text; version=1.0.0"),
    ("Accept", "application/openmetrics-text"),
    ("Accept", "text/plain;version=0.0.4;q=abc"),
    ("Accept", "*/*;q=0"),
    ("Accept", "\xff\xfe"),
    ("Cache-Control", "no-cache"),
    ("Cache-Control", "no-store"),
    ("Cache-Control", "max-age=abc"),
    ("Cache-Control", ",,,"),
    ("Cache-Control", "no-cache=\xff"),
    ("X-Request-ID", ""),
    ("X-Request-ID", "x" * 500),
    ("X-Request-ID", "a b"),
    ("X-Request-ID", "\xe9t\xe9"),
    ("X-Request-ID", "ok-id.1:2"),
    ("Content-Encoding", "gzip"),
    ("Transfer-Encoding", "chunked"),
]


@dataclass
class Mutation:
    description: str
    apply: Callable[[requests.PreparedRequest], None]


def _body(prepared: requests.PreparedRequest) -> bytes:
    body = prepared.body or b""
    return body.encode() if isinstance(body, str) else bytes(body)


def _set_body(prepared: requests.PreparedRequest, body: bytes) -> None:
    prepared.body = body
    prepared.headers["Content-Length"] = str(len(body))


def _header(name: str, value: str) -> Mutation:
    def apply(p: requests.PreparedRequest) -> None:
        if name == "Transfer-Encoding":  # a framing the server must reject or read, never choke on
            p.headers.pop("Content-Length", None)
            body = _body(p)
            p.body = (f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n") if body else b"0\r\n\r\n"
        p.headers[name] = value

    return Mutation(f"{name}: {value!r}", apply)


def _truncate(fraction: float) -> Mutation:
    return Mutation(
        f"body cut at {fraction}", lambda p: _set_body(p, _body(p)[: int(len(_body(p)) * fraction)])
    )


def _splice(chunk: bytes, at: float) -> Mutation:
    def apply(p: requests.PreparedRequest) -> None:
        body = _body(p)
        i = int(len(body) * at)
        _set_body(p, body[:i] + chunk + body[i:])

    return Mutation(f"{chunk[:20]!r} spliced in at {at}", apply)


def _json_value(value: Any, pick: int, escaped: bool) -> Mutation:
    def apply(p: requests.PreparedRequest) -> None:
        try:
            document = json.loads(_body(p))
        except ValueError:  # not a JSON body (multipart): replace it whole
            document = None
        if isinstance(document, dict) and document:
            document[sorted(document)[pick % len(document)]] = value
        else:
            document = value
        _set_body(p, json.dumps(document, ensure_ascii=escaped).encode("utf-8", "surrogatepass"))

    return Mutation(f"a JSON value replaced by {value!r:.40} (escaped: {escaped})", apply)


def _nest(depth: int) -> Mutation:
    return Mutation(
        f"body nested {depth} deep", lambda p: _set_body(p, b"[" * depth + _body(p) + b"]" * depth)
    )


def _multipart_field(charset: str, payload: bytes, name: str) -> Mutation:
    def apply(p: requests.PreparedRequest) -> None:
        body = _body(p)
        match = re.match(rb"--([^\r\n]+)\r\n", body)
        if match is None:  # not multipart
            return
        part = (
            b"--" + match.group(1) + b'\r\nContent-Disposition: form-data; name="' + name.encode() + b'"\r\n'
            b"Content-Type: text/plain; charset=" + charset.encode() + b"\r\n\r\n" + payload + b"\r\n"
        )
        _set_body(p, part + body)

    return Mutation(f"a multipart field {name} in {charset}: {payload!r}", apply)


def _content_type(value: str) -> Mutation:
    def apply(p: requests.PreparedRequest) -> None:
        p.headers["Content-Type"] = value

    return Mutation(f"Content-Type: {value!r}", apply)


def catalogue(with_body: bool) -> list[Mutation]:
    """Every transport mutation worth one request (header ones only where the operation takes no body)."""
    headers = [_header(name, value) for name, value in ODD_HEADERS]
    if not with_body:
        return headers
    return [
        *headers,
        *(_content_type(value) for value in ODD_CONTENT_TYPES),
        Mutation("empty body", lambda p: _set_body(p, b"")),
        *(_truncate(fraction) for fraction in (0.0, 0.1, 0.5, 0.9, 0.99)),
        *(_splice(chunk, at) for chunk in ODD_BYTES for at in (0.0, 0.5, 0.95)),
        *(
            _json_value(value, pick, escaped)
            for value in ODD_VALUES
            for pick in (0, 1, 3)
            for escaped in (True, False)
        ),
        *(_nest(depth) for depth in (64, 1000, 5000, 20000)),
        *(
            _multipart_field(charset, payload, name)
            for charset in ("bogus-charset", "utf-16", "ascii", "utf-8")
            for payload in (b"\xff\xfe\x00", b"caf\xe9", b"1")
            for name in ("model", "top_k", "file")
        ),
    ]


def valid_cases(operation: Any, count: int) -> list[Case]:
    """Up to ``count`` valid requests for ``operation`` from schemathesis (derandomized: always the same)."""
    found: list[Case] = []

    @given(case=operation.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE))
    @hypothesis.settings(SETTINGS, max_examples=count, phases=[hypothesis.Phase.generate])
    def collect(case: Case) -> None:
        found.append(case)

    collect()
    return found


def send_mutated(case: Case, base_url: str, change: Mutation, session: requests.Session) -> None:
    kwargs = case.as_transport_kwargs(base_url=base_url)
    request = requests.Request(
        method=kwargs["method"],
        url=kwargs["url"],
        headers=kwargs.get("headers"),
        params=kwargs.get("params"),
        json=kwargs.get("json"),
        data=kwargs.get("data"),
        files=kwargs.get("files"),
    )
    prepared = session.prepare_request(request)
    change.apply(prepared)
    response = session.send(prepared, timeout=60)
    STATUSES[response.status_code] += 1
    try:
        case.validate_response(response, checks=CHECKS)
    except FailureGroup as exc:
        exc.add_note(f"transport mutation: {change.description}")
        exc.add_note(f"request body: {_body(prepared)[:300]!r}, headers: {dict(prepared.headers)}")
        raise


def mutation_test(operation: Any, base_url: str, session: requests.Session) -> Callable[[], None]:
    def run() -> None:
        changes = catalogue(with_body=operation.body is not None and len(operation.body) > 0)
        cases = valid_cases(operation, len(changes))
        for i, change in enumerate(changes):
            case = cases[i % len(cases)]
            CASES[operation.label] += 1
            send_mutated(case, base_url, change, session)

    return run


# --- the test -------------------------------------------------------------------------------------


def check_case(case: Case) -> None:
    CASES[case.operation.label] += 1
    response = case.call(timeout=60)
    STATUSES[response.status_code] += 1
    case.validate_response(response, checks=CHECKS)


# A guard against a hang, not a bound on speed: the run's length is fixed by its example count (about 400 s
# on an idle 2-core machine), and on one whose cores were shared with a busy loop and a model build it
# took 989 s, past the suite's 600 s default, which then failed whichever request was in flight.
@pytest.mark.timeout(2400)
def test_fuzz_openapi(api_schema: schemathesis.BaseSchema, service: ServiceProcess) -> None:
    failures: dict[str, BaseException] = {}

    def run(label: str, test: Callable[[], None]) -> None:
        try:
            test()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # schemathesis's FailureGroup is a BaseExceptionGroup, not an Exception
            failures[label] = exc

    # Pass 1: schemathesis's own tests per operation (coverage, then fuzzing phase), as its pytest plugin
    # builds them. (`schemathesis.pytest.from_fixture` cannot run them here: it rewrites the node id through
    # an attribute pytest 9.2 no longer has.)
    for result in get_all_tests(schema=api_schema, test_func=check_case, settings=SETTINGS, given_kwargs={}):
        if isinstance(result, Err):
            failures[str(result.err())] = result.err()
        else:
            operation, test = result.ok()
            run(operation.label, test)
    # Pass 2: the transport-mutation catalogue on every operation.
    operations = [op.ok() for op in api_schema.get_all_operations() if isinstance(op, Ok)]
    with requests.Session() as session:
        for operation in operations:
            run(f"{operation.label} (transport mutations)", mutation_test(operation, service.url, session))

    report = "\n\n".join(
        f"=== {label}\n{exc}\n{getattr(exc, '__notes__', '')}" for label, exc in failures.items()
    )
    assert not failures, (
        f"{report}\n\nanswers: {dict(STATUSES)}\nservice log (tail):\n{service.log()[-4000:]}"
    )
    assert set(CASES) == {op.label for op in operations}, f"operations never fuzzed: {CASES}"
    total = sum(CASES.values())
    assert total >= MIN_CASES, f"only {total} cases: {dict(CASES)}"
    assert service.proc is not None and service.proc.poll() is None, "the service process died"
    ready = httpx.get(f"{service.url}/health/ready", timeout=10)
    assert ready.status_code == 200, ready.text
    print(f"\nfuzzed {total} cases: {dict(CASES)}; answers: {dict(sorted(STATUSES.items()))}")
