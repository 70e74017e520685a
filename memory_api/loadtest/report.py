"""How a load test shows itself: a live progress bar, the summary table, the JSON of every figure, the PNG plot."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from memory_api.loadtest.generator import TenantPlan
from memory_api.loadtest.metrics import Recorder, latency_summary


class Live:
    """The progress bar: accepted of planned during the burst, then the backlog draining to zero."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.task: TaskID | None = None

    def phase(self, description: str, total: int) -> None:
        if self.progress is None:
            return
        if self.task is not None:
            self.progress.stop_task(self.task)
        self.task = self.progress.add_task(description, total=max(total, 1), info="")

    def update(self, completed: int, info: str = "", total: int | None = None) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.update(  # total=None keeps the task's total
                self.task, completed=completed, info=info, total=max(total, 1) if total is not None else None
            )


@contextmanager
def live(console: Console, *, quiet: bool) -> Iterator[Live]:
    if quiet:
        yield Live(None)
        return
    columns = (
        TextColumn("{task.description:<9}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*columns, console=console, transient=False, refresh_per_second=4) as progress:
        yield Live(progress)


def burst_info(recorder: Recorder) -> str:
    """The line beside the bar: rate over the last 2 s, backlog, retries."""
    now = recorder.now()
    recent = sum(n for t, _, n in recorder.calls[-2000:] if t >= now - 2.0) / 2.0
    sample = recorder.samples[-1] if recorder.samples else {}
    retries = sum(v for k, v in recorder.counts.items() if k.startswith("retried_") or k == "transport_errors")
    backlog = sample.get("backlog")
    return f"{recent:6.0f}/s  backlog {backlog if backlog is not None else '?':>6}  retries {retries}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def summary_table(figures: dict[str, Any]) -> Table:
    s = figures["summary"]
    table = Table(title=f"memory-butler loadtest burst {figures['run_id']}", show_header=False)
    table.add_column("figure", style="bold")
    table.add_column("value")
    rows = [
        ("target", f"{figures['config']['url']}  ({figures['config'].get('chaos') or 'no drill'})"),
        (
            "planned",
            f"{s['planned']} episodes, {figures['config']['clients']} clients, "
            f"{figures['config']['tenants']} tenants x {figures['config']['butlers']} butlers, "
            + (f"batches of {figures['config']['batch']}" if figures["config"]["batch"] else "single calls"),
        ),
        ("accepted", f"{s['accepted']} in {s['burst_seconds']:.1f} s = {s['accepted_per_s']:.0f} episodes/s"),
        (
            "accept latency",
            f"p50 {_ms(s['accept_ms']['p50'])}  p95 {_ms(s['accept_ms']['p95'])}  "
            f"p99 {_ms(s['accept_ms']['p99'])}  max {_ms(s['accept_ms']['max'])}",
        ),
        ("with retries", f"p99 {_ms(s['accept_total_ms']['p99'])}  max {_ms(s['accept_total_ms']['max'])}"),
        ("stored", _stored(s, figures.get("database"))),
        ("consolidated", _consolidated(s, figures.get("database"))),
        (
            "reads",
            f"{s['reads']['count']} ({s['read_rps']:.1f}/s)  p50 {_ms(s['reads']['p50'])}  "
            f"p95 {_ms(s['reads']['p95'])}  degraded {s['reads_degraded']}"
            if s["reads"]["count"]
            else "none",
        ),
        ("retries", ", ".join(f"{k} {v}" for k, v in sorted(figures["counts"].items()) if v) or "none"),
        (
            "cpu (cores)",
            "  ".join(f"{name} {c['cores']:.2f}" for name, c in figures.get("cpu", {}).items())
            + "  (during the burst)",
        ),
        ("verification", _verification(figures)),
    ]
    if figures.get("reference"):
        rows.insert(-1, ("machine speed", figures["reference"].removeprefix("reference (machine speed): ")))
    for label, value in rows:
        table.add_row(label, value)
    return table


def _stored(s: dict[str, Any], db: dict[str, Any] | None) -> str:
    if db is None:
        return "not measured (no database URL)"
    if s.get("applied_after_burst_s") is None:
        return f"{db['stored']} of {s['accepted']}; NOT all applied"
    return (
        f"{db['stored']} of {s['accepted']}; all applied {_secs(s['applied_after_burst_s'])} after the burst "
        f"({_rate(s.get('drain_episodes_per_s'))})"
    )


def _consolidated(s: dict[str, Any], db: dict[str, Any] | None) -> str:
    if db is None:
        return "not measured (no database URL)"
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(db.get("consolidation_status", {}).items()))
    if s.get("consolidated_after_burst_s") is None:
        return f"backlog NOT drained; {statuses}"
    return f"drained {_secs(s['consolidated_after_burst_s'])} after the burst; {statuses}"


def _secs(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} episodes/s"


def _verification(figures: dict[str, Any]) -> str:
    db, iso = figures.get("database"), figures.get("isolation") or {}
    if db is None:
        line = (
            f"database checks skipped (no database URL); cross-tenant through MCP {iso.get('leaks', 0)} "
            f"in {iso.get('probes', 0)} probes"
        )
    else:
        unapplied = f"unapplied {db['unapplied']}, " if db.get("unapplied") else ""
        line = (
            f"lost {db['lost']}, {unapplied}duplicated {db['duplicated']}, out of order {db['out_of_order']}, "
            f"not terminal {db['non_terminal']}, cross-tenant {db['cross_tenant_sql'] + iso.get('leaks', 0)}"
        )
    if figures["failures"]:
        return f"[red]FAILED[/]: {line}\n" + "\n".join(f"  - {f}" for f in figures["failures"])
    return f"[green]PASSED[/]: {line}"


def write_json(figures: dict[str, Any], recorder: Recorder, path: Path) -> None:
    raw = {
        "samples": recorder.samples,
        "events": recorder.events,
        "calls": recorder.calls,
        "reads": recorder.reads,
        "accepts": recorder.accepts_json(),
    }
    path.write_text(json.dumps({**figures, "raw": raw}, indent=1, default=str))


def write_plot(recorder: Recorder, figures: dict[str, Any], path: Path) -> None:
    """Four panels over time: accept latency, accepted vs stored, backlog, read latency; drills shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = recorder.samples
    t = [s["t"] for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(11, 12), sharex=True)
    ax = axes[0]
    ax.scatter([c[0] for c in recorder.calls], [c[1] for c in recorder.calls], s=2, alpha=0.4)
    ax.set_ylabel("accept latency (ms)")
    ax.set_yscale("log")
    ax = axes[1]
    ax.plot(t, [s["accepted"] for s in samples], label="accepted (client)")
    ax.plot(t, [s["stored"] for s in samples], label="stored (episodes rows)")
    ax.set_ylabel("episodes")
    ax.legend(loc="upper left")
    ax = axes[2]
    ax.plot(t, [s["pending_intents"] for s in samples], label="pending write intents")
    ax.plot(t, [s["unconsolidated"] for s in samples], label="unconsolidated episodes")
    ax.set_ylabel("backlog")
    ax.legend(loc="upper left")
    ax = axes[3]
    ax.scatter(
        [r[0] for r in recorder.reads],
        [r[1] for r in recorder.reads],
        s=2,
        alpha=0.4,
        c=["red" if r[2] else "tab:blue" for r in recorder.reads],
    )
    ax.set_ylabel(f"{figures['config']['read_tool']} latency (ms)")
    if not recorder.reads:
        ax.text(0.5, 0.5, "no readers in this run", transform=ax.transAxes, ha="center", color="grey")
    ax.set_xlabel("seconds since start")
    for ax in axes:
        _mark(ax, recorder)
    fig.suptitle(
        f"loadtest {figures['run_id']}: {figures['summary']['accepted']} episodes, "
        f"{figures['config'].get('chaos') or 'no drill'}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _mark(ax: Any, recorder: Recorder) -> None:
    if recorder.burst_ended is not None:
        ax.axvline(recorder.burst_ended, color="grey", linestyle="--", linewidth=0.8)
    times = {e["event"]: e["t"] for e in recorder.events}
    for name, start in times.items():
        if name.endswith("_break"):  # from breaking it to having restored it
            end = times.get(name[: -len("_break")] + "_restored", recorder.burst_ended or start)
            ax.axvspan(start, end, color="orange", alpha=0.2)


def figures(
    config: Any,
    recorder: Recorder,
    *,
    url: str,
    run_id: str,
    tenants: Sequence[TenantPlan],
    drained: bool | None,
    drained_at: float,
    cpu: dict[str, Any],
    has_drill: bool,
    reference: str | None = None,
) -> dict[str, Any]:
    """Every figure of the run (the JSON's top level; the raw series are added by :func:`write_json`)."""
    accepts, ended = recorder.accepts, recorder.burst_ended or recorder.now()
    first = min((a.first_sent_at for a in accepts), default=0.0)
    burst_s = max(ended - first, 1e-6)
    all_stored = next(
        (s["t"] for s in recorder.samples if s["stored"] is not None and s["stored"] >= len(accepts)), None
    )
    reads = [r[1] for r in recorder.reads]
    settings = {k: v for k, v in asdict(config).items() if k not in ("tokens", "database_url")}
    return {
        "run_id": run_id,
        "config": {
            **settings,
            "url": url,
            "out_dir": str(config.out_dir),
            "data_dir": str(config.data_dir) if config.data_dir else None,
        },
        "tenants": [{"tenant_id": t.tenant_id, "marker": t.marker, "butlers": list(t.butlers)} for t in tenants],
        "counts": dict(recorder.counts),
        "events": recorder.events,
        "drained": drained,
        "drain_timeout_s": config.drain_timeout_s,
        "accepted_while_db_down": recorder.accepted_within(w) if (w := recorder.window("postgres")) else 0,
        "cpu": cpu,
        "reference": reference,
        "summary": {
            "planned": config.episodes,
            "accepted": len(accepts),
            "burst_seconds": burst_s,
            "accepted_per_s": len(accepts) / burst_s,
            "accept_ms": latency_summary([c[1] for c in recorder.calls]),
            "accept_total_ms": latency_summary([a.total_ms for a in accepts]),
            "applied_after_burst_s": max(0.0, all_stored - ended) if all_stored is not None else None,
            "drain_episodes_per_s": len(accepts) / max(all_stored - first, 1e-6) if all_stored is not None else None,
            "consolidated_after_burst_s": max(0.0, drained_at - ended) if drained else None,
            "reads": latency_summary(reads),
            "read_rps": len(reads) / burst_s,
            "reads_degraded": sum(r[2] for r in recorder.reads),
            "loadgen_cpu_percent": 100 * cpu.get("loadtest", {}).get("cores", 0.0),
            "drill": config.chaos if has_drill else None,
        },
    }


def write(out_dir: Path, figures: dict[str, Any], recorder: Recorder, console: Console) -> dict[str, Any]:
    """The PNG and the JSON in ``out_dir``, the summary table on stdout; returns ``figures`` with their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"loadtest-{figures['run_id']}"
    figures["files"] = {"json": str(stem.with_suffix(".json")), "png": str(stem.with_suffix(".png"))}
    write_plot(recorder, figures, Path(figures["files"]["png"]))
    write_json(figures, recorder, Path(figures["files"]["json"]))
    Console().print(summary_table(figures))
    console.print(f"wrote {figures['files']['json']} and {figures['files']['png']}")
    return figures
