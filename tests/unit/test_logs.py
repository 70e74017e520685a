"""Structured logs (shared.logs): JSON lines written off the caller's thread, in forked children too."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

FORKING_PROGRAM = textwrap.dedent("""
    import logging, os
    from shared.logs import configure_logging, flush_logs

    configure_logging()
    logging.getLogger("parent").info("before the fork")
    pid = os.fork()
    if pid == 0:  # like a Celery pool process: forked from a process whose writer thread is running
        logging.getLogger("child").info("from the child", extra={"pid": os.getpid()})
        flush_logs()  # what the worker's pool-process shutdown hook does before os._exit
        os._exit(0)
    os.waitpid(pid, 0)
    logging.getLogger("parent").info("after the fork")
""")


def test_a_forked_child_writes_its_records_as_json_lines():
    # given a process with structured logging configured, which forks a child that logs
    done = subprocess.run([sys.executable, "-c", FORKING_PROGRAM], capture_output=True, text=True, timeout=60)

    # then both processes' records reach stderr, one JSON object per line (the child's through a writer of its own),
    # each exactly once and each process's in its own order; the two writers interleave by when they write
    # (the parent's writer gathers for WRITE_EVERY_S), so the order across processes is not pinned
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    by_logger = {name: [r["msg"] for r in lines if r["logger"] == name] for name in ("parent", "child")}
    assert len(lines) == 3
    assert by_logger == {"parent": ["before the fork", "after the fork"], "child": ["from the child"]}
    [child] = [r for r in lines if r["logger"] == "child"]
    assert isinstance(child["pid"], int) and child["level"] == "info"


GATHERING_PROGRAM = textwrap.dedent("""
    import logging, sys, time
    from shared.logs import WRITE_EVERY_S, configure_logging

    configure_logging()
    for i in range(500):  # a burst: the writer gathers it and writes it in a few wake-ups
        logging.getLogger("burst").info("line", extra={"i": i})
    time.sleep(10 * WRITE_EVERY_S)  # the process goes on, nothing stops the writer
    sys.stderr.write("MARK\\n")
    sys.stderr.flush()
""")


def test_lines_are_written_in_order_while_the_process_runs_not_only_at_exit():
    done = subprocess.run([sys.executable, "-c", GATHERING_PROGRAM], capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    written, _, after = done.stderr.partition("MARK\n")
    assert [json.loads(line)["i"] for line in written.splitlines()] == list(range(500))
    assert after == ""


FORMATTING_PROGRAM = textwrap.dedent("""
    import logging
    from shared.logs import configure_logging, flush_logs

    configure_logging()
    try:
        1 / 0
    except ZeroDivisionError:
        logging.getLogger("app").exception("failed for %s after %d tries", "tenant-a", 3, extra={"tool": "t"})
    flush_logs()
""")


def test_the_writer_formats_the_message_and_the_exception_of_a_record_it_was_handed_whole():
    # given a record with arguments and an exception, enqueued as it was made (the writer's thread formats it)
    done = subprocess.run([sys.executable, "-c", FORMATTING_PROGRAM], capture_output=True, text=True, timeout=60)

    # then its line holds the message with its arguments, the traceback and the caller's fields
    assert done.returncode == 0, done.stderr
    [line] = [json.loads(text) for text in done.stderr.splitlines()]
    assert line["msg"] == "failed for tenant-a after 3 tries"
    assert "ZeroDivisionError: division by zero" in line["exc"]
    assert line["tool"] == "t" and line["level"] == "error"
