"""The remote extractors against real peers: a local chat-completions HTTP server and real subprocesses."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from memory_workers.extractors import CommandExtractor, HeuristicExtractor, OpenAIExtractor, build_extractor
from shared.config import ConsolidationSettings
from shared.errors import ExtractionError
from shared.extraction import EXTRACTION_JSON_SCHEMA, EpisodeIn, ExtractionRequest, KnownFact

FAKE_CMD = Path(__file__).resolve().parents[1] / "fixtures" / "fake_extractor_cmd.py"
API_KEY = "sk-test-not-a-real-key-1234"
E1, E2 = "3f0c6a52-3b0b-4a8e-9a57-0d2d3c1e0a01", "3f0c6a52-3b0b-4a8e-9a57-0d2d3c1e0a02"
KNOWN_FACT = "9b1e3a1c-2d4f-4c5a-8e6f-7a8b9c0d1e2f"


def _request() -> ExtractionRequest:
    at = datetime(2025, 3, 1, 9, 30, tzinfo=timezone.utc)
    return ExtractionRequest(
        tenant_id="default",
        butler="health",
        episodes=[
            EpisodeIn(
                id=E1,
                seq=1,
                butler="health",
                created_at=at,
                importance=6,
                content="User mentioned they are allergic to peanuts.\nUser said: never call after 9pm.",
            ),
            EpisodeIn(
                id=E2,
                seq=2,
                butler="health",
                created_at=at,
                importance=4,
                content="I just moved to Lisbon. I had ramen for dinner.",
            ),
        ],
        facts=[
            KnownFact(
                id=KNOWN_FACT,
                subject="user",
                predicate="lives_in",
                content="User lives in Berlin",
                permanence="stable",
                scope="global",
            )
        ],
        rules=[],
    )


# ---- a chat-completions server ------------------------------------------------------------------------------

_EPISODE = re.compile(
    r"^- episode (?P<id>\S+) \(at (?P<at>[^,]+), importance (?P<imp>[^)]+)\):\n(?P<body>(?:    .*(?:\n|$))+)", re.M
)
_FACT = re.compile(
    r"^- fact (?P<id>\S+): (?P<s>[^|]+) \| (?P<p>[^|]+) \| (?P<c>.+) \(permanence: (?P<perm>\w+), "
    r"scope: (?P<scope>[^)]+)\)$",
    re.M,
)


def _model_answer(prompt: str) -> dict[str, Any]:
    """What the fake model answers: the heuristic extractor's reading of the request recovered from the prompt."""
    butler = re.search(r"episodes from the (\S+) butler", prompt).group(1)  # type: ignore[union-attr]
    episodes = [
        EpisodeIn(
            id=m["id"],
            seq=n,
            butler=butler,
            created_at=datetime.fromisoformat(m["at"]),
            importance=float(m["imp"]),
            content="\n".join(line[4:] for line in m["body"].splitlines()),
        )
        for n, m in enumerate(_EPISODE.finditer(prompt))
    ]
    facts = [
        KnownFact(id=m["id"], subject=m["s"], predicate=m["p"], content=m["c"], permanence=m["perm"], scope=m["scope"])
        for m in _FACT.finditer(prompt)
    ]
    request = ExtractionRequest(tenant_id="?", butler=butler, episodes=episodes, facts=facts)
    return HeuristicExtractor().extract(request).model_dump()


def _problems(body: dict[str, Any]) -> list[str]:
    """What is wrong with a request to /chat/completions, as a real server would reject it."""
    fmt = body.get("response_format", {})
    checks = {
        "model": body.get("model") == "memory-test-model",
        "temperature 0": body.get("temperature") == 0,
        "messages are system then user": [m.get("role") for m in body.get("messages", [])] == ["system", "user"],
        "response_format is json_schema": fmt.get("type") == "json_schema",
        "strict schema": fmt.get("json_schema", {}).get("strict") is True,
        "schema sent": fmt.get("json_schema", {}).get("schema") == EXTRACTION_JSON_SCHEMA,
    }
    return [name for name, ok in checks.items() if not ok]


def _completion(model: str, content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


@pytest.fixture
def chat_server() -> Iterator[SimpleNamespace]:
    """A ThreadingHTTPServer on 127.0.0.1:<free port> speaking POST /v1/chat/completions; ``mode`` picks its mood."""
    state = SimpleNamespace(mode="ok", requests=[], release=threading.Event(), base_url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
            if self.path != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            if state.mode == "echo-auth-401" or self.headers.get("Authorization") != f"Bearer {API_KEY}":
                echoed = f"Incorrect API key provided: {self.headers.get('Authorization')}"
                return self._send(401, {"error": {"message": echoed}})
            if _problems(body):
                return self._send(400, {"error": {"message": f"bad request: {_problems(body)}"}})
            if state.mode == "500":
                return self._send(500, {"error": {"message": "upstream overloaded"}})
            if state.mode == "slow":
                state.release.wait(30)
            prompt = body["messages"][1]["content"]
            content = {
                "ok": lambda: json.dumps(_model_answer(prompt)),
                "slow": lambda: json.dumps(_model_answer(prompt)),
                "not-json": lambda: "Sure! The user is allergic to peanuts.",
                "recorded": lambda: state.recorded,
                "unknown-id": lambda: json.dumps(
                    {
                        "facts": [
                            {
                                "subject": "user",
                                "predicate": "name",
                                "content": "User's name is Ann",
                                "permanence": "permanent",
                                "importance": 8,
                                "scope": "global",
                                "source_episode_ids": ["not-an-episode-of-this-batch"],
                                "supersedes_fact_id": None,
                            }
                        ],
                        "rules": [],
                        "confirmations": [],
                        "contradictions": [],
                    }
                ),
            }[state.mode]()
            return self._send(200, _completion(body["model"], content))

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (the timeout test)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _openai(state: SimpleNamespace, **overrides: Any) -> OpenAIExtractor:
    values: dict[str, Any] = {
        "extractor": "openai",
        "openai_base_url": state.base_url,
        "openai_api_key": API_KEY,
        "openai_model": "memory-test-model",
        "openai_timeout_seconds": 5,
    }
    settings = ConsolidationSettings(**{**values, **overrides})
    extractor = build_extractor(settings)
    assert isinstance(extractor, OpenAIExtractor)
    return extractor


def test_openai_extractor_round_trips_a_batch_through_a_chat_completions_server(chat_server):
    # given a server that answers like a model and a batch with a known fact
    request = _request()
    # when the extractor runs
    extraction = _openai(chat_server).extract(request)
    # then it asked once, properly, with the prompt naming every episode
    [sent] = chat_server.requests
    assert sent["auth"] == f"Bearer {API_KEY}"
    assert not _problems(sent["body"])
    assert E1 in sent["body"]["messages"][1]["content"] and E2 in sent["body"]["messages"][1]["content"]
    # and the validated answer is the model's
    assert extraction == HeuristicExtractor().extract(request)
    slots = {(f.predicate, f.supersedes_fact_id) for f in extraction.facts}
    assert ("allergic_to_peanuts", None) in slots and ("lives_in", KNOWN_FACT) in slots
    assert [r.content for r in extraction.rules] == ["Never call after 9pm"]


CONTRACT = json.loads((FAKE_CMD.parent / "extractor_contract.json").read_text())["cases"]


@pytest.mark.parametrize("case", CONTRACT, ids=[f"{n:02d}-{c['episode'][:24]}" for n, c in enumerate(CONTRACT)])
def test_openai_extractor_meets_recorded_answers(chat_server, case):
    # given an episode (and a known fact) and the answer a good model gave to its prompt, replayed by the server
    at = datetime(2025, 3, 1, 9, 30, tzinfo=timezone.utc)
    known = (
        [
            KnownFact(
                id=KNOWN_FACT,
                subject=case["known"][0],
                predicate=case["known"][1],
                content=case["known"][2],
                permanence=case["known"][3],
                scope=case["butler"],
            )
        ]
        if "known" in case
        else []
    )
    request = ExtractionRequest(
        tenant_id="default",
        butler=case["butler"],
        facts=known,
        episodes=[EpisodeIn(id=E1, seq=1, butler=case["butler"], created_at=at, importance=5, content=case["episode"])],
    )
    ids = {"E": E1, "K": KNOWN_FACT}
    text = case.get("raw") or json.dumps(case["answer"])
    chat_server.mode = "recorded"
    chat_server.recorded = re.sub(r'"([EK])"', lambda m: json.dumps(ids[m.group(1)]), text)
    expect = case["expect"]
    # when the openai extractor asks
    if case.get("bad"):
        with pytest.raises(ExtractionError) as raised:
            _openai(chat_server).extract(request)
        # a classified error naming the field, retried with backoff then dead-lettered by the worker
        assert raised.value.field == expect["error_field"] and raised.value.retryable is True
        return
    got = _openai(chat_server).extract(request)
    # then the prompt named the episode, and the gate made of the answer exactly the expected memories
    assert case["episode"].split()[0] in chat_server.requests[-1]["body"]["messages"][1]["content"]
    assert [[f.subject, f.predicate, f.content, f.permanence] for f in got.facts] == expect.get("facts", [])
    assert [r.content for r in got.rules] == expect.get("rules", [])
    assert [f.supersedes_fact_id for f in got.facts if f.supersedes_fact_id] == [
        ids[k] for k in expect.get("supersedes", [])
    ]
    assert [c.fact_id for c in got.confirmations] == [ids[k] for k in expect.get("confirmations", [])]
    assert [c.fact_id for c in got.contradictions] == [ids[k] for k in expect.get("contradictions", [])]
    assert [r.supporting_fact_refs for r in got.rules if r.supporting_fact_refs] == expect.get("supporting", [])
    assert all(e == E1 for f in got.facts for e in f.source_episode_ids)


def test_openai_extractor_reports_a_server_error_with_its_status(chat_server):
    chat_server.mode = "500"
    with pytest.raises(ExtractionError, match="HTTP 500") as info:
        _openai(chat_server).extract(_request())
    assert info.value.retryable


def test_openai_extractor_never_shows_the_api_key_even_when_the_server_echoes_it(chat_server):
    chat_server.mode = "echo-auth-401"
    with pytest.raises(ExtractionError, match="HTTP 401") as info:
        _openai(chat_server).extract(_request())
    assert API_KEY not in str(info.value) and "***" in str(info.value)


def test_openai_extractor_rejects_content_that_is_not_json(chat_server):
    chat_server.mode = "not-json"
    with pytest.raises(ExtractionError, match="not JSON.*Sure! The user"):
        _openai(chat_server).extract(_request())


def test_openai_extractor_rejects_an_episode_id_outside_the_batch(chat_server):
    chat_server.mode = "unknown-id"
    with pytest.raises(ExtractionError, match=r"facts\[0\]\.source_episode_ids\[0\]: unknown episode id") as info:
        _openai(chat_server).extract(_request())
    assert info.value.field == "facts[0].source_episode_ids[0]"


def test_openai_extractor_gives_up_on_a_slow_server_after_its_timeout(chat_server):
    # given a server that holds the answer until released
    chat_server.mode = "slow"
    extractor = _openai(chat_server, openai_timeout_seconds=0.3)
    # when / then the call fails at the configured timeout instead of waiting
    with pytest.raises(ExtractionError, match="no answer within 0.3s"):
        extractor.extract(_request())
    chat_server.release.set()


def test_openai_extractor_reports_an_unreachable_server():
    settings = ConsolidationSettings(
        extractor="openai", openai_base_url="http://127.0.0.1:9/v1", openai_timeout_seconds=2
    )
    with pytest.raises(ExtractionError, match="request failed: ConnectError"):
        OpenAIExtractor(settings).extract(_request())


# ---- a command ----------------------------------------------------------------------------------------------


def _command(*args: str, timeout: float = 30) -> CommandExtractor:
    settings = ConsolidationSettings(
        extractor="command", command=[sys.executable, str(FAKE_CMD), *args], command_timeout_seconds=timeout
    )
    extractor = build_extractor(settings)
    assert isinstance(extractor, CommandExtractor)
    return extractor


@pytest.mark.parametrize("mode", ["ok", "fenced"])
def test_command_extractor_validates_what_the_command_prints(mode):
    extraction = _command(mode).extract(_request())
    [fact] = extraction.facts
    assert (fact.predicate, fact.content, fact.source_episode_ids) == (
        "seen_episodes",
        "Consolidated 2 episodes",
        [E1, E2],
    )
    assert [c.fact_id for c in extraction.confirmations] == [KNOWN_FACT]


def test_command_extractor_reports_a_failing_command_with_the_tail_of_its_stderr():
    with pytest.raises(ExtractionError, match="exited with status 1") as info:
        _command("fail").extract(_request())
    assert info.value.message.endswith("boom: model unavailable")
    assert "x" * 501 not in info.value.message


def test_command_extractor_rejects_output_that_is_not_json():
    with pytest.raises(ExtractionError, match="not JSON.*I could not find anything"):
        _command("garbage").extract(_request())


def test_command_extractor_rejects_an_unknown_episode_id():
    with pytest.raises(ExtractionError, match="unknown episode id '00000000-0000-0000-0000-000000000000'"):
        _command("unknown-id").extract(_request())


def test_command_extractor_kills_a_hung_command_and_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    with pytest.raises(ExtractionError, match="no answer within 3s; killed"):
        _command("hang", str(pidfile), timeout=3).extract(_request())
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_command_extractor_kills_its_command_when_interrupted(tmp_path):
    # given a hung command interrupted from outside (as Celery's soft time limit does, by a signal)
    class Interrupted(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupted()

    pidfile = tmp_path / "child.pid"
    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.5)
    try:
        with pytest.raises(Interrupted):
            _command("hang", str(pidfile), timeout=60).extract(_request())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    # then the command and its children are gone, not left running for the 60 s of its own timeout
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a killed child not yet reaped by init is a zombie: dead


def test_command_extractor_refuses_an_empty_command():
    with pytest.raises(ExtractionError, match="^consolidation.command is empty$"):
        build_extractor(ConsolidationSettings(extractor="command")).extract(_request())


def test_command_extractor_reports_a_command_that_cannot_start(tmp_path):
    settings = ConsolidationSettings(extractor="command", command=[str(tmp_path / "no-such-agent")])
    with pytest.raises(ExtractionError, match="cannot start"):
        CommandExtractor(settings).extract(_request())


def test_build_extractor_defaults_to_the_heuristic_one():
    assert isinstance(build_extractor(ConsolidationSettings()), HeuristicExtractor)
    assert os.path.exists(FAKE_CMD)
