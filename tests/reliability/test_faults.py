"""Faults against a real `python -m service` process: Redis dying under load, a client hanging up
mid-stream, a model folder broken before start-up, and a model call failing for one input of a batch.

(SIGTERM under load is in test_shutdown.py.)
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import onnx
from conftest import RedisServer
from servers import ServiceProcess, hang_up_after_first_event, metric
from tokenizers import Tokenizer

from harness.ports import free_port
from service.engine.manifest import MANIFEST, content_version, file_sha256


def rehash(model_dir: Path) -> None:
    """Record the folder's current files in its manifest (a new, consistent version)."""
    path = model_dir / MANIFEST
    manifest = json.loads(path.read_text())
    for name, entry in manifest["files"].items():
        entry.update(sha256=file_sha256(model_dir / name), bytes=(model_dir / name).stat().st_size)
    manifest["version"] = content_version(manifest["files"])
    path.write_text(json.dumps(manifest, indent=2))


# --- Redis killed and restarted while requests keep coming --------------------------------------


def test_redis_killed_and_restarted_during_load_fails_no_request(tiny_models: Path, tmp_path: Path) -> None:
    redis_server = RedisServer(tmp_path)
    redis_server.start()
    env = {
        "MODEL_REPOSITORY": str(tiny_models),
        "REDIS_URL": redis_server.url,
        "REDIS_TIMEOUT_S": "0.2",
        "CACHE_RETRY_INTERVAL_S": "0.3",
        "INTRA_OP_THREADS": "1",
    }
    bodies = [("/v1/classify", {"text": f"a {word} film"}) for word in ("fine", "dull", "long", "bright")] + [
        ("/v1/translate", {"text": "A dog runs.", "max_new_tokens": 12})
    ]
    results: list[tuple[str, int, bool]] = []  # (phase, status, cached)
    phase = ["before"]
    stop = threading.Event()

    def client_loop(worker: int) -> None:
        with httpx.Client(base_url=service.url, timeout=60) as client:
            n = worker
            while not stop.is_set():
                path, body = bodies[n % len(bodies)]
                n += 1
                r = client.post(path, json=body)
                results.append((phase[0], r.status_code, r.status_code == 200 and r.json()["cached"]))

    with ServiceProcess(free_port(), env, tmp_path / "service.log") as service:
        with ThreadPoolExecutor(4) as pool:
            for w in range(4):
                pool.submit(client_loop, w)
            time.sleep(2)
            phase[0] = "down"
            redis_server.stop()
            time.sleep(3)
            phase[0] = "restarting"
            redis_server.start()  # same port, empty
            time.sleep(1)
            phase[0] = "back"
            time.sleep(2)
            stop.set()
        errors = metric(service.url, "tserve_cache_errors_total", backend="redis")
        log = service.log()
    redis_server.stop()

    statuses = Counter(status for _, status, _ in results)
    assert statuses == {200: len(results)}, statuses  # not one request failed
    by_phase = {
        p: [cached for phase_, _, cached in results if phase_ == p] for p in ("before", "down", "back")
    }
    assert all(by_phase.values()), {p: len(v) for p, v in by_phase.items()}
    assert any(by_phase["before"]) and any(by_phase["back"])  # the cache served before and after
    assert not any(by_phase["down"][len(by_phase["down"]) // 2 :])  # while it was down: computed
    assert errors > 0
    assert 1 <= log.count("redis cache unavailable") <= 3  # logged at most once per interval
    assert "redis cache reachable again" in log


# --- a client hangs up in the middle of a stream --------------------------------------------------


def test_disconnect_mid_stream_stops_decoding(tiny_models: Path, tmp_path: Path) -> None:
    env = {"MODEL_REPOSITORY": str(tiny_models), "CACHE_ENABLED": "false", "MAX_RUNNING_SEQUENCES": "4"}
    with ServiceProcess(free_port(), env, tmp_path / "service.log") as service:
        context = next(m for m in httpx.get(f"{service.url}/v1/models").json()["data"] if m["name"] == "gpt")[
            "limits"
        ]["max_sequence_length"]
        load = {"prompt": "O", "max_new_tokens": context - 4, "temperature": 0.8, "seed": 1}
        body = {"prompt": "ROMEO:", "max_new_tokens": context - 8, "temperature": 0, "stream": True}
        dropped = 0.0
        with ThreadPoolExecutor(3) as pool:
            for _attempt in range(5):  # the tiny model is fast: keep the batch busy so the hang-up lands
                busy = [
                    pool.submit(httpx.post, f"{service.url}/v1/generate", json=load, timeout=60)
                    for _ in range(3)
                ]
                hang_up_after_first_event(service.url, "/v1/generate", body)
                assert all(f.result().status_code == 200 for f in busy)
                deadline = time.monotonic() + 5
                while dropped == 0 and time.monotonic() < deadline:
                    dropped = metric(
                        service.url,
                        "tserve_requests_dropped_total",
                        model="gpt",
                        reason="client_disconnected",
                    )
                    time.sleep(0.05)
                if dropped:
                    break
        assert dropped >= 1
        # The sequence left the batch: nothing is running once the load is done.
        assert metric(service.url, "tserve_model_in_flight", model="gpt") == 0
        assert httpx.get(f"{service.url}/health/ready").status_code == 200


# --- a model folder corrupted before start-up -------------------------------------------------------


def test_corrupted_folders_are_reported_and_the_rest_serve(model_repo: Path, tmp_path: Path) -> None:
    graph = model_repo / "vit" / "model.onnx"
    data = bytearray(graph.read_bytes())
    data[len(data) // 3] ^= 0xFF
    graph.write_bytes(bytes(data))
    (model_repo / "translator" / "decoder.onnx").unlink()
    env = {"MODEL_REPOSITORY": str(model_repo)}
    with ServiceProcess(free_port(), env, tmp_path / "service.log") as service:
        ready = httpx.get(f"{service.url}/health/ready")
        assert ready.status_code == 200
        refused = ready.json()["refused"]
        assert set(refused) == {"vit", "translator"}
        assert "sha256" in refused["vit"] and "decoder.onnx" in refused["translator"]
        assert set(ready.json()["models"]) == {
            "bert-classifier",
            "bert-qa",
            "bert-tagger",
            "bert-embedder",
            "bert-reranker",
            "gpt",
        }
        assert httpx.post(f"{service.url}/v1/classify", json={"text": "fine"}).status_code == 200
        missing = httpx.post(f"{service.url}/v1/translate", json={"text": "A dog."})
        assert missing.status_code == 404 and missing.json()["error"]["field"] == "model"
    log = service.log()
    assert sum("refusing model folder" in line for line in log.splitlines()) == 2


# --- a model call that fails for one input of a batch -------------------------------------------------


def break_high_token_ids(model_dir: Path, keep: int) -> None:
    """Cut the classifier's word-embedding table to its first ``keep`` rows (a real, consistent model
    folder): ONNX Runtime then fails at run time on any text holding a token id >= keep."""
    path = model_dir / "model.onnx"
    model = onnx.load(path)
    gather = next(n for n in model.graph.node if n.op_type == "Gather" and "input_ids" in n.input)
    table = next(i for i in model.graph.initializer if i.name == gather.input[0])
    weights = onnx.numpy_helper.to_array(table)[:keep]
    table.CopyFrom(onnx.numpy_helper.from_array(weights, table.name))
    onnx.save(model, path)
    rehash(model_dir)


def test_inference_error_fails_only_its_request(model_repo: Path, tmp_path: Path) -> None:
    model_dir = model_repo / "bert-classifier"
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    keep = tokenizer.get_vocab_size() - 40
    vocab = tokenizer.get_vocab()
    culprit = next(t for t, i in sorted(vocab.items(), key=lambda x: -x[1]) if i >= keep and t.isalpha())
    good = ["a fine film", "a dull film", "the end", "warm-up", "so so"]
    assert all(max(tokenizer.encode(t).ids) < keep for t in good)
    assert max(tokenizer.encode(culprit).ids) >= keep
    break_high_token_ids(model_dir, keep)

    env = {
        "MODEL_REPOSITORY": str(model_repo),
        "MAX_QUEUE_DELAY_MS": "500",  # the concurrent requests below share one batch
        "MAX_BATCH_SIZE": "16",
        "CACHE_ENABLED": "false",
        "MODEL_VARIANT": "reference",  # the graph broken above (by default a fused variant serves)
    }
    with ServiceProcess(free_port(), env, tmp_path / "service.log") as service:
        texts = [*good, culprit]
        with ThreadPoolExecutor(len(texts)) as pool:
            answers: list[Any] = list(
                pool.map(
                    lambda t: httpx.post(
                        f"{service.url}/v1/classify",
                        json={"text": t},
                        headers={"X-Request-ID": f"fault-{texts.index(t)}"},
                        timeout=60,
                    ),
                    texts,
                )
            )
        assert [a.status_code for a in answers] == [200] * len(good) + [500]
        error = answers[-1].json()["error"]
        assert error["type"] == "internal_error" and error["request_id"] == f"fault-{len(good)}"
        assert culprit not in answers[-1].text  # no input echoed back
        # The worker survived: the same model keeps answering, readiness holds.
        assert httpx.post(f"{service.url}/v1/classify", json={"text": "still here"}).status_code == 200
        assert httpx.get(f"{service.url}/health/ready").status_code == 200
        log = service.log()
    assert "retrying its items one by one" in log  # the culprit really shared a batch with the others
    assert f"[fault-{len(good)} bert-classifier]" in log  # the error's log line carries its request id
