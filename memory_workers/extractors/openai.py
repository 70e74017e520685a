"""Consolidation through an OpenAI-compatible chat-completions endpoint (OpenAI, Ollama, vLLM, llama.cpp server).

One attempt per call: retries and backoff belong to the worker plane, which sees ``ExtractionError.retryable``.
"""

from __future__ import annotations

from typing import Any

import httpx

from shared.config import ConsolidationSettings
from shared.errors import ExtractionError
from shared.extraction import EXTRACTION_JSON_SCHEMA, Extraction, ExtractionRequest, build_prompt, validate_extraction

SYSTEM_PROMPT = (
    "You are the Memory Butler's consolidation engine. You turn an AI agent's episodes into durable facts and "
    "rules about its user. Answer with one JSON object that matches the given schema, and nothing else."
)


class OpenAIExtractor:
    """POSTs the consolidation prompt to ``{openai_base_url}/chat/completions`` with a strict JSON schema."""

    name = "openai"

    def __init__(self, settings: ConsolidationSettings, *, transport: httpx.BaseTransport | None = None) -> None:
        self._url = settings.openai_base_url.rstrip("/") + "/chat/completions"
        self._model = settings.openai_model
        self._secret = settings.openai_api_key
        self._timeout = settings.openai_timeout_seconds
        self._format = settings.openai_response_format
        self._max_tokens = settings.openai_max_tokens
        headers = {"Authorization": f"Bearer {self._secret}"} if self._secret else {}
        # One client (and connection pool) per process, not per batch.
        self._client = httpx.Client(timeout=self._timeout, headers=headers, transport=transport)

    def extract(self, request: ExtractionRequest) -> Extraction:
        """One chat completion for the batch; any failure is an ExtractionError that never shows the API key."""
        body = {
            "model": self._model,
            "temperature": 0,
            "max_tokens": self._max_tokens,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": build_prompt(request)},
            ],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "extraction", "schema": EXTRACTION_JSON_SCHEMA, "strict": True},
            }
            if self._format == "json_schema"
            else {"type": "json_object", "schema": EXTRACTION_JSON_SCHEMA},
        }
        try:
            response = self._client.post(self._url, json=body)
        except httpx.TimeoutException as exc:
            raise self._error(f"no answer within {self._timeout:g}s ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise self._error(f"request failed: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 400:
            raise self._error(f"HTTP {response.status_code}: {response.text[:300]}")
        content = self._content(response)
        try:
            return validate_extraction(content, request)
        except ExtractionError as exc:
            raise self._error(exc.message, field=exc.field) from None

    def close(self) -> None:
        self._client.close()

    def _content(self, response: httpx.Response) -> str:
        """``choices[0].message.content`` of a chat.completion, or an ExtractionError saying what is missing."""
        try:
            choice: dict[str, Any] = response.json()["choices"][0]
            message: dict[str, Any] = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            not_completion = f"HTTP {response.status_code} but not a chat.completion: {response.text[:200]!r}"
            raise self._error(not_completion) from None
        if message.get("refusal"):
            raise self._error(f"the model refused: {str(message['refusal'])[:300]}")
        content = message.get("content")
        if choice.get("finish_reason") == "length":
            raise self._error("the answer was cut off at the token limit (finish_reason=length)")
        if not isinstance(content, str) or not content.strip():
            raise self._error(f"empty content in choices[0].message (finish_reason={choice.get('finish_reason')})")
        return content

    def _error(self, message: str, *, field: str | None = None) -> ExtractionError:
        text = f"openai extractor ({self._model} at {self._url}): {message}"
        if self._secret:
            text = text.replace(self._secret, "***")
        return ExtractionError(text, field=field)
