"""A labelled extraction set: episodes in the forms butlers send, each with the facts and rules a careful
extractor takes from it (and nothing else).

Written for this project (no downloads). Gold facts use the controlled vocabulary's base predicates
(:mod:`shared.vocabulary`); subject ``user`` is the user, else the person's name as written; a relationship's
subject is the other person. Scope ``butler`` means the case's butler (derived memories take the batch butler's
scope by default). Permanence follows the vocabulary (family relationships permanent, others stable).

**Held-back split**: every case whose position ``i`` has ``i % 5 in (1, 3)`` (40 %) is ``held``: the offline
extractor is not tuned on it — its errors are not looked at while changing the extractor; only its figures are
reported. The rest (60 %) is ``dev``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GoldFact:
    subject: str
    predicate: str  # a vocabulary base name
    permanence: str
    content: str
    scope: str = "butler"


@dataclass(frozen=True)
class Case:
    id: str
    form: str
    split: str
    butler: str
    content: str
    facts: tuple[GoldFact, ...] = ()
    rules: tuple[str, ...] = ()
    known: tuple[GoldFact, ...] = ()  # what memory holds before (retractions, updates)
    contradicts: tuple[str, ...] = ()  # predicates of known facts the episode takes back


F = GoldFact
_RAW: list[tuple] = []


def c(
    form: str,
    butler: str,
    content: str,
    *facts: GoldFact,
    rules: tuple[str, ...] = (),
    known: tuple[GoldFact, ...] = (),
    contradicts: tuple[str, ...] = (),
) -> None:
    _RAW.append((form, butler, content, tuple(facts), rules, known, contradicts))


# --- the cases ----------------------------------------------------------------------------------------------
c(
    "first_person",
    "health",
    "I'm allergic to penicillin, just so you know.",
    F("user", "allergic_to", "permanent", "User is allergic to penicillin"),
)
c(
    "summary",
    "health",
    "Session summary: the user logged 8,000 steps. They mentioned they have asthma and use an inhaler before runs.",
    F("user", "medical_condition", "permanent", "User has asthma"),
)
c(
    "dialogue",
    "general",
    "Maria: I moved to Porto in May, the rent is so much better here.",
    F("Maria", "lives_in", "stable", "Maria lives in Porto"),
)
c("smalltalk", "general", "haha thanks, that was really helpful!")
c(
    "rule",
    "general",
    "Always answer me in metric units, I never think in miles.",
    rules=("Always answer in metric units",),
)
c("question", "travel", "Do you think I should learn Spanish before the trip?")
c("hypothetical", "travel", "If I moved to Lisbon I would probably buy a bike.")
c("logistics", "general", "Don't forget: the meeting moved to 3pm.")
c(
    "reported",
    "general",
    "My sister Ana told me she just started working at Siemens.",
    F("Ana", "relationship", "permanent", "Ana is the user's sister"),
    F("Ana", "works_at", "stable", "Ana works at Siemens"),
)
c(
    "assistant",
    "health",
    "Assistant: Got it, you're lactose intolerant, so I'll leave dairy out of the plan.",
    F("user", "diet", "stable", "User is lactose intolerant"),
)
c(
    "multi",
    "general",
    "I'm Tom, I work as a nurse at St Mary's and I live in Bristol with my wife Jenny.",
    F("user", "name", "permanent", "User's name is Tom"),
    F("user", "job", "stable", "User works as a nurse"),
    F("user", "works_at", "stable", "User works at St Mary's"),
    F("user", "lives_in", "stable", "User lives in Bristol"),
    F("Jenny", "relationship", "permanent", "Jenny is the user's wife"),
)
c(
    "retraction",
    "general",
    "I don't live in Berlin anymore.",
    known=(F("user", "lives_in", "stable", "User lives in Berlin"),),
    contradicts=("lives_in",),
)
c("user_turn", "cooking", "User: I'm vegetarian, so no meat please.", F("user", "diet", "stable", "User is vegetarian"))
c("smalltalk", "general", "good morning! how's it going")
c("logistics", "general", "Remind me tomorrow to call the bank about the card.")
c(
    "summary",
    "general",
    "Session summary: Daniel came by to plan meals. He is lactose intolerant, moved to Berlin "
    "last year and works at Siemens.",
    F("Daniel", "diet", "stable", "Daniel is lactose intolerant"),
    F("Daniel", "lives_in", "stable", "Daniel lives in Berlin"),
    F("Daniel", "works_at", "stable", "Daniel works at Siemens"),
)
c(
    "first_person",
    "finance",
    "My name is Oluwaseun, but everyone calls me Seun.",
    F("user", "name", "permanent", "User's name is Oluwaseun"),
)
c("rule", "general", "Never schedule calls before 9am.", rules=("Never schedule calls before 9am",))
c("logistics", "support", "I'm from the support team, I'm following up on your ticket.")
c(
    "first_person",
    "general",
    "I love hiking and photography.",
    F("user", "likes", "standard", "User likes hiking"),
    F("user", "likes", "standard", "User likes photography"),
)
c("dialogue", "general", "Bob: I just turned 40, can't believe it.", F("Bob", "age", "stable", "Bob is 40 years old"))
c("question", "general", "What's the capital of Australia?")
c("hypothetical", "general", "I'd love to live in Japan one day.")
c("assistant", "travel", "Assistant: Lisbon is lovely in May. You should visit the Alfama district.")
c(
    "multi",
    "health",
    "Quick update: I was diagnosed with type 2 diabetes in March, and I've switched to a low-carb diet since then.",
    F("user", "medical_condition", "permanent", "User has type 2 diabetes"),
    F("user", "diet", "stable", "User is on a low-carb diet"),
)
c(
    "reported",
    "general",
    "The user said their daughter Lily is starting school in September.",
    F("Lily", "relationship", "permanent", "Lily is the user's daughter"),
)
c(
    "rule",
    "cooking",
    "When I ask for a recipe, list the ingredients first.",
    rules=("When the user asks for a recipe, list the ingredients first",),
)
c("smalltalk", "general", "lol yeah that's fair")
c("first_person", "general", "I speak French and a bit of German.", F("user", "speaks", "stable", "User speaks French"))
c(
    "summary",
    "finance",
    "The user works at Deloitte as an auditor and is saving for a house deposit.",
    F("user", "works_at", "stable", "User works at Deloitte"),
    F("user", "job", "stable", "User works as an auditor"),
    F("user", "goal", "standard", "User is saving for a house deposit"),
)
c(
    "retraction",
    "cooking",
    "I'm not vegetarian anymore, I started eating fish again.",
    known=(F("user", "diet", "stable", "User is vegetarian"),),
    contradicts=("diet",),
)
c(
    "user_turn",
    "general",
    "User: my favourite colour is green",
    F("user", "favorite", "stable", "User's favorite colour is green"),
)
c("logistics", "general", "Please make sure to send the report by Friday.")
c("question", "health", "Is it okay to run with a cold?")
c(
    "dialogue",
    "general",
    "Kenji: My wife Aiko and I are expecting our first child in June.",
    F("Aiko", "relationship", "permanent", "Aiko is Kenji's wife"),
)
c(
    "first_person",
    "pets",
    "We adopted a cat named Miso last month.",
    F("user", "has_pet", "stable", "User has a cat named Miso"),
)
c("smalltalk", "general", "Sounds good, talk later!")
c("hypothetical", "finance", "What if I quit my job and started a bakery?")
c("rule", "general", "Please don't use emojis in your replies, ever.", rules=("Never use emojis in replies",))
c(
    "assistant",
    "health",
    "Assistant: Thanks for letting me know you're allergic to shellfish. I'll flag recipes with shrimp.",
    F("user", "allergic_to", "permanent", "User is allergic to shellfish"),
)
c(
    "multi",
    "general",
    "I'm 34, originally from Lagos, and I work as a software engineer at Flutterwave.",
    F("user", "age", "stable", "User is 34 years old"),
    F("user", "hometown", "permanent", "User is from Lagos"),
    F("user", "job", "stable", "User works as a software engineer"),
    F("user", "works_at", "stable", "User works at Flutterwave"),
)
c("summary", "general", "Session summary: helped the user draft an email to their landlord about a broken heater.")
c(
    "first_person",
    "general",
    "I can't stand horror movies.",
    F("user", "dislikes", "standard", "User dislikes horror movies"),
)
c(
    "reported",
    "general",
    "Tom mentioned he moved to Edinburgh for the new job.",
    F("Tom", "lives_in", "stable", "Tom lives in Edinburgh"),
)
c("logistics", "general", "Can you move my dentist appointment to Thursday?")
c(
    "dialogue",
    "general",
    "Sara: I'm a teacher at Hillside Primary, been there ten years now.",
    F("Sara", "job", "stable", "Sara is a teacher"),
    F("Sara", "works_at", "stable", "Sara works at Hillside Primary"),
)
c("smalltalk", "general", "the weather is awful today, isn't it")
c(
    "first_person",
    "learning",
    "I'm currently learning Korean, mostly with apps.",
    F("user", "learning", "standard", "User is learning Korean"),
)
c("rule", "finance", "From now on, always show amounts in euros.", rules=("Always show amounts in euros",))
c("question", "general", "Who won the match last night?")
c(
    "user_turn",
    "travel",
    "User: I prefer window seats on long flights.",
    F("user", "prefers", "stable", "User prefers window seats on long flights"),
)
c("hypothetical", "general", "Maybe I'll get a dog someday, not sure yet.")
c("assistant", "general", "Assistant: Here's a summary of the article you shared about remote work.")
c(
    "summary",
    "health",
    "Session summary: the user is training for the Berlin marathon in September and has a bad knee.",
    F("user", "goal", "standard", "User is training for the Berlin marathon"),
    F("user", "medical_condition", "permanent", "User has a bad knee"),
)
c(
    "retraction",
    "general",
    "I no longer work at Google, I left in April.",
    known=(F("user", "works_at", "stable", "User works at Google"),),
    contradicts=("works_at",),
)
c(
    "multi",
    "general",
    "My husband Luis is a chef and my son Mateo just started college.",
    F("Luis", "relationship", "permanent", "Luis is the user's husband"),
    F("Luis", "job", "stable", "Luis is a chef"),
    F("Mateo", "relationship", "permanent", "Mateo is the user's son"),
)
c("smalltalk", "general", "ok cool")
c(
    "first_person",
    "general",
    "I'm based in Toronto these days.",
    F("user", "lives_in", "stable", "User lives in Toronto"),
)
c("logistics", "general", "The package should arrive tomorrow between 9 and 11.")
c(
    "reported",
    "health",
    "The user's doctor said they have high blood pressure.",
    F("user", "medical_condition", "permanent", "User has high blood pressure"),
)
c("rule", "general", "Keep your answers short, I read them on my phone.", rules=("Keep answers short",))
c(
    "dialogue",
    "general",
    "Priya: I can't eat gluten, I have celiac disease.",
    F("Priya", "medical_condition", "permanent", "Priya has celiac disease"),
)
c("question", "cooking", "How long should I boil an egg?")
c(
    "first_person",
    "general",
    "My birthday is on March 14.",
    F("user", "birthday", "permanent", "User's birthday is March 14"),
)
c("hypothetical", "general", "I wish I could speak Italian.")
c(
    "assistant",
    "general",
    "Assistant: Noted, your partner Sam is vegan, I'll plan dinners accordingly.",
    F("Sam", "relationship", "stable", "Sam is the user's partner"),
    F("Sam", "diet", "stable", "Sam is vegan"),
)
c("summary", "general", "The user asked for help choosing a laptop; they mostly do video editing.")
c("smalltalk", "general", "thank you so much, you're the best")
c(
    "user_turn",
    "general",
    "User: I'm reading Project Hail Mary right now, it's great.",
    F("user", "reading", "standard", "User is reading Project Hail Mary"),
)
c(
    "multi",
    "travel",
    "We're going to Kyoto next month, and my partner Alex hates crowded places.",
    F("user", "plans", "volatile", "User is going to Kyoto next month"),
    F("Alex", "relationship", "stable", "Alex is the user's partner"),
    F("Alex", "dislikes", "standard", "Alex dislikes crowded places"),
)
c("logistics", "general", "I'll be offline until Monday.")
c(
    "rule",
    "health",
    "Whenever I log a workout, ask me how I slept.",
    rules=("Whenever the user logs a workout, ask how they slept",),
)
c(
    "first_person",
    "general",
    "I work for the city council in the planning department.",
    F("user", "works_at", "stable", "User works at the city council"),
)
c(
    "retraction",
    "health",
    "Turns out I'm not allergic to peanuts after all, the test was negative.",
    known=(F("user", "allergic_to", "permanent", "User is allergic to peanuts"),),
    contradicts=("allergic_to",),
)
c(
    "reported",
    "general",
    "My friend Chloe says she lives in Montreal now.",
    F("Chloe", "relationship", "stable", "Chloe is the user's friend"),
    F("Chloe", "lives_in", "stable", "Chloe lives in Montreal"),
)
c("question", "general", "Should I take the job offer in Denver?")
c(
    "dialogue",
    "general",
    "Ahmed: We just got a puppy, a beagle called Biscuit.",
    F("Ahmed", "has_pet", "stable", "Ahmed has a beagle called Biscuit"),
)
c("smalltalk", "general", "brb grabbing coffee")
c(
    "first_person",
    "general",
    "I'm a huge fan of jazz, especially Coltrane.",
    F("user", "likes", "standard", "User likes jazz"),
)
c("summary", "finance", "Session summary: reviewed the user's budget. No changes to savings goals.")
c("hypothetical", "travel", "Suppose I flew to Rome instead, would that be cheaper?")
c("assistant", "general", "Assistant: Sure! Here are five ideas for a birthday gift.")
c(
    "rule",
    "general",
    "Address me as Dr. Osei in formal emails.",
    rules=("Address the user as Dr. Osei in formal emails",),
)
c(
    "multi",
    "health",
    "I'm pregnant, due in August, and I've been diagnosed with gestational diabetes.",
    F("user", "medical_condition", "permanent", "User has gestational diabetes"),
)
c(
    "user_turn",
    "general",
    "User: I grew up in Nairobi but I've lived in London for ten years.",
    F("user", "hometown", "permanent", "User grew up in Nairobi"),
    F("user", "lives_in", "stable", "User lives in London"),
)
c("logistics", "general", "The Wi-Fi password is on the fridge.")
c("first_person", "general", "i dont like coffee at all", F("user", "dislikes", "standard", "User dislikes coffee"))
c("reported", "general", "Jamal told me his wife is a pilot for Emirates.")
c("smalltalk", "general", "Happy Friday!")
c("question", "learning", "Can you explain how compound interest works?")
c("dialogue", "general", "Lena: I've been vegan for three years now.", F("Lena", "diet", "stable", "Lena is vegan"))
c(
    "first_person",
    "general",
    "I'm planning to visit my parents in Manila next week.",
    F("user", "plans", "volatile", "User is planning to visit my parents in Manila next week"),
)
c(
    "retraction",
    "general",
    "I stopped learning piano, didn't have the time.",
    known=(F("user", "learning", "standard", "User is learning piano"),),
    contradicts=("learning",),
)
c(
    "rule",
    "cooking",
    "Always include the cooking time at the top of a recipe.",
    rules=("Always include the cooking time at the top of a recipe",),
)
c("summary", "health", "Session summary: user reported poor sleep this week due to work stress.")
c("hypothetical", "general", "If it rains tomorrow I'll stay home.")
c(
    "multi",
    "general",
    "I'm Chinedu, I study computer science at the University of Lagos, and I play the guitar.",
    F("user", "name", "permanent", "User's name is Chinedu"),
    F("user", "studies", "stable", "User studies computer science"),
    F("user", "studies", "stable", "User studies at the University of Lagos"),
)
c(
    "assistant",
    "travel",
    "Assistant: Since you're based in Munich, the train to Vienna is the easiest option.",
    F("user", "lives_in", "stable", "User lives in Munich"),
)
c("smalltalk", "general", "that made me laugh, thanks")
c(
    "first_person",
    "finance",
    "My goal is to pay off my student loans by 2027.",
    F("user", "goal", "standard", "User's goal is to pay off my student loans by 2027"),
)
c("logistics", "general", "Please send the invoice to accounts@example.com.")
c(
    "user_turn",
    "health",
    "User: I have a severe peanut allergy, carry an EpiPen.",
    F("user", "allergic_to", "permanent", "User is allergic to peanut"),
)
c("question", "general", "Which is better for beginners, Python or JavaScript?")
c("reported", "general", "My mom said she's moving to Florida next year.")
c(
    "dialogue",
    "general",
    "Rui: I work at Feedzai, on the fraud team.",
    F("Rui", "works_at", "stable", "Rui works at Feedzai"),
)
c(
    "rule",
    "general",
    "Never share my calendar details with other butlers.",
    rules=("Never share the user's calendar details with other butlers",),
)
c("smalltalk", "general", "yep, got it")
c(
    "first_person",
    "general",
    "I've been working on a birdhouse for the garden.",
    F("user", "working_on", "standard", "User is working on a birdhouse"),
)
c(
    "summary",
    "general",
    "Session summary: the user, Nadia, is a graphic designer who lives in Amsterdam.",
    F("user", "name", "permanent", "User's name is Nadia"),
    F("user", "job", "stable", "User is a graphic designer"),
    F("user", "lives_in", "stable", "User lives in Amsterdam"),
)
c("hypothetical", "general", "Imagine I had a million dollars, what would you invest in?")
c("assistant", "general", "Assistant: Great question! Compound interest means you earn interest on interest.")
c(
    "multi",
    "cooking",
    "I hate cilantro and I'm allergic to sesame.",
    F("user", "dislikes", "standard", "User dislikes cilantro"),
    F("user", "allergic_to", "permanent", "User is allergic to sesame"),
)
c("logistics", "general", "Cancel my 2pm, something came up.")
c("first_person", "general", "I'm originally from Kraków.", F("user", "hometown", "permanent", "User is from Kraków"))
c(
    "retraction",
    "general",
    "I don't have the dog anymore, Rex passed away last winter.",
    known=(F("user", "has_pet", "stable", "User has a dog named Rex"),),
    contradicts=("has_pet",),
)
c(
    "reported",
    "health",
    "User mentioned they are allergic to latex.",
    F("user", "allergic_to", "permanent", "User is allergic to latex"),
)
c("smalltalk", "general", "hmm, let me think about it")
c("question", "travel", "Do I need a visa for Vietnam?")
c(
    "dialogue",
    "general",
    "Chen: My brother Wei lives in Shanghai and runs a tea shop.",
    F("Wei", "relationship", "permanent", "Wei is Chen's brother"),
    F("Wei", "lives_in", "stable", "Wei lives in Shanghai"),
)
c(
    "rule",
    "general",
    "When you summarise articles, always include the source link.",
    rules=("When summarising articles, always include the source link",),
)
c(
    "user_turn",
    "general",
    "User: I'm 27 years old and I live in Austin.",
    F("user", "age", "stable", "User is 27 years old"),
    F("user", "lives_in", "stable", "User lives in Austin"),
)
c(
    "first_person",
    "general",
    "I enjoy baking bread on Sundays.",
    F("user", "likes", "standard", "User likes baking bread"),
)
c(
    "summary",
    "travel",
    "Session summary: booked a hotel in Seville for the user's trip; they prefer quiet rooms.",
    F("user", "prefers", "stable", "User prefers quiet rooms"),
)
c("hypothetical", "health", "Would it hurt to skip breakfast?")
c(
    "assistant",
    "cooking",
    "Assistant: Understood — since you don't eat pork, I swapped the bacon for turkey.",
    F("user", "diet", "stable", "User does not eat pork"),
)
c("logistics", "general", "Heads up, I'll be late to the call.")
c(
    "multi",
    "general",
    "My best friend Kofi is a doctor in Accra.",
    F("Kofi", "relationship", "stable", "Kofi is the user's best friend"),
    F("Kofi", "job", "stable", "Kofi is a doctor"),
    F("Kofi", "lives_in", "stable", "Kofi lives in Accra"),
)
c("smalltalk", "general", "wow, nice")
c(
    "first_person",
    "general",
    "I recently moved to Denver for work.",
    F("user", "lives_in", "stable", "User lives in Denver"),
)
c("reported", "general", "Priya said the restaurant was fully booked.")
c("question", "general", "Where should I go for dinner tonight?")
c(
    "dialogue",
    "general",
    "Marco: I'm studying architecture in Milan.",
    F("Marco", "studies", "stable", "Marco studies architecture"),
)
c(
    "rule",
    "finance",
    "Always double-check the exchange rate before converting anything for me.",
    rules=("Always double-check the exchange rate before converting",),
)
c(
    "first_person",
    "general",
    "My favorite food is ramen.",
    F("user", "favorite", "stable", "User's favorite food is ramen"),
)
c("retraction", "general", "I'm not married anymore, we divorced last year.")
c(
    "summary",
    "general",
    "User asked health butler to log weight 75kg, mentioned they started a new diet last week.",
    F("user", "diet", "stable", "User started a new diet"),
)
c("hypothetical", "general", "I might take up running, I'm thinking about it.")
c("assistant", "general", "Assistant: I've updated your shopping list.")
c("smalltalk", "general", "sorry, typo")
c(
    "multi",
    "health",
    "I'm on a keto diet and I'm trying to lose 10 kilos before the wedding.",
    F("user", "diet", "stable", "User is on a keto diet"),
)
c("logistics", "general", "Set a timer for 20 minutes.")
c(
    "first_person",
    "general",
    "I have two kids and a golden retriever named Max.",
    F("user", "has_pet", "stable", "User has a golden retriever named Max"),
)
c(
    "user_turn",
    "general",
    "User: I'm Japanese but I grew up in São Paulo.",
    F("user", "nationality", "permanent", "User is Japanese"),
    F("user", "hometown", "permanent", "User grew up in São Paulo"),
)
c("question", "general", "Is it going to rain this weekend?")
c(
    "reported",
    "general",
    "My colleague Dana is moving to the Berlin office.",
    F("Dana", "relationship", "stable", "Dana is the user's colleague"),
)
c(
    "dialogue",
    "general",
    "Fatima: I speak Arabic, French and English.",
    F("Fatima", "speaks", "stable", "Fatima speaks Arabic"),
    F("Fatima", "speaks", "stable", "Fatima speaks French"),
    F("Fatima", "speaks", "stable", "Fatima speaks English"),
)
c("rule", "general", "Don't send me notifications after 10pm.", rules=("Don't send notifications after 10pm",))
c("smalltalk", "general", "good night")
c(
    "first_person",
    "general",
    "I work at a bakery on weekends.",
    F("user", "works_at", "stable", "User works at a bakery"),
)
c(
    "summary",
    "general",
    "Session summary: Kim is a nurse at Seoul National Hospital. She dislikes spicy food.",
    F("Kim", "job", "stable", "Kim is a nurse"),
    F("Kim", "works_at", "stable", "Kim works at Seoul National Hospital"),
    F("Kim", "dislikes", "standard", "Kim dislikes spicy food"),
)
c("hypothetical", "general", "If only I had more free time.")
c(
    "assistant",
    "health",
    "Assistant: Got it - you have a bad back, so I'll skip the deadlifts.",
    F("user", "medical_condition", "permanent", "User has a bad back"),
)
c("logistics", "general", "Book a table for two at 7.")
c(
    "multi",
    "general",
    "I live in Nairobi, I'm a data scientist, and I'm learning Mandarin.",
    F("user", "lives_in", "stable", "User lives in Nairobi"),
    F("user", "job", "stable", "User is a data scientist"),
    F("user", "learning", "standard", "User is learning Mandarin"),
)
c("first_person", "general", "I don't eat pork.", F("user", "diet", "stable", "User does not eat pork"))
c("question", "finance", "How much should I save each month?")
c(
    "reported",
    "general",
    "The user explained that their partner Jordan works at Shopify.",
    F("Jordan", "relationship", "stable", "Jordan is the user's partner"),
    F("Jordan", "works_at", "stable", "Jordan works at Shopify"),
)
c("smalltalk", "general", "nice one!")
c(
    "dialogue",
    "general",
    "Olga: I'm allergic to cats, so no cat cafés for me.",
    F("Olga", "allergic_to", "permanent", "Olga is allergic to cats"),
)
c(
    "rule",
    "general",
    "Always confirm with me before sending any email on my behalf.",
    rules=("Always confirm with the user before sending any email on their behalf",),
)
c("user_turn", "general", "User: my name is Tariq", F("user", "name", "permanent", "User's name is Tariq"))
c(
    "retraction",
    "general",
    "I moved out of Chicago last month.",
    known=(F("user", "lives_in", "stable", "User lives in Chicago"),),
    contradicts=("lives_in",),
)
c("first_person", "general", "I'm a pescatarian.", F("user", "diet", "stable", "User is pescatarian"))
c("summary", "general", "The user seemed stressed today and asked for a breathing exercise.")
c("hypothetical", "general", "What would happen if I stopped paying the bill?")
c("assistant", "general", "Assistant: Your meeting with Paul is at 3pm.")
c("logistics", "general", "Remember to water the plants while I'm away.")
c("smalltalk", "general", "cheers mate")
c(
    "multi",
    "general",
    "My daughter Emma is 6 and loves dinosaurs.",
    F("Emma", "relationship", "permanent", "Emma is the user's daughter"),
    F("Emma", "likes", "standard", "Emma likes dinosaurs"),
)
c(
    "first_person",
    "general",
    "I live with type 1 diabetes.",
    F("user", "medical_condition", "permanent", "User has type 1 diabetes"),
)
c("question", "general", "Any good podcast recommendations?")
c(
    "reported",
    "general",
    "Noor said she's been promoted to head of design at Canva.",
    F("Noor", "works_at", "stable", "Noor works at Canva"),
)
c(
    "dialogue",
    "general",
    "Diego: My favorite band is Radiohead.",
    F("Diego", "favorite", "stable", "Diego's favorite band is Radiohead"),
)
c(
    "rule",
    "cooking",
    "For the recipes collection, format ingredients as a bulleted list.",
    rules=("For the recipes collection, format ingredients as a bulleted list",),
)
c("smalltalk", "general", "I'm so tired today")
c(
    "first_person",
    "general",
    "I'm originally from Cork but I live in Dublin now.",
    F("user", "hometown", "permanent", "User is from Cork"),
    F("user", "lives_in", "stable", "User lives in Dublin"),
)
c(
    "user_turn",
    "general",
    "User: I hate waking up early.",
    F("user", "dislikes", "standard", "User dislikes waking up early"),
)
c(
    "summary",
    "general",
    "Relationship butler drafted a birthday message for Maria, user edited the tone to be more casual.",
    rules=("User prefers a more casual tone in messages",),
)
c("hypothetical", "general", "Should I maybe switch to an iPhone?")
c(
    "assistant",
    "general",
    "Assistant: So you're a vegetarian who loves spicy food - noted!",
    F("user", "diet", "stable", "User is vegetarian"),
    F("user", "likes", "standard", "User likes spicy food"),
)
c("logistics", "general", "The meeting is in room 4B.")
c(
    "multi",
    "general",
    "I'm Ingrid, I'm a veterinarian, and I live in Oslo with my husband Erik.",
    F("user", "name", "permanent", "User's name is Ingrid"),
    F("user", "job", "stable", "User is a veterinarian"),
    F("user", "lives_in", "stable", "User lives in Oslo"),
    F("Erik", "relationship", "permanent", "Erik is the user's husband"),
)
c(
    "first_person",
    "general",
    "I really enjoy cooking Thai food.",
    F("user", "likes", "standard", "User likes cooking Thai food"),
)
c("question", "general", "What time is it in Tokyo?")
c("reported", "general", "User said they work for Airbus.", F("user", "works_at", "stable", "User works at Airbus"))
c("smalltalk", "general", "no worries")
c("dialogue", "general", "Yusuf: I'm a student at MIT.", F("Yusuf", "studies", "stable", "Yusuf studies at MIT"))
c("rule", "general", "Always reply in Spanish.", rules=("Always reply in Spanish",))
c("first_person", "general", "We live in Cape Town.", F("user", "lives_in", "stable", "User lives in Cape Town"))
c(
    "retraction",
    "cooking",
    "I'm no longer on the keto diet.",
    known=(F("user", "diet", "stable", "User is on a keto diet"),),
    contradicts=("diet",),
)
c("summary", "general", "Session summary: chatted about the weather and weekend plans, nothing notable.")
c("hypothetical", "general", "I'd probably move to Spain if I could work remotely.")
c(
    "assistant",
    "general",
    "Assistant: Since you prefer morning workouts, I scheduled them at 7am.",
    F("user", "prefers", "stable", "User prefers morning workouts"),
)
c("logistics", "general", "Pick up milk on the way home.")
c(
    "multi",
    "general",
    "My brother Sam is an electrician and he lives in Leeds.",
    F("Sam", "relationship", "permanent", "Sam is the user's brother"),
    F("Sam", "job", "stable", "Sam is an electrician"),
    F("Sam", "lives_in", "stable", "Sam lives in Leeds"),
)
c("smalltalk", "general", "haha true")
c(
    "first_person",
    "general",
    "I've got a cat called Pixel.",
    F("user", "has_pet", "stable", "User has a cat called Pixel"),
)
c("question", "general", "How do I reset my password?")
c("user_turn", "general", "User: I'm fluent in Portuguese.", F("user", "speaks", "stable", "User speaks Portuguese"))
c(
    "reported",
    "general",
    "My neighbour Ruth mentioned she's a retired teacher.",
    F("Ruth", "relationship", "stable", "Ruth is the user's neighbour"),
)
c(
    "dialogue",
    "general",
    "Hana: I live in Osaka and work at Panasonic.",
    F("Hana", "lives_in", "stable", "Hana lives in Osaka"),
    F("Hana", "works_at", "stable", "Hana works at Panasonic"),
)
c("rule", "general", "In future, send me the summary as bullet points.", rules=("Send the summary as bullet points",))
c("smalltalk", "general", "see you")
c(
    "first_person",
    "general",
    "I'm allergic to dust mites and pollen.",
    F("user", "allergic_to", "permanent", "User is allergic to dust mites"),
    F("user", "allergic_to", "permanent", "User is allergic to pollen"),
)
c("logistics", "general", "The deadline for the grant is next Tuesday.")
c(
    "summary",
    "health",
    "Session summary: the user has migraines and avoids screens after 9pm.",
    F("user", "medical_condition", "permanent", "User has migraines"),
)
c("hypothetical", "general", "Would you recommend I sell my car?")
c("assistant", "general", "Assistant: Happy to help with that spreadsheet!")
c(
    "multi",
    "general",
    "I just started learning Spanish and I'm reading Don Quixote.",
    F("user", "learning", "standard", "User is learning Spanish"),
    F("user", "reading", "standard", "User is reading Don Quixote"),
)
c(
    "first_person",
    "general",
    "My partner's name is Robin.",
    F("Robin", "relationship", "stable", "Robin is the user's partner"),
)

CASES: tuple[Case, ...] = tuple(
    Case(
        id=f"x{i:03d}",
        form=form,
        split="held" if i % 5 in (1, 3) else "dev",
        butler=butler,
        content=content,
        facts=facts,
        rules=rules,
        known=known,
        contradicts=contradicts,
    )
    for i, (form, butler, content, facts, rules, known, contradicts) in enumerate(_RAW)
)
