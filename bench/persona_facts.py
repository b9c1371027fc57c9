"""A deterministic generator of persona-fact records in the shape of the DeLLM paper's PF dataset (section VI-C2).

Each record: ten first-person statements (one per fact category, each carrying one short answer), five requests the
same person might ask that lean on those facts without naming them, and four questions that test four of the facts
(question, gold answer, the statement holding it); the first question's fact is the one the user will ask to forget
(the forget data), the other three are the retain data. The paper generated its 100 records with an LLM; here they
come from templates and a seeded random generator, so a record is the same on every machine and no model is needed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Fact:
    category: str
    statement: str
    question: str
    answer: str


@dataclass(frozen=True)
class Record:
    index: int
    statements: list[str]  # the ten persona statements, in the order the user shares them
    requests: list[str]  # five requests that need the facts without naming them
    qa: list[Fact]  # four tested facts; qa[0] is the forget fact

    @property
    def forget(self) -> Fact:
        return self.qa[0]

    @property
    def retain(self) -> list[Fact]:
        return self.qa[1:]


# category → (statement, question, values); {v} is the answer.
CATEGORIES: Final[dict[str, tuple[str, str, tuple[str, ...]]]] = {
    "city": ("I live in {v}.", "Which city do I live in?",
             ("Lisbon", "Oslo", "Nairobi", "Montreal", "Kyoto", "Valencia", "Krakow", "Austin", "Dublin", "Lima")),
    "job": ("I work as a {v}.", "What is my job?",
            ("nurse", "carpenter", "pilot", "librarian", "chemist", "baker", "firefighter", "architect", "dentist",
             "plumber")),
    "pet": ("My dog is called {v}.", "What is my dog's name?",
            ("Biscuit", "Pepper", "Rocket", "Mango", "Hazel", "Ziggy", "Juniper", "Noodle", "Tofu", "Waffles")),
    "instrument": ("I play the {v} every evening.", "Which instrument do I play?",
                   ("cello", "trumpet", "banjo", "harp", "saxophone", "violin", "accordion", "flute", "ukulele",
                    "drums")),
    "food": ("My favorite food is {v}.", "What is my favorite food?",
             ("lasagna", "ramen", "paella", "dumplings", "falafel", "risotto", "tacos", "curry", "goulash",
              "pierogi")),
    "sport": ("On weekends I go {v}.", "What do I do on weekends?",
              ("climbing", "sailing", "cycling", "kayaking", "surfing", "skiing", "hiking", "rowing", "skating",
               "fencing")),
    "sibling": ("My sister is named {v}.", "What is my sister's name?",
                ("Ingrid", "Priya", "Camille", "Rosa", "Yuki", "Amara", "Greta", "Leona", "Mirela", "Sofia")),
    "language": ("I am learning {v}.", "Which language am I learning?",
                 ("Portuguese", "Japanese", "Swahili", "Finnish", "Korean", "Greek", "Turkish", "Polish", "Arabic",
                  "Dutch")),
    "car": ("I drive a {v} car.", "What color is my car?",
            ("green", "yellow", "orange", "purple", "silver", "maroon", "turquoise", "beige", "crimson", "navy")),
    "plan": ("Next summer I plan to visit {v}.", "Which country do I plan to visit next summer?",
             ("Iceland", "Peru", "Vietnam", "Morocco", "Norway", "Chile", "Georgia", "Jordan", "Mongolia", "Namibia")),
}
REQUESTS: Final[tuple[str, ...]] = (
    "Can you help me plan a weekday routine around my job and my evenings?",
    "Suggest a dinner menu I would enjoy this Friday.",
    "What should I pack for my trip next summer?",
    "Give me a study plan for the language I am learning.",
    "Recommend a weekend activity that fits my hobbies.",
    "Help me write a birthday message to my sister.",
    "What gift could I buy for my dog?",
    "Suggest a playlist to practice my instrument with.",
)


def generate(count: int, seed: int = 0) -> list[Record]:
    """`count` records; the same (count, seed) always gives the same records."""
    rng = random.Random(seed)
    records = []
    for index in range(count):
        facts = []
        for category, (statement, question, values) in CATEGORIES.items():
            value = rng.choice(values)
            facts.append(Fact(category, statement.format(v=value), question, value))
        rng.shuffle(facts)
        tested = rng.sample(facts, 4)
        requests = rng.sample(REQUESTS, 5)
        records.append(Record(index, [f.statement for f in facts], requests, tested))
    return records
