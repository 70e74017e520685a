"""The heuristic extractor's tables: which English sentence shapes become which facts and rules.

Each entry is a regular expression over one sentence. They recognise phrasing, not meaning: "I live in
Berlin" is found, "Berlin has been home for years" is not. Groups: ``v`` is the value, ``who`` a named
person, others feed the content template.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.extraction import Permanence


@dataclass(frozen=True)
class Kind:
    """How a predicate decays (seed, "Permanence Categories") and whether it names a slot or a set."""

    permanence: Permanence
    importance: float
    # A set (allergies, likes, plans): the value is folded into the predicate ("allergy_peanuts") so a
    # second allergy is a new fact instead of superseding the first one.
    multi: bool = False


# predicate → Kind. permanent: identity, medical, family; stable: home, work, long-term preferences;
# standard: current interests and projects; volatile: short-term plans; ephemeral: today's meal.
KINDS: dict[str, Kind] = {
    "name": Kind("permanent", 8),
    "birthday": Kind("permanent", 7),
    "hometown": Kind("permanent", 5),
    "allergy": Kind("permanent", 9, multi=True),
    "medical_condition": Kind("permanent", 8, multi=True),
    "relationship_to_user": Kind("permanent", 7),
    "social_relationship": Kind("stable", 5),
    "dietary_restriction": Kind("stable", 7, multi=True),
    "home_city": Kind("stable", 6),
    "employer": Kind("stable", 6),
    "job": Kind("stable", 6),
    "preference": Kind("stable", 5, multi=True),
    "favorite": Kind("stable", 4),
    "likes": Kind("standard", 4, multi=True),
    "dislikes": Kind("standard", 4, multi=True),
    "current_reading": Kind("standard", 4),
    "current_project": Kind("standard", 5),
    "current_learning": Kind("standard", 4),
    "current_watching": Kind("standard", 3),
    "plan": Kind("volatile", 4, multi=True),
    "recent_meal": Kind("ephemeral", 2),
}

# A new "likes_x" replaces a known "dislikes_x" and the other way round.
OPPOSITES = {"likes": "dislikes", "dislikes": "likes"}

# Episodes are often reported speech: "User mentioned they are allergic to cats".
_SAID = (r"\b(?:the\s+)?user\s+(?:said|says|mentioned|mentions|noted|explained|stated|shared|told\s+me|confirmed)"
         r"\s+(?:that\s+)?")
_SUBJ = rf"(?:\bi|\bwe|\b(?:the\s+)?user|{_SAID}(?:they|he|she))\b"  # the speaker, or the user as episodes call them
_BE = (rf"(?:\bi\s+am|\bi'm|\bim|\bwe\s+are|\bwe're|\b(?:the\s+)?user\s+is|"
       rf"{_SAID}(?:they\s+are|they're|he\s+is|he's|she\s+is|she's))\b")
_MY = r"(?:\bmy|\b(?:the\s+)?user'?s)\b"
# Where a value stops: punctuation, or a word that starts a new clause or a time phrase.
_END = (
    r"(?=\s+(?:and|but|so|because|since|although|though|which|who|when|whenever|if|unless|as|with|for|from|"
    r"until|in|during|after|before|last|next|this|now|recently|yesterday|today|tonight|tomorrow|anymore|too|"
    r"also|every)\b"
    r"|\s*[,;:.!?()\"\n]|\s+-\s|$)"
)
_V = r"(?P<v>[^,;:.!?()\"\n]{1,120}?)" + _END
_LIST_END = r"(?=\s+(?:but|so|because|since|which|when|if|unless|though)\b|\s*[;:.!?()\"\n]|$)"
_LIST = r"(?P<v>[^;:.!?()\"\n]{1,160}?)" + _LIST_END
_DATE = r"(?P<v>[^,;:.!?()\"\n]{1,60}?(?:,\s*\d{4})?)" + _END
# A name: first word in any case ("my name is john"), later words capitalised ("John Smith").
_NAME = r"(?P<v>[A-Za-z][\w'-]{0,40}(?:\s(?-i:[A-Z][\w'-]{0,40})){0,3})\b"
_PROPER = r"(?P<who>(?-i:[A-Z][a-z]{1,30}))"
_FAMILY = (
    r"(?P<rel>wife|husband|partner|spouse|son|daughter|mother|mom|mum|father|dad|sister|brother|"
    r"grandmother|grandma|grandfather|grandpa|aunt|uncle|cousin|niece|nephew|fianc[eé]e?|dog|cat)"
)
_SOCIAL = (
    r"(?P<rel>best\s+friend|friend|boss|manager|colleague|coworker|co-worker|roommate|girlfriend|boyfriend|doctor)"
)
_WHEN = r"(?P<when>\s+(?:next\s+\w+|tomorrow|tonight|this\s+(?:week|weekend|month|evening)|soon|on\s+\w+day))"
_NOT_CONDITIONAL = r"(?![^.!?]*\b(?:when|whenever|if|unless)\b)"


@dataclass(frozen=True)
class FactPattern:
    regex: re.Pattern[str]
    predicate: str  # a KINDS key, or "favorite_{k}" filled from the match
    content: str  # template over the match's groups
    subject: str = "user"  # or "{who}": the person named in the sentence
    listing: bool = False  # the value may list several items: "peanuts, shellfish and penicillin"


def _f(regex: str, predicate: str, content: str, **kw: object) -> FactPattern:
    return FactPattern(re.compile(regex, re.IGNORECASE), predicate, content, **kw)  # type: ignore[arg-type]


_CURRENT = {"reading": "current_reading", "working on": "current_project", "learning": "current_learning",
            "studying": "current_learning", "watching": "current_watching"}

def _current(verb: str, predicate: str) -> FactPattern:
    """'I am currently reading X', 'currently reading X', 'I just started learning X'."""
    started = r"(?:just\s+)?(?:started|began|has\s+started|have\s+started)"
    lead = rf"(?:{_BE}\s+(?:currently\s+|now\s+)?|\b(?:currently|now)\s+|{_SUBJ}\s+{started}\s+)"
    return _f(lead + verb.replace(" ", r"\s+") + rf"\s+{_V}", predicate, f"User is currently {verb} {{v}}")


FACT_PATTERNS: tuple[FactPattern, ...] = (
    _f(rf"{_MY}\s+(?:full\s+)?name\s+is\s+{_NAME}", "name", "User's name is {v}"),
    _f(rf"{_BE}\s+(?:called|named)\s+{_NAME}", "name", "User's name is {v}"),
    _f(rf"{_MY}\s+(?:birthday|date\s+of\s+birth)\s+is\s+(?:on\s+)?{_DATE}", "birthday", "User's birthday is {v}"),
    _f(rf"{_SUBJ}\s+(?:was|were)\s+born\s+on\s+{_DATE}", "birthday", "User's birthday is {v}"),
    _f(rf"\b{_PROPER}'s\s+birthday\s+is\s+(?:on\s+)?{_DATE}", "birthday", "{who}'s birthday is {v}", subject="{who}"),
    _f(rf"{_BE}\s+(?:originally\s+)?from\s+{_V}", "hometown", "User is from {v}"),
    _f(rf"{_BE}\s+(?:severely\s+|very\s+|mildly\s+|also\s+)?allergic\s+to\s+{_LIST}", "allergy",
       "User is allergic to {v}", listing=True),
    _f(rf"{_SUBJ}\s+(?:has|have)\s+an?\s+(?:severe\s+|mild\s+)?(?P<v>[a-z]+)\s+allergy", "allergy",
       "User is allergic to {v}"),
    _f(rf"{_SUBJ}\s+(?:was|were|has\s+been|have\s+been)\s+diagnosed\s+with\s+{_V}", "medical_condition",
       "User was diagnosed with {v}"),
    _f(rf"{_BE}\s+(?P<v>lactose[\s-]intolerant|gluten[\s-]intolerant|vegetarian|vegan|pescatarian|celiac|coeliac)\b",
       "dietary_restriction", "User is {v}"),
    _f(rf"{_BE}\s+(?:now\s+)?on\s+an?\s+(?P<v>[\w-]{{2,30}}(?:\s[\w-]{{2,30}})?)\s+diet\b", "dietary_restriction",
       "User is on a {v} diet"),
    _f(rf"{_SUBJ}\s+(?:don't|doesn't|do\s+not|does\s+not|can't|cannot)\s+eat\s+{_LIST}", "dietary_restriction",
       "User does not eat {v}", listing=True),
    _f(rf"{_MY}\s+{_FAMILY}(?:'s\s+name\s+is|\s+is\s+called|\s+is\s+named|\s+is|,)?\s+{_PROPER}\b",
       "relationship_to_user", "{who} is the user's {rel}", subject="{who}"),
    _f(rf"\b{_PROPER}\s+is\s+{_MY}\s+{_FAMILY}\b", "relationship_to_user", "{who} is the user's {rel}",
       subject="{who}"),
    _f(rf"{_MY}\s+{_SOCIAL}(?:'s\s+name\s+is|\s+is\s+called|\s+is|,)?\s+{_PROPER}\b", "social_relationship",
       "{who} is the user's {rel}", subject="{who}"),
    _f(rf"\b{_PROPER}\s+is\s+{_MY}\s+{_SOCIAL}\b", "social_relationship", "{who} is the user's {rel}",
       subject="{who}"),
    _f(rf"(?:{_SUBJ}|{_BE})\s+(?:now\s+|currently\s+|still\s+)?(?:live|lives|living|reside|resides)\s+in\s+{_V}",
       "home_city", "User lives in {v}"),
    _f(rf"{_SUBJ}\s+(?:just\s+|recently\s+|have\s+|has\s+)?(?:moved|relocated)\s+to\s+{_V}", "home_city",
       "User lives in {v}"),
    _f(rf"(?:{_SUBJ}|{_BE})\s+(?:now\s+|currently\s+|still\s+)?(?:work|works|working)\s+(?:at|for)\s+{_V}",
       "employer", "User works at {v}"),
    _f(rf"(?:{_SUBJ}|{_BE})\s+(?:now\s+|currently\s+)?(?:work|works|working)(?:\s+(?:at|for)\s+[^,;.!?]{{1,80}}?)?"
       rf"\s+as\s+(?P<a>an?\s+)?{_V}", "job", "User works as {a}{v}"),
    _f(rf"{_MY}\s+(?:job|profession|occupation)\s+is\s+{_V}", "job", "User's job is {v}"),
    _f(rf"{_MY}\s+fav(?:ou?)rite\s+(?P<k>[a-z]{{2,20}}(?:\s[a-z]{{2,20}}){{0,2}})\s+(?:is|are)\s+{_V}",
       "favorite_{k}", "User's favorite {k} is {v}"),
    _f(rf"{_SUBJ}\s+(?:really\s+|strongly\s+|usually\s+|generally\s+)?prefers?\s+{_NOT_CONDITIONAL}{_V}",
       "preference", "User prefers {v}"),
    _f(rf"{_SUBJ}\s+(?:really\s+|also\s+)?(?:like|likes|love|loves|enjoy|enjoys|adore|adores)\s+{_LIST}",
       "likes", "User likes {v}", listing=True),
    _f(rf"{_SUBJ}\s+(?:really\s+)?(?:hate|hates|dislike|dislikes|can't\s+stand|cannot\s+stand|don't\s+like|"
       rf"doesn't\s+like|do\s+not\s+like|does\s+not\s+like)\s+{_LIST}", "dislikes", "User dislikes {v}", listing=True),
    *(_current(verb, predicate) for verb, predicate in _CURRENT.items()),
    _f(rf"{_BE}\s+(?P<vp>planning|hoping|intending)\s+to\s+{_V}{_WHEN}?", "plan", "User is {vp} to {v}{when}"),
    _f(rf"{_BE}\s+going\s+to\s+{_V}{_WHEN}", "plan", "User is going to {v}{when}"),
    _f(rf"{_SUBJ}\s+(?:plans?|intends?)\s+to\s+{_V}{_WHEN}?", "plan", "User plans to {v}{when}"),
    _f(rf"{_SUBJ}\s+will\s+{_V}{_WHEN}", "plan", "User will {v}{when}"),
    _f(rf"{_SUBJ}\s+(?:just\s+)?(?:had|ate)\s+{_V}\s+for\s+(?P<meal>breakfast|brunch|lunch|dinner|supper)\b",
       "recent_meal", "User had {v} for {meal}"),
    _f(rf"\b(?:today|tonight|this\s+(?:morning|evening))\s*,?\s+{_SUBJ}\s+ate\s+{_V}", "recent_meal",
       "User ate {v} today"),
    _f(rf"\b(?:for\s+)(?P<meal>breakfast|brunch|lunch|dinner|supper)\s*,?\s+{_SUBJ}\s+(?:had|ate)\s+{_V}",
       "recent_meal", "User had {v} for {meal}"),
)


@dataclass(frozen=True)
class RetractionPattern:
    """A sentence that takes back a known fact ("no longer lives in Berlin"); it can only contradict."""

    regex: re.Pattern[str]
    kind: str


_NO = r"(?:no\s+longer|don't|doesn't|do\s+not|does\s+not|am\s+not|is\s+not|isn't|'m\s+not|not)"
RETRACTION_PATTERNS: tuple[RetractionPattern, ...] = tuple(
    RetractionPattern(re.compile(regex, re.IGNORECASE), kind)
    for regex, kind in (
        (rf"(?:{_SUBJ}|{_BE})\s+{_NO}\s+(?:\w+\s+)?allergic\s+to\s+{_LIST}", "allergy"),
        (rf"(?:{_SUBJ}|{_BE})\s+{_NO}\s+(?:live|lives|living)\s+in\s+{_V}", "home_city"),
        (rf"(?:{_SUBJ}|{_BE})\s+{_NO}\s+(?:work|works|working)\s+(?:at|for)\s+{_V}", "employer"),
        (rf"{_SUBJ}\s+no\s+longer\s+(?:like|likes|love|loves|enjoy|enjoys)\s+{_LIST}", "likes"),
        (rf"(?:{_SUBJ}|{_BE})\s+no\s+longer\s+(?:a\s+)?(?P<v>vegetarian|vegan|pescatarian)\b", "dietary_restriction"),
    )
)

# Rules: imperative guidance, possibly reported ("User said: never call after 9pm").
REPORTED = re.compile(
    r"\b(?:the\s+)?user\s+(?:said|says|specified|specifies|asked(?:\s+me)?|asks(?:\s+me)?|wants(?:\s+me)?|"
    r"requested|insisted|stressed|noted|mentioned|explained|emphasi[sz]ed|told\s+me|reminded\s+me)"
    r"(?:\s+that)?\s*[:,]?\s*(?:to\s+)?",
    re.IGNORECASE,
)
_CUE = r"(?:always|never|don't|do\s+not|make\s+sure|be\s+sure|remember\s+to|avoid|from\s+now\s+on)\b"
_VERB = r"(?:use|format|confirm|check|ask|send|include|list|keep|reply|respond|write|remind|add|mention|double-check)\b"
_LEAD = r"(?:(?:when|whenever|before|after|if|for|in|on|during)\b[^,]{1,120},\s*)"
RULE_SHAPES: tuple[re.Pattern[str], ...] = tuple(
    re.compile(regex, re.IGNORECASE)
    for regex in (
        rf"^(?:(?:please|also|and|so|but)\s+)*(?:(?:from\s+now\s+on|in\s+(?:the\s+)?future|going\s+forward),?\s+)?"
        rf"(?:please\s+)?{_CUE}",
        rf"^(?:(?:please|also|and|so|but)\s+)*{_LEAD}(?:please\s+)?(?:{_CUE}|{_VERB})",
        r"^(?!(?:i|we|you|it|this|that|there|he|she|they)\b)[\w' -]{1,60}?\b(?:should|must)\s+\w+",
    )
)
CONDITIONAL_PREFERENCE = re.compile(
    r"(?:\bi|\bwe|\b(?:the\s+)?user)\s+(?:usually\s+|generally\s+|always\s+)?prefers?\s+"
    r"(?P<x>[^.!?]{1,200}?)\s+(?P<c>when|whenever|if|unless)\s+(?P<y>[^.!?]{1,200})",
    re.IGNORECASE,
)
GLOBAL_CUE = re.compile(r"\b(?:always|never)\b", re.IGNORECASE)
QUESTION = re.compile(r"\?\s*$|^\s*(?:what|who|where|why|how|which)\b", re.IGNORECASE)
