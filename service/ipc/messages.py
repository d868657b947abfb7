"""Every message between the split service's front ends and its engine process, in one module.

The transport is ZeroMQ over ``ipc://`` sockets in a private folder (``service/ipc/channel.py``): each
front end's DEALER to the engine's ROUTER, for requests and their answers, and the engine's PUB to every
front end's SUB, for what all of them must know (the models it serves, its queues, that it lives).

A ZeroMQ message is one ``Batch``: its envelopes, msgspec structs encoded once as MessagePack, then the
frames of its payloads. Coalesced: a front end sends at most one ``Batch`` per turn of its event loop,
with every request that turn made; the engine sends each front end at most one per turn, with every
answer and every token of that turn. A payload is a value typed by ``payloads.py`` (a request's task items
and their results, a generation's requests and result, a call's arguments, an error): a batch's payloads
are one MessagePack array encoded once, each envelope naming its value's place in it, with every large
array's bytes out of band, a frame of its own that ZeroMQ sends without a copy. Nothing is pickled.

Everything a request carries crosses here explicitly: the model and its version (the content hash that
names one loaded version), the priority class, the absolute deadline (``time.monotonic()``, one clock for
every process of a machine), the trace context (W3C ``traceparent`` and ``tracestate``) and the caller's
key id.
"""

from __future__ import annotations

import msgspec

# --- what a request carries ----------------------------------------------------------------------------


class Asked(msgspec.Struct, array_like=True, frozen=True):
    """A request's scheduling and identity across the boundary."""

    priority: int
    deadline: float | None  # time.monotonic() past which the client no longer wants the answer
    trace: dict[str, str] | None = None  # traceparent / tracestate, when the request is traced
    key: str | None = None  # the caller's key id (API_KEYS_FILE), for the engine's logs
    most_urgent: int = 0  # the class aging may lift its waiting work to: its key's ceiling (0: high)


# --- front end -> engine -------------------------------------------------------------------------------


class Hello(msgspec.Struct, tag="hello", array_like=True):
    """A front end announces itself: the engine watches its process and aborts its sequences if it dies."""

    pid: int
    payload: int = -1  # its value's place in the batch's payload list (-1: none)


class Submit(msgspec.Struct, tag="submit", array_like=True):
    """Items of one request for one model version's dynamic batcher; payload: the items (``payloads.ITEMS``)."""

    id: int
    model: str
    version: str
    costs: list[int]
    asked: Asked
    payload: int = -1  # its value's place in the batch's payload list (-1: none)


class Generate(msgspec.Struct, tag="generate", array_like=True):
    """One request's sequences for a generation model version; payload: the ``GenerationRequest``s."""

    id: int
    model: str
    version: str
    streams: list[int]  # the front end's id for each sequence's stream, in order
    asked: Asked
    payload: int = -1  # its value's place in the batch's payload list (-1: none)


class Abort(msgspec.Struct, tag="abort", array_like=True):
    """Sequences whose client went away, dropped before their next step, and requests whose items still
    queued are withdrawn (twice is as once)."""

    streams: list[int]
    requests: list[int]
    payload: int = -1  # its value's place in the batch's payload list (-1: none)


class Call(msgspec.Struct, tag="call", array_like=True):
    """A call to the engine's model host or to a model: ``op`` with its arguments (payload: ``payloads.CALLS``).

    ``resident``, ``load``, ``unload``; ``compute`` runs a pipeline's named method on the
    model's compute thread (the attention step's weights)."""

    id: int
    op: str
    payload: int = -1  # its value's place in the batch's payload list (-1: none)


# --- engine -> front end -------------------------------------------------------------------------------


class Reply(msgspec.Struct, tag="reply", array_like=True):
    """The answer to a ``Submit``, ``Generate`` or ``Call``: its value, or the error it raised (payload)."""

    id: int
    ok: bool
    payload: int = -1  # its value's place in the batch's payload list (-1: none)


class Token(msgspec.Struct, tag="token", array_like=True):
    """A sequence's next token (``TokenEvent``'s fields; ``logprob``, when asked for, in the payload)."""

    stream: int
    index: int
    token_id: int
    text: str
    payload: int = -1  # its value's place in the batch's payload list (-1: none)


class Ended(msgspec.Struct, tag="ended", array_like=True):
    """A sequence ended: its ``GenerationResult``, or its error (payload); ``ok`` says which."""

    stream: int
    ok: bool
    payload: int = -1  # its value's place in the batch's payload list (-1: none)


Envelope = Hello | Submit | Generate | Abort | Call | Reply | Token | Ended


class Batch(msgspec.Struct, array_like=True):
    """One ZeroMQ message's envelopes; the frames after it are their payloads' list (``channel.pack``)."""

    envelopes: list[Envelope]


# --- engine -> every front end (PUB) -------------------------------------------------------------------


class ModelVersion(msgspec.Struct, array_like=True, frozen=True):
    """One loaded version, as a front end needs it to build its view: where its files are, which of them
    the engine serves, on what."""

    name: str
    folder: str  # the model's folder
    label: str  # its version folder's number ("" for a flat model folder)
    version: str  # the manifest's content hash
    variant: str  # the served variant (reference, fused, int8, fp16)
    provider: str  # the execution provider its sessions got


class State(msgspec.Struct, array_like=True, frozen=True):
    """A model of the repository as its index shows it (``ModelHost.repository``)."""

    name: str
    version: str | None
    state: str
    reason: str = ""


class Models(msgspec.Struct, tag="models", array_like=True):
    """What the engine serves, after every change (generation ``number`` grows by one each time)."""

    number: int
    versions: list[ModelVersion]  # newest first within each model, as the registry holds them
    refused: dict[str, str]
    repository: list[State]
    folders: list[str]  # the repository's folders
    on_demand: list[str]  # the folders that would load on their first request (a memory budget)
    defaults: dict[str, str]  # task -> the model answering requests that name none


class Heartbeat(msgspec.Struct, tag="heartbeat", array_like=True):
    """The engine lives (every ``HEARTBEAT_S``): its pid and start, and each model's queue by class."""

    pid: int
    epoch: float  # when this engine process started: a new one means the old one died
    ready: bool
    depth: dict[str, dict[int, int]]  # model -> priority class -> items waiting


Broadcast = Models | Heartbeat

HEARTBEAT_S = 0.25  # how often the engine says it lives
ENGINE_SILENT_S = 2.0  # a front end counts an engine silent this long as gone
