"""The reference half of the extraction gate, on plain answer data: ids must exist, duplicates collapse.

Pure (standard library only). An answer is ``{"facts": [...], "rules": [...], "confirmations": [...],
"contradictions": [...]}`` already shaped by :class:`shared.extraction.Extraction`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from shared.errors import ExtractionError

Answer = dict[str, list[dict[str, Any]]]

# The fields of an answer that hold references, and what they must refer to.
_REFERENCES = {
    "source_episode_ids": "episode",
    "supersedes_fact_id": "fact",
    "fact_id": "fact",
    "rule_id": "rule",
    "supporting_fact_refs": "fact or new fact",
}
NEW_FACT_REF = re.compile(r"facts\[(\d+)\]")  # a rule may cite a new fact of the same answer by its index
_LISTS = ("source_episode_ids", "supporting_fact_refs")


def resolve_references(answer: Answer, *, episode_ids: list[str], fact_ids: list[str], rule_ids: list[str]) -> Answer:
    """The answer with every id rewritten to the request's spelling, or ExtractionError naming the field path.

    Ids are compared case-insensitively: a model may re-case a uuid it copies.
    """
    known = {
        "episode": {i.lower(): i for i in episode_ids},
        "fact": {i.lower(): i for i in fact_ids},
        "rule": {i.lower(): i for i in rule_ids},
    }
    new_facts = len(answer.get("facts", []))

    def resolve(kind: str, value: str, path: str) -> str:
        if kind == "fact or new fact" and (index := NEW_FACT_REF.fullmatch(value)):
            if int(index.group(1)) < new_facts:
                return value
            raise ExtractionError(f"{path}: {value!r} points past the {new_facts} new facts", field=path)
        kind = kind.split()[0]
        if value.lower() not in known[kind]:
            raise ExtractionError(f"{path}: unknown {kind} id {value!r} (not in this request)", field=path)
        return known[kind][value.lower()]

    out: Answer = {}
    for section, items in answer.items():
        out[section] = []
        for n, item in enumerate(items):
            item = dict(item)
            for field, kind in _REFERENCES.items():
                value, path = item.get(field), f"{section}[{n}].{field}"
                if isinstance(value, list):
                    item[field] = [resolve(kind, v, f"{path}[{i}]") for i, v in enumerate(value)]
                elif value is not None:
                    item[field] = resolve(kind, value, path)
            out[section].append(item)
    return out


def merge_duplicates(answer: Answer) -> Answer:
    """Identical facts (subject + predicate + content), rules, confirmations and contradictions become one each,
    carrying the union of their source episodes; ``facts[N]`` references follow the merged facts."""
    facts, where = _merge(answer["facts"], lambda f: (_norm(f["subject"]), f["predicate"], _norm(f["content"])))
    rules = [
        {
            **rule,
            "supporting_fact_refs": [
                f"facts[{where[int(m.group(1))]}]" if (m := NEW_FACT_REF.fullmatch(ref)) else ref
                for ref in rule["supporting_fact_refs"]
            ],
        }
        for rule in answer["rules"]
    ]
    return {
        "facts": facts,
        "rules": _merge(rules, lambda r: (_norm(r["content"]), r["scope"]))[0],
        "confirmations": _merge(answer["confirmations"], lambda c: (c["fact_id"], c["rule_id"]))[0],
        "contradictions": _merge(answer["contradictions"], lambda c: c["fact_id"])[0],
    }


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


def _union(*lists: list[str]) -> list[str]:
    return list(dict.fromkeys(v for values in lists for v in values))


def _merge(items: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> tuple[list[dict[str, Any]], list[int]]:
    """Collapse items with equal keys into the first, uniting their id lists; also returns old → new index."""
    kept: dict[Any, int] = {}
    out: list[dict[str, Any]] = []
    where: list[int] = []
    for item in items:
        k = key(item)
        if k not in kept:
            kept[k] = len(out)
            out.append({**item, **{f: _union(item[f]) for f in _LISTS if f in item}})
        else:
            first = out[kept[k]]
            first.update({f: _union(first[f], item[f]) for f in _LISTS if f in item})
        where.append(kept[k])
    return out, where
