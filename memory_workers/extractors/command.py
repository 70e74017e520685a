"""Consolidation through an external command (e.g. a coding-agent CLI): the prompt on stdin, JSON on stdout."""

from __future__ import annotations

import os
import signal
import subprocess

from shared.config import ConsolidationSettings
from shared.errors import ExtractionError
from shared.extraction import Extraction, ExtractionRequest, build_prompt, validate_extraction


class CommandExtractor:
    """Runs ``consolidation.command`` once per batch; it must print one extraction JSON object and exit 0."""

    name = "command"

    def __init__(self, settings: ConsolidationSettings) -> None:
        self._command = list(settings.command)
        self._timeout = settings.command_timeout_seconds

    def extract(self, request: ExtractionRequest) -> Extraction:
        """Feed build_prompt(request) to the command and validate what it prints, or raise ExtractionError."""
        if not self._command:
            raise ExtractionError("consolidation.command is empty", field="consolidation.command")
        stdout = self._run(build_prompt(request))
        try:
            return validate_extraction(stdout, request)
        except ExtractionError as exc:
            raise ExtractionError(f"{self._label}: {exc.message}", field=exc.field) from None

    @property
    def _label(self) -> str:
        return f"command extractor ({os.path.basename(self._command[0])})"

    def _run(self, prompt: str) -> str:
        try:
            # A session of its own, so a timeout can kill the command together with anything it spawned.
            proc = subprocess.Popen(
                self._command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                encoding="utf-8",
                errors="replace",
                start_new_session=True,
            )
        except OSError as exc:
            raise ExtractionError(f"{self._label}: cannot start {self._command[0]!r}: {exc.strerror or exc}") from None
        with proc:
            try:
                stdout, stderr = proc.communicate(prompt, timeout=self._timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.communicate()
                raise ExtractionError(f"{self._label}: no answer within {self._timeout:g}s; killed") from None
            except BaseException:  # e.g. the task's soft time limit: never leave the command running
                _kill_group(proc)
                raise
        if proc.returncode != 0:
            raise ExtractionError(f"{self._label}: exited with status {proc.returncode}: {stderr[-500:].strip()}")
        return stdout


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
