"""memory_context assembly: the seed's sectioned block under a hard token budget. Pure: tokens and time passed in.

Sections (in order): facts, rules, anti-pattern warnings, recent episodes. Each section first gets its quota share
of the budget (configurable), so no section crowds out the others; what a section leaves unused flows to the next.
Whatever is still unspent then goes back to the sections in the same order, each continuing where it stopped.
Within a section lines are added in rank order and the first line that does not fit ends the section, so the
lowest-ranked are always dropped first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache

from shared.config import SectionQuotas
from shared.schemas import Hit

HEADER = "## Your Memory"
TITLES = {
    "facts": "### What You Know (Facts)",
    "rules": "### How To Behave (Rules)",
    "warnings": "### Avoid (Anti-patterns)",
    "episodes": "### Recent Context (Episodes)",
}
MAX_LINE_TOKENS = 160  # one memory never crowds out the rest of its section
# Lines are made this many at a time as a section is taken (their annotations counted in one call): a block holds
# only a few of a section's candidates when they are long (conversation turns), so most lines are never made.
LINE_CHUNK = 8
CLIP_CHUNK = 64  # words counted at a time when a line is clipped (a word is a token or more: two or three chunks)

CountTokens = Callable[[Sequence[str]], list[int]]  # token counts of many texts, in one call


def age(then: datetime, now: datetime) -> str:
    """Compact age in the seed's units: 45s, 12m, 3h, 12d, 400d."""
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def clean(content: str) -> str:
    """A memory's text as its line shows it: whitespace runs collapsed to one space."""
    return " ".join(content.split())


def content_tokens(contents: Sequence[str], count: CountTokens) -> list[int]:
    """The token counts the writers store with each memory (``content_tokens``), so a context build only counts
    the short annotations around it. Exact because the tokenizer is additive over whitespace-joined pieces."""
    return count([clean(content) for content in contents])


@lru_cache(maxsize=8192)
def names_subject(subject: str, content: str) -> bool:
    """Whether a fact's content says whose it is ("Maria lives in Porto" names maria; "lives in Porto" does not).

    Remembered: the same facts come back block after block (0.06 us instead of 2.5 per fact)."""
    words = set(re.findall(r"[\w']+", content.casefold()))
    words |= {w.removesuffix("'s") for w in words}
    return all(w in words for w in re.findall(r"[\w']+", subject.casefold()))


def _parts(hit: Hit, now: datetime) -> tuple[str, str, str]:
    """(before, content, after): one bullet is the three joined by spaces.

    A fact whose content does not name its subject is shown with it ("- Maria: lives in Porto"): the block is
    read without the subject column.
    """
    content = clean(hit.content)
    if hit.type == "fact":
        before = "-" if not hit.subject or names_subject(hit.subject, content) else f"- {clean(hit.subject)}:"
        return before, content, f"[{hit.permanence}, confirmed {age(hit.last_confirmed_at or hit.created_at, now)} ago]"
    if hit.type == "rule":
        return "-", content, f"[{hit.maturity}, {hit.scope}]"
    return f"- [{age(hit.occurred_at or hit.created_at, now)} ago]", content, ""


def _join(before: str, content: str, after: str) -> str:
    return f"{before} {content} {after}" if after else f"{before} {content}"


def line_for(hit: Hit, now: datetime) -> str:
    """One bullet with its lightweight annotation."""
    return _join(*_parts(hit, now))


def _clip(line: str, count: CountTokens, limit: int) -> str:
    """The line's longest word prefix that fits ``limit`` tokens with an ellipsis after it (at least one word).

    ``count`` is additive over whitespace-joined pieces, so each word is counted once, alone (most are known to the
    counter's cache), and only as far as they fit: a long turn's tail is never counted."""
    words = line.split(" ")
    room, kept = limit - count(["…"])[0], 0
    for start in range(0, len(words), CLIP_CHUNK):
        for cost in count(words[start : start + CLIP_CHUNK]):
            if cost > room:
                return " ".join(words[: max(kept, 1)]) + " …"
            room, kept = room - cost, kept + 1
    return line + " …"


@dataclass(frozen=True)
class ContextBlock:
    text: str
    tokens: int
    included: dict[str, list[str]]  # section -> ids, in order
    dropped: int
    # The memories in the block, section by section (for the reference bumps; not part of what the block is).
    shown: tuple[Hit, ...] = field(default=(), compare=False, repr=False)


def build(
    *,
    facts: Sequence[Hit],
    rules: Sequence[Hit],
    warnings: Sequence[Hit],
    episodes: Sequence[Hit],
    budget: int,
    quotas: SectionQuotas,
    count: CountTokens,
    now: datetime,
) -> ContextBlock:
    """Assemble the block; ``count(text)`` never exceeds ``budget`` for the returned text. Each section's hits come
    in rank order; ``rules`` are the live ones, ``warnings`` the anti-patterns. A section reads its hits
    LINE_CHUNK at a time, only as far as it takes them.

    ``count`` must be additive over whitespace-joined pieces, as the model's WordPiece tokenizer is (it splits on
    whitespace first): the block's token count is then the sum of its lines' counts, with no second pass over it.
    Each line break is still charged one token against the budget, as a margin.
    """
    candidates = {"facts": facts, "rules": rules, "warnings": warnings, "episodes": episodes}
    share = {
        "facts": quotas.facts,
        "rules": quotas.rules * 0.75,
        "warnings": quotas.rules * 0.25,
        "episodes": quotas.episodes,
    }
    total_share = sum(share.values()) or 1.0
    sections = {name: _Section(TITLES[name], hits, count, now) for name, hits in candidates.items()}
    tokens = count([HEADER])[0]
    used = tokens + 1
    carry = 0
    for name, section in sections.items():  # first pass: each section within its share
        allowance = min(budget - used, int(budget * share[name] / total_share) + carry)
        spent, added = section.take(allowance)
        used, tokens, carry = used + spent, tokens + added, max(0, allowance - spent)
    for section in sections.values():  # second pass: what is left, in section order
        spent, added = section.take(budget - used)
        used, tokens = used + spent, tokens + added
    included = {name: [str(hit.id) for hit, _, _ in s.lines[: s.taken]] for name, s in sections.items() if s.taken}
    dropped = sum(len(s.hits) - s.taken for s in sections.values())
    if not included:
        return ContextBlock(text="", tokens=0, included={}, dropped=dropped)
    lines = [HEADER]
    for name in included:
        section = sections[name]
        lines += ["", section.title, *(line for _, line, _ in section.lines[: section.taken])]
    shown = tuple(hit for s in sections.values() for hit, _, _ in s.lines[: s.taken])
    return ContextBlock(text="\n".join(lines), tokens=tokens, included=included, dropped=dropped, shown=shown)


@dataclass
class _Section:
    """One section's candidates in rank order; their lines (text, tokens) are made as the section is taken, and the
    first ``taken`` are in the block."""

    title: str
    hits: Sequence[Hit]
    count: CountTokens
    now: datetime
    title_tokens: int = 0
    lines: list[tuple[Hit, str, int]] = field(default_factory=list)
    taken: int = 0

    def __post_init__(self) -> None:
        if self.hits:
            self.title_tokens = self.count([self.title])[0]

    def _line(self, n: int) -> tuple[Hit, str, int]:
        if n == len(self.lines):
            self.lines += _lines(self.hits[n : n + LINE_CHUNK], self.count, self.now)
        return self.lines[n]

    def take(self, allowance: int) -> tuple[int, int]:
        """Add lines in rank order while they fit in ``allowance``: (budget spent with line-break margins, tokens).

        The title and the blank line before it are charged with the section's first line."""
        first = not self.taken
        tokens = self.title_tokens if first else 0
        spent = tokens + 2 if first else 0
        n = self.taken
        while n < len(self.hits):
            hit, line, cost = self._line(n)
            if cost > MAX_LINE_TOKENS:  # clipped only when reached: clipping counts the line again
                line = _clip(line, self.count, MAX_LINE_TOKENS)
                cost = self.count([line])[0]
                self.lines[n] = (hit, line, cost)
            if spent + cost + 1 > allowance:
                break
            spent, tokens, n = spent + cost + 1, tokens + cost, n + 1
        if n == self.taken:
            return 0, 0
        self.taken = n
        return spent, tokens


def _lines(hits: Sequence[Hit], count: CountTokens, now: datetime) -> list[tuple[Hit, str, int]]:
    """Each hit's line and token count: the annotations counted in one call, each content from its stored count
    where it has one."""
    parts = [_parts(hit, now) for hit in hits]
    texts = [
        p
        for (before, content, after), hit in zip(parts, hits)
        for p in ((before, after) if hit.content_tokens is not None else (before, content, after))
    ]
    counted = dict(zip(texts, count(texts)))
    return [
        (
            hit,
            _join(before, content, after),
            counted[before]
            + counted[after]
            + (hit.content_tokens if hit.content_tokens is not None else counted[content]),
        )
        for hit, (before, content, after) in zip(hits, parts)
    ]
