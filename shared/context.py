"""memory_context assembly: the seed's sectioned block under a hard token budget. Pure: tokens and time passed in.

Sections (in order): facts, rules, anti-pattern warnings, recent episodes. Each section gets its quota share of
the budget (configurable); what a section leaves unused flows to the next. Within a section lines are added in
rank order and the first line that does not fit ends the section, so the lowest-ranked are always dropped first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

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

CountTokens = Callable[[Sequence[str]], list[int]]  # token counts of many texts, in one call


def age(then: datetime, now: datetime) -> str:
    """Compact age: 45s, 12m, 3h, 2d, 5w, 14mo, 2y."""
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("y", 31_536_000), ("mo", 2_592_000), ("w", 604_800), ("d", 86_400), ("h", 3_600), ("m", 60)):
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


def _parts(hit: Hit, now: datetime) -> tuple[str, str, str]:
    """(before, content, after): one bullet is the three joined by spaces."""
    content = clean(hit.content)
    if hit.type == "fact":
        return "-", content, f"[{hit.permanence}, confirmed {age(hit.last_confirmed_at or hit.created_at, now)} ago]"
    if hit.type == "rule":
        return "-", content, f"[{hit.maturity}, {hit.scope}]"
    return f"- [{age(hit.created_at, now)} ago]", content, ""


def _join(before: str, content: str, after: str) -> str:
    return f"{before} {content} {after}" if after else f"{before} {content}"


def line_for(hit: Hit, now: datetime) -> str:
    """One bullet with its lightweight annotation."""
    return _join(*_parts(hit, now))


def _clip(line: str, count: CountTokens, limit: int) -> str:
    """Shorten a line word by word until it has at most ``limit`` tokens."""
    words = line.split(" ")
    lo, hi = 1, len(words)
    while lo < hi:  # the longest word prefix that fits with the ellipsis
        mid = (lo + hi + 1) // 2
        if count([" ".join(words[:mid]) + " …"])[0] <= limit:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo]) + " …"


@dataclass(frozen=True)
class ContextBlock:
    text: str
    tokens: int
    included: dict[str, list[str]]   # section -> ids, in order
    dropped: int


def build(
    *, facts: Sequence[Hit], rules: Sequence[Hit], episodes: Sequence[Hit], budget: int, quotas: SectionQuotas,
    count: CountTokens, now: datetime,
) -> ContextBlock:
    """Assemble the block; ``count(text)`` never exceeds ``budget`` for the returned text.

    ``count`` must be additive over whitespace-joined pieces, as the model's WordPiece tokenizer is (it splits on
    whitespace first): the block's token count is then the sum of its lines' counts, with no second pass over it.
    Each line break is still charged one token against the budget, as a margin.
    """
    sections = {
        "facts": list(facts),
        "rules": [r for r in rules if r.maturity != "anti_pattern"],
        "warnings": [r for r in rules if r.maturity == "anti_pattern"],
        "episodes": list(episodes),
    }
    share = {"facts": quotas.facts, "rules": quotas.rules * 0.75, "warnings": quotas.rules * 0.25,
             "episodes": quotas.episodes}
    total_share = sum(share.values()) or 1.0
    lines = [HEADER]
    tokens = count([HEADER])[0]
    used = tokens + 1
    carry = 0
    included: dict[str, list[str]] = {}
    dropped = 0
    for name, hits in sections.items():
        allowance = min(budget - used, int(budget * share[name] / total_share) + carry)
        spent, section_tokens, chosen = _fill(hits, title=TITLES[name], allowance=allowance, count=count, now=now)
        dropped += len(hits) - len(chosen)
        if chosen:
            lines.append("")
            lines.append(TITLES[name])
            lines.extend(line for _, line in chosen)
            included[name] = [str(h.id) for h, _ in chosen]
        used += spent
        tokens += section_tokens
        carry = max(0, allowance - spent)
    if not included:
        return ContextBlock(text="", tokens=0, included={}, dropped=dropped)
    return ContextBlock(text="\n".join(lines), tokens=tokens, included=included, dropped=dropped)


def _fill(
    hits: Sequence[Hit], *, title: str, allowance: int, count: CountTokens, now: datetime
) -> tuple[int, int, list[tuple[Hit, str]]]:
    """Lines in rank order while they fit: (budget spent with the line-break margins, tokens, chosen lines)."""
    if not hits:
        return 0, 0, []
    parts = [_parts(hit, now) for hit in hits]
    # One count call for the title, every annotation, and the contents without a stored count.
    texts = [title] + [p for (before, content, after), hit in zip(parts, hits)
                       for p in ((before, after) if hit.content_tokens is not None else (before, content, after))]
    counted = dict(zip(texts, count(texts)))
    tokens = counted[title]
    spent = tokens + 2  # a blank line and the title line
    if spent >= allowance:
        return 0, 0, []
    chosen: list[tuple[Hit, str]] = []
    for hit, (before, content, after) in zip(hits, parts):
        line = _join(before, content, after)
        cost = counted[before] + counted[after] + (
            hit.content_tokens if hit.content_tokens is not None else counted[content])
        if cost > MAX_LINE_TOKENS:
            line = _clip(line, count, MAX_LINE_TOKENS)
            cost = count([line])[0]
        if spent + cost + 1 > allowance:
            break
        chosen.append((hit, line))
        spent += cost + 1
        tokens += cost
    return (spent, tokens, chosen) if chosen else (0, 0, [])
