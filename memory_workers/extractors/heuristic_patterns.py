"""The heuristic extractor's tables: which English clause shapes become which facts, retractions and rules.

A fact pattern is a verb phrase; the extractor puts a subject in front of it (``I``, ``we``, ``he``/``she``/
``they``, ``the user`` or a capitalised name; a possessive for ``my name is``-shapes) and resolves that subject
to an entity afterwards (the speaker, the user, or the named person). Between the subject and the verb phrase an
auxiliary may stand: a negation turns the clause into a retraction, a modal (would, could, might, should) into
nothing. Values are checked for concreteness by the extractor (no pronouns, no clause fragments).

They recognise phrasing, not meaning: "I live in Berlin" is found, "Berlin has been home for years" is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# --- building blocks ---------------------------------------------------------------------------------

# A capitalised name of one or two words ("Maria", "Anna Lopez"); never matched case-insensitively.
NAME = r"(?-i:[A-Z][a-z]+(?:[ -][A-Z][a-z]+)?)"
SUBJECT = rf"(?P<s>\bI\b|\bwe\b|\bhe\b|\bshe\b|\bthey\b|\b(?:the\s+)?user\b|\b{NAME}\b)"
POSSESSIVE = rf"(?P<s>\bmy\b|\bour\b|\bhis\b|\bher\b|\btheir\b|\b(?:the\s+)?user'?s\b|\b{NAME}'s\b)"
# After the subject: a negation or a modal, kept in one group and classified by the extractor.
AUX = (
    r"(?P<aux>(?:\s+(?:(?:do|does|did|can|ca|will|wo|would|could|should|must)(?:n't|\s+not)?|might|may|shall|"
    r"also|still|really|no\s+longer|not|never|have|has)\b|'d\b|'ll\b|'ve\b)*)"
)
BE = r"(?:'m|'re|'s|\s+am|\s+are|\s+is|\s+was|\s+were|'ve\s+been|\s+have\s+been|\s+has\s+been)"
BE_NEG = r"(?P<neg>\s+(?:not|no\s+longer|never)\b|n't\b)?"
ADV = (
    r"(?:\s+(?:now|currently|still|also|actually|really|just|recently|finally|originally|definitely|totally|"
    r"already|severely|very|mildly|slightly|highly|extremely|quite|pretty|both|even|officially|happily|so|"
    r"usually|generally|mostly|always|kind\s+of|sort\s+of))*"
)

# Where a value stops: punctuation, or a word that starts a new clause or a time phrase.
_END = (
    r"(?=\s+(?:and|but|so|because|since|although|though|which|who|when|whenever|while|if|unless|as|with|for|from|"
    r"until|in|at|during|after|before|last|next|this|now|recently|yesterday|today|tonight|tomorrow|anymore|too|"
    r"also|every|ago|lately|these|right)\b"
    r"|\s*[,;:.!?()\"\n]|\s+-\s|$)"
)
V = r"(?P<v>[^,;:.!?()\"\n]{1,100}?)" + _END
_LIST_END = r"(?=\s+(?:but|so|because|since|which|when|if|unless|though|too|as|anymore)\b|\s*[;:.!?()\"\n]|$)"
LIST = r"(?P<v>[^;:.!?()\"\n]{1,140}?)" + _LIST_END
# A proper noun phrase: a place or an organisation ("New York", "Rio de Janeiro", "Acme Corp").
PROPER = (
    r"(?P<v>(?-i:(?:the\s+)?[A-ZÀ-Ý][\w'&-]*(?:(?:\s+(?:de|da|do|del|la|le|of|on|upon|am)\s+|\s+)"
    r"(?!I\b)[A-ZÀ-Ý0-9][\w'&-]*)*))"
)
PLACE = rf"(?:{PROPER}|(?P<lv>[a-z][a-z-]{{2,30}}))" + r"(?=\s|[,;:.!?()\"]|$)"
DATE = (
    r"(?P<v>(?:[A-Z][a-z]+\s+\d{1,2}(?:st|nd|rd|th)?|\d{1,2}(?:st|nd|rd|th)?(?:\s+of)?\s+[A-Z][a-z]+)(?:,?\s+\d{4})?)"
)
WHEN = (
    r"(?P<when>\s+(?:next\s+\w+|tomorrow|tonight|this\s+(?:week|weekend|month|year|summer|winter|spring|fall|"
    r"autumn|evening)|soon|on\s+\w+day|in\s+(?:January|February|March|April|May|June|July|August|September|"
    r"October|November|December)))"
)

FAMILY = (
    r"wife|husband|spouse|son|daughter|kid|child|mother|mom|mum|father|dad|sister|brother|"
    r"grandmother|grandma|grandfather|grandpa|aunt|uncle|cousin|niece|nephew|fianc[eé]e?|stepson|stepdaughter|"
    r"stepmother|stepfather|twin"
)
SOCIAL = (
    r"partner|best\s+friend|friend|boss|manager|colleague|coworker|co-worker|roommate|flatmate|girlfriend|boyfriend|"
    r"neighbou?r|mentor|teammate|doctor|therapist|landlord"
)
RELATION = rf"(?P<rel>{FAMILY}|{SOCIAL})"
FAMILY_WORDS = re.compile(rf"^(?:{FAMILY})$", re.IGNORECASE)

OCCUPATIONS = (
    r"(?:software\s+|web\s+|data\s+|civil\s+|mechanical\s+|electrical\s+|sales\s+|product\s+|project\s+|"
    r"marketing\s+|graphic\s+|ux\s+|interior\s+|high\s+school\s+|primary\s+school\s+|math\s+|music\s+|"
    r"english\s+|art\s+|registered\s+|senior\s+|junior\s+|freelance\s+|professional\s+|research\s+|"
    r"financial\s+|medical\s+|dental\s+|account\s+|social\s+|physical\s+|nurse\s+)?"
    r"(?:engineer|developer|programmer|teacher|professor|lecturer|nurse|doctor|physician|surgeon|dentist|"
    r"pharmacist|lawyer|attorney|accountant|designer|architect|manager|analyst|scientist|researcher|"
    r"consultant|writer|journalist|editor|photographer|chef|cook|baker|barista|waiter|waitress|pilot|"
    r"electrician|plumber|carpenter|mechanic|firefighter|police\s+officer|paramedic|therapist|"
    r"psychologist|veterinarian|vet|student|librarian|artist|musician|translator|entrepreneur|"
    r"salesperson|cashier|driver|farmer|soldier|officer|administrator|assistant|coordinator|"
    r"director|founder|intern|tutor|coach|trainer|caregiver|social\s+worker|retiree)s?"
)

NATIONALITIES = (
    r"American|Canadian|Mexican|Brazilian|Argentinian|Colombian|Chilean|Peruvian|British|English|Scottish|"
    r"Irish|Welsh|French|German|Italian|Spanish|Portuguese|Dutch|Belgian|Swiss|Austrian|Swedish|"
    r"Norwegian|Danish|Finnish|Polish|Czech|Hungarian|Romanian|Greek|Turkish|Russian|Ukrainian|"
    r"Israeli|Egyptian|Moroccan|Nigerian|Ghanaian|Kenyan|Ethiopian|South\s+African|Indian|Pakistani|"
    r"Bangladeshi|Chinese|Japanese|Korean|Vietnamese|Thai|Filipino|Indonesian|Malaysian|Australian|"
    r"Iranian|Iraqi|Lebanese|Syrian|Saudi"
)

LANGUAGES = (
    r"English|Spanish|French|German|Italian|Portuguese|Dutch|Russian|Polish|Ukrainian|Turkish|Arabic|"
    r"Hebrew|Hindi|Urdu|Bengali|Mandarin|Chinese|Cantonese|Japanese|Korean|Vietnamese|Thai|Indonesian|"
    r"Malay|Tagalog|Swahili|Yoruba|Igbo|Hausa|Greek|Swedish|Norwegian|Danish|Finnish|Czech|Hungarian|"
    r"Romanian|Persian|Farsi|Catalan|Irish|Welsh"
)

CONDITIONS = (
    r"asthma|(?:type\s+[12]\s+)?diabetes|celiac\s+disease|coeliac\s+disease|adhd|autism|epilepsy|"
    r"migraines|high\s+blood\s+pressure|hypertension|arthritis|eczema|psoriasis|anxiety|depression|"
    r"ibs|crohn's(?:\s+disease)?|a\s+heart\s+condition|sleep\s+apnea|insomnia|a\s+bad\s+back|"
    r"scoliosis|lupus|thyroid\s+issues|hypothyroidism|a\s+pacemaker"
)

DIETS = (
    r"lactose[\s-]intolerant|gluten[\s-]intolerant|gluten[\s-]free|vegetarian|vegan|pescatarian|celiac|coeliac|"
    r"diabetic|halal|kosher|dairy[\s-]free"
)

PETS = (
    r"dog|puppy|cat|kitten|parrot|rabbit|bunny|hamster|guinea\s+pig|turtle|tortoise|horse|fish|goldfish|snake|"
    r"lizard|ferret|bird|cockatiel|budgie"
)


@dataclass(frozen=True)
class FactPattern:
    """A verb phrase and where its subject comes from (the match's group s; else the sentence's last subject)."""

    regex: re.Pattern[str]
    # The same verb phrase with its subject left out after a comma or "and" ("He is vegan, moved to Berlin
    # and works at Siemens"): the subject is the sentence's previous one.
    elided: re.Pattern[str] | None
    predicate: str  # a vocabulary base name (shared.vocabulary)
    content: str  # template: {S} the subject as shown, {v} the value, other groups by name
    listing: bool = False  # the value may list several items: "peanuts, shellfish and penicillin"
    kind: str = ""  # for "favorite": the favourite's kind comes from group k


_ELIDED = r"(?:,|\band|\bwho)"


def _p(form: str, body: str, predicate: str, content: str, *, listing: bool = False, kind: str = "") -> FactPattern:
    lead, elided = {
        "verb": (SUBJECT + AUX + ADV + r"\s+", _ELIDED + AUX + ADV + r"\s+"),
        "be": (
            SUBJECT + BE + BE_NEG + ADV + r"\s+",
            _ELIDED + r"(?:\s+am|\s+are|\s+is|\s+was)" + BE_NEG + ADV + r"\s+",
        ),
        "poss": (POSSESSIVE + r"\s+", None),
        "bare": ("", None),
    }[form]
    return FactPattern(
        re.compile(lead + body, re.IGNORECASE),
        re.compile(elided + body, re.IGNORECASE) if elided else None,
        predicate,
        content,
        listing,
        kind,
    )


FACT_PATTERNS: tuple[FactPattern, ...] = (
    # identity
    _p("poss", rf"(?:full\s+|first\s+)?name\s+is\s+(?P<v>{NAME}|[a-z]+)\b", "name", "{S}'s name is {v}"),
    _p("be", rf"(?:called|named)\s+(?P<v>{NAME})\b", "name", "{S}'s name is {v}"),
    _p(
        "bare",
        rf"^(?:(?:hi|hey|hello)[,!]?\s+)?(?P<s>I)(?:'m|\s+am)\s+(?P<v>{NAME})(?=\s*[,.!]|\s+and\b|$)",
        "name",
        "{S}'s name is {v}",
    ),
    _p("poss", rf"(?:birthday|date\s+of\s+birth)\s+is\s+(?:on\s+)?{DATE}", "birthday", "{S}'s birthday is {v}"),
    _p("be", rf"born\s+on\s+{DATE}", "birthday", "{S}'s birthday is {v}"),
    _p("be", rf"(?:born\s+and\s+raised|born|raised)\s+in\s+{PLACE}", "hometown", "{S} is from {v}"),
    _p("verb", rf"grew\s+up\s+in\s+{PLACE}", "hometown", "{S} grew up in {v}"),
    _p(
        "be",
        rf"from\s+{PROPER}(?=\s|[,;:.!?()\"]|$)(?!\s+(?:team|department|office|support|company))",
        "hometown",
        "{S} is from {v}",
    ),
    _p("be", r"(?P<v>\d{1,3})\s+years?\s+old\b", "age", "{S} is {v} years old"),
    _p("be", r"(?P<v>\d{1,2})(?=\s*(?:[,.!;]|$|\s+and\b))", "age", "{S} is {v} years old"),
    _p("verb", rf"originally\s+from\s+{PROPER}(?=\s|[,;:.!?()\"]|$)", "hometown", "{S} is from {v}"),
    _p("be", rf"(?P<v>(?-i:{NATIONALITIES}))\b(?!\s+(?-i:[A-Z]))", "nationality", "{S} is {v}"),
    _p("verb", r"(?:just\s+)?turned\s+(?P<v>\d{1,3})\b", "age", "{S} is {v} years old"),
    # health
    _p("be", rf"allergic\s+to\s+{LIST}", "allergic_to", "{S} is allergic to {v}", listing=True),
    _p(
        "verb",
        r"(?:has|have|'ve\s+got|got)\s+an?\s+(?:severe\s+|mild\s+|bad\s+)?(?P<v>[a-z]+(?:\s+[a-z]+)?)"
        r"\s+allergy",
        "allergic_to",
        "{S} is allergic to {v}",
    ),
    _p("be", rf"diagnosed\s+with\s+{V}", "medical_condition", "{S} has {v}"),
    _p(
        "verb",
        rf"(?:has|have|'ve\s+got|got|suffers?\s+from|live\s+with|lives\s+with)\s+(?P<v>{CONDITIONS})\b",
        "medical_condition",
        "{S} has {v}",
    ),
    _p("be", rf"(?:an?\s+)?(?P<v>{DIETS})\b", "diet", "{S} is {v}"),
    _p(
        "be",
        r"(?:now\s+)?on\s+(?:an?|the)\s+(?P<v>(?!new\b)[\w-]{2,30}(?:\s[\w-]{2,30})?)\s+diet\b",
        "diet",
        "{S} is on a {v} diet",
    ),
    _p(
        "verb",
        r"(?:switched\s+to|went\s+on|moved\s+to)\s+an?\s+(?P<v>[\w-]{2,30})\s+diet\b",
        "diet",
        "{S} is on a {v} diet",
    ),
    _p(
        "verb",
        rf"(?:don't|doesn't|do\s+not|does\s+not|never)\s+eat\s+{LIST}",
        "diet",
        "{S} does not eat {v}",
        listing=True,
    ),
    _p(
        "verb",
        r"(?:started|began|'ve\s+started|has\s+started)\s+(?:a|an)\s+(?P<v>new(?:\s+[\w-]+)?|[\w-]+)\s+diet\b",
        "diet",
        "{S} started a {v} diet",
    ),
    _p("verb", rf"(?:eat|eats)\s+(?P<v>no\s+[^,;:.!?()\"\n]{{2,60}}?){_END}", "diet", "{S} eats {v}"),
    # places and work
    _p(
        "verb",
        rf"(?:live|lives|living|reside|resides|(?<=(?:'ve|ave|has)\s)lived)\s+in\s+{PLACE}",
        "lives_in",
        "{S} lives in {v}",
    ),
    _p("be", rf"(?:living|based|located|settled)\s+in\s+{PLACE}", "lives_in", "{S} lives in {v}"),
    _p(
        "verb",
        rf"(?:moved|relocated|'ve\s+moved|have\s+moved|has\s+moved)\s+to\s+{PLACE}",
        "lives_in",
        "{S} lives in {v}",
    ),
    _p("verb", rf"(?:work|works|working)\s+(?:at|for)\s+{PROPER}(?=\s|[,;:.!?()\"]|$)", "works_at", "{S} works at {v}"),
    _p(
        "verb",
        r"(?:work|works|working)\s+(?:at|for)\s+(?P<v>(?:a|an|the)\s+(?!home\b|night\b)[a-z][\w-]*"
        r"(?:\s+(?!as\b|in\b|on\b|and\b|but\b|for\b)[a-z][\w-]*){0,3})" + _END,
        "works_at",
        "{S} works at {v}",
    ),
    _p("be", rf"(?:employed|hired)\s+(?:at|by)\s+{PROPER}(?=\s|[,;:.!?()\"]|$)", "works_at", "{S} works at {v}"),
    _p(
        "verb",
        rf"(?:joined|started\s+at|started\s+working\s+at)\s+{PROPER}(?=\s|[,;:.!?()\"]|$)"
        r"(?=[^.!?]*\b(?:job|work|team|company|firm|position|role)\b)",
        "works_at",
        "{S} works at {v}",
    ),
    _p(
        "be",
        rf"an?\s+(?:{OCCUPATIONS})\s+(?:at|for|with)\s+{PROPER}(?=\s|[,;:.!?()\"]|$)",
        "works_at",
        "{S} works at {v}",
    ),
    _p(
        "verb",
        rf"(?:work|works|working)(?:\s+(?:at|for)\s+[^,;.!?]{{1,80}}?)?\s+as\s+(?P<a>an?\s+)?{V}",
        "job",
        "{S} works as {a}{v}",
    ),
    _p("be", rf"(?P<a>an?\s+)(?P<v>{OCCUPATIONS})\b(?!\s+(?:at\s+heart|by\s+nature))", "job", "{S} is {a}{v}"),
    _p(
        "verb",
        rf"(?:work|works|working)\s+as\s+an?\s+[^,;.!?]{{1,60}}?\s+(?:at|for)\s+{PROPER}"
        r"(?=\s|[,;:.!?()\"]|$)",
        "works_at",
        "{S} works at {v}",
    ),
    _p("poss", rf"(?:job|profession|occupation)\s+is\s+{V}", "job", "{S}'s job is {v}"),
    _p("verb", rf"(?:study|studies|studying|major\s+in|majoring\s+in)\s+{V}", "studies", "{S} studies {v}"),
    _p("be", rf"(?:a\s+)?(?:student|studying)\s+at\s+{PROPER}(?=\s|[,;:.!?()\"]|$)", "studies", "{S} studies at {v}"),
    # people and pets (the subject of a relationship fact is the other person: group who)
    _p(
        "poss",
        rf"{RELATION}(?:'s\s+name\s+is|\s+is\s+called|\s+is\s+named|,)?\s+(?P<who>{NAME})\b(?!'s)",
        "relationship",
        "{who} is {P} {rel}",
    ),
    _p("bare", rf"\b(?P<who>{NAME})(?:\s+is|,)\s+{POSSESSIVE}\s+{RELATION}\b", "relationship", "{who} is {P} {rel}"),
    _p(
        "verb",
        rf"(?:have|has|'ve\s+got|got|adopted)\s+(?P<v>an?\s+(?:\w+\s+)?(?:{PETS})(?:\s+(?:named|called)\s+"
        rf"{NAME})?)\b",
        "has_pet",
        "{S} has {v}",
    ),
    _p(
        "poss",
        rf"(?P<v>(?P<pet>{PETS}),?\s+(?:named\s+|called\s+)?(?P<pn>{NAME}))\b",
        "has_pet",
        "{S} has a {pet} named {pn}",
    ),
    _p(
        "verb",
        rf"(?:speak|speaks)\s+(?:fluent\s+)?(?P<v>(?-i:(?:{LANGUAGES}))(?:(?:,\s*|\s+and\s+)"
        rf"(?-i:(?:{LANGUAGES})))*)",
        "speaks",
        "{S} speaks {v}",
        listing=True,
    ),
    _p("be", rf"(?:fluent|native)\s+in\s+(?P<v>(?-i:{LANGUAGES}))", "speaks", "{S} speaks {v}"),
    # tastes
    _p(
        "poss",
        rf"fav(?:ou?)?rite\s+(?P<k>[a-z]{{2,20}}(?:\s[a-z]{{2,20}}){{0,2}})\s+(?:is|are)\s+{V}",
        "favorite",
        "{S}'s favorite {k} is {v}",
        kind="k",
    ),
    _p("verb", rf"prefers?\s+(?![^.!?]*\b(?:when|whenever|if|unless)\b){V}", "prefers", "{S} prefers {v}"),
    _p(
        "verb",
        rf"(?:like|likes|love|loves|enjoy|enjoys|adore|adores|am\s+into|'m\s+into|is\s+into|"
        rf"am\s+a\s+(?:big\s+|huge\s+)?fan\s+of|'m\s+a\s+(?:big\s+|huge\s+)?fan\s+of)\s+{LIST}",
        "likes",
        "{S} likes {v}",
        listing=True,
    ),
    _p(
        "verb",
        rf"(?:hate|hates|dislike|dislikes|can't\s+stand|cannot\s+stand|detest|detests|"
        rf"(?:don't|doesn't|do\s+not|does\s+not)\s+(?:really\s+)?(?:like|enjoy|care\s+for))\s+{LIST}",
        "dislikes",
        "{S} dislikes {v}",
        listing=True,
    ),
    # what is going on now
    _p("be", rf"(?:reading|rereading|re-reading)\s+{V}", "reading", "{S} is reading {v}"),
    _p(
        "be",
        rf"(?:learning|taking\s+(?:a\s+)?(?:class|classes|course|lessons)\s+in)\s+{V}",
        "learning",
        "{S} is learning {v}",
    ),
    _p(
        "verb",
        rf"(?:started|began)\s+(?:learning|taking\s+(?:lessons|classes)\s+in)\s+{V}",
        "learning",
        "{S} is learning {v}",
    ),
    _p("verb", rf"(?:started|began)\s+reading\s+{V}", "reading", "{S} is reading {v}"),
    _p(
        "be",
        rf"(?:working\s+on|building|writing|renovating)\s+(?P<v>(?:a|an|my|our|his|her|their)\s+"
        rf"[^,;:.!?()\"\n]{{2,80}}?){_END}",
        "working_on",
        "{S} is working on {v}",
    ),
    _p("be", rf"training\s+for\s+{V}", "goal", "{S} is training for {v}"),
    _p("poss", rf"(?:goal|dream|aim|plan)\s+is\s+to\s+{V}", "goal", "{S}'s goal is to {v}"),
    _p("be", rf"(?:saving\s+(?:up\s+)?for|working\s+towards?)\s+{V}", "goal", "{S} is saving for {v}"),
    # a plan only with its time: "I plan to use X" is how a task is described, not a plan
    _p("be", rf"(?P<vp>planning|hoping|intending|going)\s+to\s+{V}{WHEN}", "plans", "{S} is {vp} to {v}{when}"),
    _p("verb", rf"(?:plan|plans)\s+to\s+{V}{WHEN}", "plans", "{S} plans to {v}{when}"),
)

# Retractions that are not a negated fact clause ("I stopped learning piano", "I quit my job at Acme").
_RETRACT_LEAD = rf"{SUBJECT}(?:'ve|\s+have|\s+has)?\s+(?:just\s+)?"
RETRACTIONS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(regex, re.IGNORECASE), base)
    for regex, base in (
        (rf"{_RETRACT_LEAD}(?:stopped|quit|gave\s+up)\s+(?:learning|studying)\s+{V}", "learning"),
        (rf"{_RETRACT_LEAD}(?:stopped|quit|gave\s+up|finished)\s+reading\s+{V}", "reading"),
        (rf"{_RETRACT_LEAD}(?:quit|left)\s+(?:my|his|her|their|the)\s+job\s+at\s+{PROPER}", "works_at"),
        (rf"{_RETRACT_LEAD}(?:moved\s+out\s+of|moved\s+away\s+from|left)\s+{PROPER}(?=\s|[,;:.!?()\"]|$)", "lives_in"),
        (
            rf"{SUBJECT}\s+(?:don't|doesn't|do\s+not|does\s+not|no\s+longer)\s+have\s+(?:the|my|our|a|an)\s+"
            rf"(?P<v>{PETS})\b",
            "has_pet",
        ),
    )
)

# Sentences (or the part after such a cue) that are not statements about the world.
HYPOTHETICAL = re.compile(
    r"\b(?:if|suppose|supposing|imagine|wish|hypothetically|in\s+case|what\s+if|whether|pretend|let's\s+say|"
    r"maybe|perhaps|thinking\s+(?:about|of)|considering|wondering|would\s+be)\b",
    re.IGNORECASE,
)
QUESTION = re.compile(
    r"\?\s*$|^\s*(?:what|who|where|why|how|which|do|does|did|should|could|would|can|is|are|am|will|have|has)\b",
    re.IGNORECASE,
)
MODAL = re.compile(r"\b(?:would|could|might|may|should|must|shall|can)\b|'d\b", re.IGNORECASE)
NEGATION = re.compile(r"\b(?:not|never|no\s+longer)\b|n't\b", re.IGNORECASE)
LONGER = re.compile(r"\b(?:no\s+longer|anymore|any\s+more|not\s+\w+\s+now|these\s+days)\b", re.IGNORECASE)
STOPPED = re.compile(r"\b(?:stopped|quit|gave\s+up|left|moved\s+(?:out\s+of|away\s+from))\b", re.IGNORECASE)

# A value that is not a concrete thing: a pronoun, a clause fragment, a filler.
VAGUE_WORDS = frozenset(
    {
        "they're",
        "you're",
        "it's",
        "that's",
        "there's",
        "i'm",
        "we're",
        "he's",
        "she's",
        "i'll",
        "you'll",
        "i've",
        "it",
        "that",
        "this",
        "these",
        "those",
        "them",
        "him",
        "her",
        "one",
        "so",
        "me",
        "you",
        "your",
        "yours",
        "there",
        "here",
        "something",
        "anything",
        "everything",
        "nothing",
        "stuff",
        "things",
        "thing",
        "what",
        "how",
        "why",
        "when",
        "where",
        "which",
        "who",
        "was",
        "were",
        "is",
        "are",
        "be",
        "been",
        "being",
        "cause",
        "'cause",
        "because",
        "i",
        "we",
        "us",
        "they",
        "he",
        "she",
        "myself",
        "yourself",
        "idea",
        "lot",
        "way",
        "much",
        "more",
        "most",
        "too",
        "very",
        "doing",
        "hearing",
        "seeing",
        "talking",
        "having",
        "getting",
        "going",
        "if",
        "whether",
        "than",
        "then",
        "just",
        "like",
        "time",
        "times",
        "bit",
        "part",
        "kind",
        "sort",
    }
)
VAGUE_LEAD = frozenset({"to", "the", "a", "an", "some", "any", "no", "not", "all", "both", "each", "every"})
# A value never starts with a conjunction or a filler ("prefers or have equipment").
BAD_FIRST = frozenset(
    {
        "or",
        "and",
        "but",
        "so",
        "than",
        "then",
        "just",
        "also",
        "too",
        "as",
        "because",
        "no",
        "straight",
        "how",
        "what",
        "when",
        "where",
        "why",
        "if",
        "whether",
        "being",
        "getting",
    }
)
# What a person likes is a thing or an activity in general ("hiking", "Thai food"); "the breakdown",
# "this plan", "your idea" are about the conversation at hand.
LIKES_FIRST = frozenset(
    {
        "the",
        "this",
        "that",
        "these",
        "those",
        "your",
        "his",
        "her",
        "their",
        "our",
        "its",
        "my",
        "a",
        "an",
        "clear",
        "it's",
        "how",
    }
)

# The speaker of a "Name: ..." line; words that start a line with a colon but are not speakers.
SPEAKER = re.compile(r"^\s*(?P<sp>(?-i:[A-Z][a-z]+(?:\s[A-Z][a-z]+)?))\s*:\s+")
NOT_SPEAKERS = frozenset(
    {
        "note",
        "notes",
        "reminder",
        "update",
        "summary",
        "important",
        "warning",
        "tip",
        "todo",
        "fyi",
        "ps",
        "re",
        "subject",
        "context",
        "task",
        "goal",
        "result",
        "outcome",
        "action",
        "question",
        "answer",
        "q",
        "a",
        "edit",
        "also",
        "status",
        "next",
        "today",
        "tomorrow",
        "yesterday",
        "p.s",
        "example",
        "reason",
        "problem",
        "fix",
        "session",
        "topic",
        "request",
        "response",
        "follow",
        "agenda",
        "meeting",
        "deadline",
        "heads",
    }
)
# A turn spoken by a role is a script or a role-play the user pasted, not a person's statement.
ROLE_SPEAKERS = frozenset(
    {
        "interviewee",
        "interviewer",
        "candidate",
        "narrator",
        "host",
        "guest",
        "speaker",
        "person",
        "character",
        "teacher",
        "student",
        "doctor",
        "manager",
        "employee",
        "player",
        "author",
        "reader",
        "writer",
        "moderator",
        "judge",
        "tutor",
        "coach",
        "therapist",
        "parent",
        "child",
        "friend",
        "buyer",
        "seller",
        "agent",
        "caller",
        "representative",
        "rep",
        "support",
        "staff",
        "nurse",
        "waiter",
        "officer",
        "detective",
        "villain",
        "hero",
    }
)
USER_SPEAKERS = frozenset({"user", "human", "me", "client", "customer", "patient"})
ASSISTANT_SPEAKERS = frozenset(
    {"assistant", "ai", "bot", "butler", "agent", "system", "claude", "gpt", "chatgpt", "model", "helper"}
)
# An assistant turn restates what the user said only when it says so.
CONFIRMING = re.compile(
    r"\b(?:got\s+it|noted|understood|i'll\s+(?:remember|keep|note|make\s+a\s+note)|i\s+will\s+(?:remember|keep|note)|"
    r"thanks\s+for\s+(?:letting\s+me\s+know|telling\s+me|sharing)|good\s+to\s+know|so\s+you(?:'re|\s+are)|"
    r"since\s+you\b|because\s+you\b|given\s+(?:that\s+)?you\b|as\s+you(?:'re|\s+are)|i've\s+(?:noted|saved|updated)|i\s+have\s+(?:noted|saved))\b",
    re.IGNORECASE,
)
# Words that start a capitalised clause but are not people.
NOT_A_NAME = frozenset(
    {
        "this",
        "that",
        "it",
        "he",
        "she",
        "they",
        "there",
        "here",
        "what",
        "who",
        "today",
        "tomorrow",
        "yesterday",
        "which",
        "and",
        "but",
        "so",
        "then",
        "also",
        "now",
        "my",
        "i",
        "we",
        "the",
        "a",
        "an",
        "user",
        "mom",
        "dad",
        "mum",
        "god",
        "honestly",
        "actually",
        "yes",
        "no",
        "well",
        "oh",
        "ok",
        "okay",
        "sure",
        "thanks",
        "hi",
        "hey",
        "hello",
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
        "everyone",
        "nobody",
        "someone",
        "everybody",
        "somebody",
        "anyone",
        "assistant",
        "session",
        "last",
        "next",
        "my",
        "our",
        "his",
        "her",
        "their",
        "your",
        "you",
        "if",
        "when",
        "while",
        "since",
        "because",
        "after",
        "before",
        "during",
        "as",
        "just",
        "still",
        "really",
        "maybe",
        "perhaps",
        "sometimes",
        "usually",
        "recently",
        "lately",
        "currently",
        "great",
        "good",
        "nice",
        "cool",
        "wow",
        "please",
        "sorry",
        "later",
        "earlier",
        "anyway",
        "besides",
        "otherwise",
        "understood",
        "got",
        "great",
        "perfect",
        "alright",
        "absolutely",
        "exactly",
        "right",
        "noted",
        "awesome",
        "excellent",
        "fantastic",
        "wonderful",
        "congratulations",
        "congrats",
        "indeed",
        "true",
        "fair",
        "cheers",
        "welcome",
        "lol",
        "haha",
        "ah",
        "aha",
        "hmm",
        "yeah",
        "yep",
        "nope",
        "definitely",
        "totally",
        "certainly",
        "of",
        "for",
        "with",
        "to",
        "in",
        "on",
        "at",
        "by",
        "from",
        "about",
        "like",
        "even",
        "only",
        "all",
        "both",
    }
)
# "Tom said", "Ana told me": a named person whose later he/she/they the extractor resolves to them.
REPORTING = re.compile(
    rf"\b(?P<who>{NAME})\s+(?:said|says|mentioned|mentions|told|tells|explained|noted|shared|added|reported|"
    r"wrote|texted|called|asked|came|visited|stopped\s+by|dropped\s+by|introduced|announced|confirmed|"
    rf"(?i:is|was)\s+(?i:an?)\s+(?i:{OCCUPATIONS}))\b"
)
# "my sister Ana", "Ana is my sister": a person the episode introduces by their relation.
RELATIVE = re.compile(
    rf"\b(?:my|our|his|her|their|your)\s+(?:{FAMILY}|{SOCIAL}),?\s+(?P<who>{NAME})\b|"
    rf"\b(?P<who2>{NAME})(?:\s+is|,)\s+(?:my|our|his|her|their|your)\s+(?:{FAMILY}|{SOCIAL})\b",
    re.IGNORECASE,
)
THE_USER = re.compile(r"\b(?:the\s+)?user\b", re.IGNORECASE)


# --- rules ----------------------------------------------------------------------------------------

# Rules: imperative guidance, possibly reported ("User said: never call after 9pm").
REPORTED = re.compile(
    r"\b(?:the\s+)?user\s+(?:said|says|specified|specifies|asked(?:\s+me)?|asks(?:\s+me)?|wants(?:\s+me)?|"
    r"requested|insisted|stressed|noted|mentioned|explained|emphasi[sz]ed|told\s+me|reminded\s+me)"
    r"(?:\s+that)?\s*[:,]?\s*(?:to\s+)?",
    re.IGNORECASE,
)
_GENERAL = r"(?:always|never|every\s+time|whenever|from\s+now\s+on|in\s+(?:the\s+)?future|going\s+forward|by\s+default)"
_CUE = rf"(?:{_GENERAL}|avoid)\b"
# "Never really got off the ground", "never mind": a statement, not an instruction.
NOT_AN_ORDER = re.compile(
    r"^(?:always|never)\s+(?:\w+ed|got|was|were|had|did|went|been|knew|thought|really|even|once|mind|again|ever|"
    r"seems?|felt|gets|is|are|has)\b",
    re.IGNORECASE,
)
# "Don't ..." is a rule only as a standing policy ("don't schedule meetings before 10am"), not a one-off
# ("don't worry", "don't ask again").
_POLICY = r"\b(?:before|after|during|on\s+weekends|at\s+night|in\s+the\s+(?:morning|evening)|unless|without)\b"
_VERB = (
    r"(?:use|format|confirm|check|ask|send|include|list|keep|reply|respond|answer|write|add|mention|"
    r"double-check|give|show|put|start|end|call|address|skip|suggest|recommend|avoid|schedule|book|"
    r"don't|do\s+not|be)\b"
)
_LEAD = r"(?:(?:when|whenever|before|after|if|for|in|on|during)\b[^,]{1,120},\s*)"
RULE_SHAPES: tuple[re.Pattern[str], ...] = tuple(
    re.compile(regex, re.IGNORECASE)
    for regex in (
        rf"^(?:(?:please|also|and|so|but)\s+)*(?:(?:from\s+now\s+on|in\s+(?:the\s+)?future|going\s+forward),?\s+)?"
        rf"(?:please\s+)?{_CUE}",
        rf"^(?:(?:please|also|and|so|but)\s+)*{_LEAD}(?:please\s+)?(?:(?:always|never)\s+)?{_VERB}",
        rf"^(?:(?:please|also|and|so|but)\s+)*(?:please\s+)?{_VERB}[^.!?]*\b{_GENERAL}\b",
        rf"^(?:please\s+)?(?:don't|do\s+not)\s+{_VERB}[^.!?]*{_POLICY}",
        r"^(?:please\s+)?(?:keep|make|write|give)\s+(?:your\s+)?(?:answers|replies|responses|messages|summaries)\b",
        r"^(?:please\s+)?(?:address|call|refer\s+to)\s+me\s+as\b",
        r"^(?!(?:i|we|you|it|this|that|these|those|the|my|your|there|he|she|they)\b)[\w' -]{1,60}?\b"
        r"(?:should\s+always|must\s+always|"
        r"should\s+never|must\s+never|should\s+be\s+(?:listed|formatted|written|kept|sent))\b",
    )
)
CONDITIONAL_PREFERENCE = re.compile(
    r"(?:\bi|\bwe|\b(?:the\s+)?user)\s+(?:usually\s+|generally\s+|always\s+)?prefers?\s+"
    r"(?P<x>[^.!?]{1,200}?)\s+(?P<c>when|whenever|if|unless)\s+(?P<y>[^.!?]{1,200})",
    re.IGNORECASE,
)
# "user edited the tone to be more casual": a correction that shows a preference.
CORRECTION = re.compile(
    r"\b(?:the\s+)?user\s+(?:edited|changed|adjusted|rewrote|corrected|tweaked)\s+(?:the\s+)?(?P<x>[a-z ]{2,40}?)"
    r"\s+to\s+(?:be\s+)?(?P<y>[^,;.!?]{2,80})",
    re.IGNORECASE,
)
# A reminder, a deadline or a one-off instruction is not a rule.
ONE_OFF = re.compile(
    r"\b(?:today|tonight|tomorrow|this\s+(?:morning|afternoon|evening|week|weekend|month)|next\s+(?:week|month|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday)|on\s+(?:monday|tuesday|wednesday|thursday|friday|"
    r"saturday|sunday)|by\s+(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday|noon|tonight|eod)|"
    r"(?:at|by|to|until)\s+\d{1,2}(?::\d\d)?\s*(?:am|pm)?|meeting|deadline|appointment|make\s+sure|be\s+sure|"
    r"remember\s+to|later|the\s+attached|this\s+(?:email|message|file|document|one))\b",
    re.IGNORECASE,
)
