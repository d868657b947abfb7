"""Turn a locust run's CSV files into ``summary.md`` and PNG plots.

``loadtests/run`` calls :func:`write_report` after locust ends; to redo it for an output folder::

    .venv/bin/python loadtests/loadtest_report.py artifacts/loadtest-20260101-120000

Reads ``<prefix>_stats.csv``, ``<prefix>_failures.csv`` and ``<prefix>_stats_history.csv`` (locust's
``--csv <prefix> --csv-full-history``), plus ``run.json`` (the runner's settings, the served models) and
``load_stats.json`` (the locustfile's mix and cache-hit counts) when present. Writes ``summary.md``,
``latency_percentiles.png`` (p50/p95/p99 per endpoint), ``latency_over_time.png`` and
``throughput_over_time.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

# Rows the streaming user adds that are measurements, not endpoints.
STREAM_METRICS = ("generate-stream ttft", "generate-stream ms/token")
STREAM_ROW = "/v1/generate [stream]"
PLOTS = ("latency_percentiles.png", "latency_over_time.png", "throughput_over_time.png")


def _num(value: str | None) -> float:
    try:
        return float(value) if value not in (None, "", "N/A") else math.nan
    except ValueError:
        return math.nan


def _fmt(value: float, digits: int = 0) -> str:
    if value is None or math.isnan(value):
        return "–"
    return f"{value:,.{digits}f}"


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _load_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def endpoint_rows(stats: list[dict[str, str]]) -> list[dict[str, str]]:
    """The per-endpoint rows: not the aggregate, not the streaming measurements."""
    return [r for r in stats if r["Name"] != "Aggregated" and r["Name"] not in STREAM_METRICS]


def summary_markdown(out: Path, prefix: str = "locust") -> str:
    stats = read_csv(out / f"{prefix}_stats.csv")
    failures = read_csv(out / f"{prefix}_failures.csv")
    run = _load_json(out / "run.json")
    load = _load_json(out / "load_stats.json")
    cache = load.get("cache", {})

    lines = [f"# Load test {run.get('started', '')}".rstrip(), ""]
    if run:
        target = run.get("host", "?")
        started = "started by loadtests/run" if run.get("started_service") else "already running"
        lines.append(f"- **Target**: {target} ({started})")
        if run.get("models_dir"):
            lines.append(f"- **Model repository**: `{run['models_dir']}`")
        lines.append(f"- **Response cache**: {run.get('cache', '?')}")
        lines.append(
            f"- **Load**: {run.get('users')} users (spawn rate {run.get('spawn_rate')}/s) for {run.get('duration')}, "
            f"mix **{load.get('mix', run.get('mix', '?'))}**"
            + (f" (pool of {load['pool_size']} inputs per endpoint)" if load.get("pool_size") else "")
            + (f", {load['batch']} inputs per request" if load.get("batch", 1) != 1 else "")
            + f", max_new_tokens {load.get('max_new_tokens', '?')}"
        )
        if load.get("weights"):
            weights = ", ".join(f"{k}={v}" for k, v in load["weights"].items())
            lines.append(f"- **User weights**: {weights}")
        if run.get("machine"):
            lines.append(f"- **Machine**: {run['machine']}")
        models = run.get("models") or []
        if models:
            served = ", ".join(
                f"{m.get('name')} ({m.get('version')}, {m.get('execution_provider', '?')})" for m in models
            )
            lines.append(f"- **Models**: {served}")
    if load.get("sources"):
        where = load.get("data_dir") or "built-in samples"
        fallback = sorted(k for k, v in load["sources"].items() if v == "built-in")
        note = f" (built-in samples for: {', '.join(fallback)})" if fallback and load.get("data_dir") else ""
        lines.append(f"- **Inputs**: validation splits from `{where}`{note}")
    lines.append("")

    lines += [
        "## Requests by endpoint",
        "",
        "Latencies in milliseconds, over the whole run (locust's CSV, written once a second, so the last "
        "second may be missing). `cached`: successful responses that said `cached: true`, out of those "
        "the locustfile counted.",
        "",
        "| endpoint | requests | failures | req/s | p50 | p95 | p99 | mean | max | cached |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    total_n = total_fail = total_rps = 0.0
    for r in endpoint_rows(stats):
        n, fails = int(_num(r["Request Count"])), int(_num(r["Failure Count"]))
        rps = _num(r["Requests/s"])
        total_n, total_fail, total_rps = total_n + n, total_fail + fails, total_rps + rps
        hits = cache.get(r["Name"])
        cached = f"{hits['cached']}/{hits['responses']}" if hits else "–"
        fail_text = f"{fails} ({100 * fails / n:.1f}%)" if n else "0"
        lines.append(
            f"| {r['Type']} {r['Name']} | {n} | {fail_text} | {_fmt(rps, 2)} | {_fmt(_num(r['50%']))} "
            f"| {_fmt(_num(r['95%']))} | {_fmt(_num(r['99%']))} | {_fmt(_num(r['Average Response Time']))} "
            f"| {_fmt(_num(r['Max Response Time']))} | {cached} |"
        )
    if stats:
        lines.append(
            f"| **all endpoints** | {int(total_n)} | {int(total_fail)} | {_fmt(total_rps, 2)} | | | | | | |"
        )
    else:
        lines.append("| (no statistics: locust wrote no stats CSV) | | | | | | | | | |")
    lines.append("")

    by_name = {r["Name"]: r for r in stats}
    stream = by_name.get(STREAM_ROW)
    if stream or any(m in by_name for m in STREAM_METRICS):
        lines += [
            "## Streaming generation (SSE)",
            "",
            "| measure | n | p50 | p95 | p99 | mean |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        ttft = by_name.get("generate-stream ttft")
        if ttft:
            lines.append(
                f"| time to first token (ms) | {ttft['Request Count']} | {_fmt(_num(ttft['50%']))} "
                f"| {_fmt(_num(ttft['95%']))} | {_fmt(_num(ttft['99%']))} | {_fmt(_num(ttft['Average Response Time']))} |"
            )
        tpot = by_name.get("generate-stream ms/token")
        if tpot:
            lines.append(
                f"| time per output token (ms) | {tpot['Request Count']} | {_fmt(_num(tpot['50%']), 1)} "
                f"| {_fmt(_num(tpot['95%']), 1)} | {_fmt(_num(tpot['99%']), 1)} "
                f"| {_fmt(_num(tpot['Average Response Time']), 1)} |"
            )

            def rate(ms: float) -> float:
                return 1000 / ms if ms and not math.isnan(ms) else math.nan

            # A slower token (a higher percentile of ms/token) is a lower rate: p95 of the time is p5 of the rate.
            lines.append(
                f"| decode tokens/s per stream (1000 / the row above) | {tpot['Request Count']} "
                f"| {_fmt(rate(_num(tpot['50%'])), 1)} | {_fmt(rate(_num(tpot['95%'])), 1)} (5th pct.) "
                f"| {_fmt(rate(_num(tpot['99%'])), 1)} (1st pct.) "
                f"| {_fmt(rate(_num(tpot['Average Response Time'])), 1)} |"
            )
        if stream:
            tokens = _num(stream["Average Content Size"])
            mean_s = _num(stream["Average Response Time"]) / 1000
            lines += [
                "",
                f"Streams: {stream['Request Count']}, {_fmt(tokens, 1)} tokens each on average, "
                f"{_fmt(tokens / mean_s if mean_s else math.nan, 1)} tokens/s per stream end to end, "
                f"{_fmt(tokens * _num(stream['Requests/s']), 1)} tokens/s over all streams.",
            ]
        lines.append("")

    lines += ["## Failures", ""]
    if failures:
        lines += ["| endpoint | error | occurrences |", "|---|---|---:|"]
        for f in sorted(failures, key=lambda f: -int(_num(f["Occurrences"]))):
            error = f["Error"].replace("|", "\\|").replace("\n", " ")[:300]
            lines.append(f"| {f['Method']} {f['Name']} | {error} | {f['Occurrences']} |")
    else:
        lines.append("None.")
    lines += ["", "## Plots", ""]
    lines += [f"![{Path(p).stem}]({p})" for p in PLOTS if (out / p).is_file()]
    lines += [
        "",
        f"Locust's own report: [report.html](report.html); raw numbers: `{prefix}_stats.csv`, "
        f"`{prefix}_stats_history.csv`, `{prefix}_failures.csv`.",
        "",
    ]
    return "\n".join(lines)


def write_plots(out: Path, prefix: str = "locust") -> list[Path]:
    """The three PNGs (those it has data for); matplotlib with the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = endpoint_rows(read_csv(out / f"{prefix}_stats.csv"))
    stats += [r for r in read_csv(out / f"{prefix}_stats.csv") if r["Name"] == "generate-stream ttft"]
    history = read_csv(out / f"{prefix}_stats_history.csv")
    written: list[Path] = []

    if stats:
        names = [f"{r['Name']}" for r in stats]
        fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(names) + 3), 5))
        width = 0.27
        for k, (pct, color) in enumerate((("50%", "#4c72b0"), ("95%", "#dd8452"), ("99%", "#c44e52"))):
            values = [_num(r[pct]) for r in stats]
            ax.bar(
                [i + (k - 1) * width for i in range(len(names))],
                values,
                width,
                label=f"p{pct[:-1]}",
                color=color,
            )
        ax.set_xticks(range(len(names)), names, rotation=25, ha="right")
        ax.set_ylabel("latency (ms)")
        ax.set_title("Latency percentiles by endpoint (whole run)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        written.append(out / PLOTS[0])
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

    rows = [r for r in history if r.get("Timestamp")]
    if rows:
        t0 = min(_num(r["Timestamp"]) for r in rows)
        series: dict[str, list[dict[str, str]]] = {}
        for r in rows:
            series.setdefault(r["Name"], []).append(r)
        aggregate = series.pop("Aggregated", [])
        for metric in STREAM_METRICS[1:]:
            series.pop(metric, None)

        def xs(rs: list[dict[str, str]]) -> list[float]:
            return [_num(r["Timestamp"]) - t0 for r in rs]

        fig, axes = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
        if aggregate:
            for pct, style in (("50%", "-"), ("95%", "--"), ("99%", ":")):
                axes[0].plot(
                    xs(aggregate),
                    [_num(r[pct]) for r in aggregate],
                    style,
                    color="black",
                    label=f"p{pct[:-1]}",
                )
        axes[0].set_title("All requests: latency percentiles (locust's rolling window)")
        for name, rs in sorted(series.items()):
            axes[1].plot(xs(rs), [_num(r["95%"]) for r in rs], label=name)
        axes[1].set_title("p95 latency by endpoint")
        for ax in axes:
            ax.set_ylabel("latency (ms)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="upper left")
        axes[1].set_xlabel("seconds since start")
        fig.tight_layout()
        written.append(out / PLOTS[1])
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(11, 5))
        for name, rs in sorted(series.items()):
            if name not in STREAM_METRICS:
                ax.plot(xs(rs), [_num(r["Requests/s"]) for r in rs], label=name, linewidth=1)
        if aggregate:
            # The aggregate counts the ttft and ms/token rows too: take them out again.
            per_time: dict[float, float] = {}
            for r in rows:
                if r["Name"] in STREAM_METRICS:
                    stamp = _num(r["Timestamp"])
                    per_time[stamp] = per_time.get(stamp, 0.0) + _num(r["Requests/s"])
            total = [_num(r["Requests/s"]) - per_time.get(_num(r["Timestamp"]), 0) for r in aggregate]
            ax.plot(xs(aggregate), total, color="black", linewidth=2, label="all endpoints")
            ax.plot(
                xs(aggregate), [_num(r["Failures/s"]) for r in aggregate], color="red", label="failures/s"
            )
            users = ax.twinx()
            users.plot(
                xs(aggregate),
                [_num(r["User Count"]) for r in aggregate],
                color="grey",
                alpha=0.5,
                drawstyle="steps-post",
            )
            users.set_ylabel("users", color="grey")
            users.set_ylim(bottom=0)
        ax.set_title("Throughput (locust's rolling window)")
        ax.set_xlabel("seconds since start")
        ax.set_ylabel("requests/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        fig.tight_layout()
        written.append(out / PLOTS[2])
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def write_report(out: Path, prefix: str = "locust") -> Path:
    """Plots first (the summary links those that exist), then ``summary.md``; returns its path."""
    try:
        write_plots(out, prefix)
    except ImportError as exc:  # matplotlib is in the export extra; the summary does not need it
        print(f"loadtest report: no plots ({exc})", file=sys.stderr)
    path = out / "summary.md"
    path.write_text(summary_markdown(out, prefix), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the run's output folder")
    parser.add_argument("--prefix", default="locust", help="locust's --csv prefix inside it")
    args = parser.parse_args(argv)
    print(write_report(args.out, args.prefix).read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
