"""kiln's generated task data (offline, seeded, exact): question answering, named entities
and word reversal. Like ``sentiment``, each takes reading, not word spotting: a QA context
holds several facts of the same kind, an entity's type depends on where it stands, and a
reversal needs every word in order.
"""

from __future__ import annotations

import random

PEOPLE = (
    "alice", "bob", "carol", "david", "emma", "frank", "grace", "henry", "irene", "jack",
    "kate", "liam", "maria", "noah", "olivia", "peter", "rosa", "sam", "tina", "victor",
)  # fmt: skip
SURNAMES = ("smith", "jones", "brown", "taylor", "wilson", "clark", "lewis", "walker")
CITIES = (
    "paris", "london", "berlin", "madrid", "rome", "vienna", "oslo", "dublin", "lisbon",
    "prague", "new york", "san francisco", "hong kong", "buenos aires", "cape town",
)  # fmt: skip
JOBS = (
    "teacher", "doctor", "pilot", "chef", "lawyer", "nurse", "farmer", "painter", "baker",
    "engineer", "writer", "singer",
)  # fmt: skip
ORGS = ("acme", "globex", "initech", "umbrella", "hooli", "stark industries", "wayne enterprises")
FOODS = ("apples", "pasta", "rice", "soup", "cheese", "bread", "fish", "salad")

QA_FACTS = {
    "city": ("{p} lives in {v}.", "where does {p} live?"),
    "job": ("{p} works as a {v}.", "what does {p} work as?"),
    "food": ("{p} likes to eat {v}.", "what does {p} like to eat?"),
}


def generate_qa(num_samples: int, seed: int = 0) -> dict[str, list]:
    """Extractive QA rows: a context of 3 to 5 facts about different people (two facts of a
    kind are common), a question about one, and its answer span.

    Returns:
        Column lists ``context``, ``question``, ``answer`` and ``answer_start`` (the
        answer's character offset in ``context``).
    """
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples!r} must be >= 1")
    rng = random.Random(seed)
    values = {"city": CITIES, "job": JOBS, "food": FOODS}
    rows: dict[str, list] = {"context": [], "question": [], "answer": [], "answer_start": []}
    for _ in range(num_samples):
        people = rng.sample(PEOPLE, rng.randint(3, 5))
        facts = [(p, rng.choice(list(QA_FACTS)), None) for p in people]
        facts = [(p, kind, rng.choice(values[kind])) for p, kind, _ in facts]
        person, kind, answer = rng.choice(facts)
        context, start = "", -1
        for p, k, v in facts:
            sentence = QA_FACTS[k][0].format(p=p, v=v)
            if (p, k) == (person, kind):
                start = len(context) + sentence.index(v, len(p))
            context += sentence + " "
        rows["context"].append(context.strip())
        rows["question"].append(QA_FACTS[kind][1].format(p=person))
        rows["answer"].append(answer)
        rows["answer_start"].append(start)
    return rows


NER_LABELS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG")
NER_TEMPLATES = (
    "{PER} flew to {LOC} last week",
    "{PER} joined {ORG} in {LOC}",
    "the team at {ORG} met {PER} yesterday",
    "{ORG} opened an office in {LOC}",
    "in {LOC} {PER} founded {ORG}",
    "{PER} and {PER} visited {LOC}",
    "people from {LOC} work for {ORG}",
)


def _entity(rng: random.Random, kind: str) -> list[str]:
    if kind == "PER":
        words = [rng.choice(PEOPLE)]
        return [*words, rng.choice(SURNAMES)] if rng.random() < 0.5 else words
    return (rng.choice(CITIES) if kind == "LOC" else rng.choice(ORGS)).split()


def generate_ner(num_samples: int, seed: int = 0) -> dict[str, list]:
    """Named-entity rows: words and their IOB2 tags (``NER_LABELS`` indices); some
    people have a surname, some places and organizations are two words.

    Returns:
        Column lists ``tokens`` (lists of words) and ``tags`` (lists of label indices).
    """
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples!r} must be >= 1")
    rng = random.Random(seed)
    rows: dict[str, list] = {"tokens": [], "tags": []}
    for _ in range(num_samples):
        words, tags = [], []
        for part in rng.choice(NER_TEMPLATES).split():
            if part.startswith("{"):
                kind = part.strip("{}")
                entity = _entity(rng, kind)
                words += entity
                tags += [NER_LABELS.index(f"B-{kind}")]
                tags += [NER_LABELS.index(f"I-{kind}")] * (len(entity) - 1)
            else:
                words.append(part)
                tags.append(0)
        rows["tokens"].append(words)
        rows["tags"].append(tags)
    return rows


REVERSE_WORDS = (*PEOPLE[:10], *JOBS[:8], *FOODS, "red", "green", "blue", "big", "small")


def generate_reverse(num_samples: int, seed: int = 0) -> dict[str, list]:
    """Sequence-to-sequence rows: ``reverse: w1 ... wn`` (3 to 7 words) and the words in
    reverse order.

    Returns:
        Column lists ``source`` and ``target``.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples!r} must be >= 1")
    rng = random.Random(seed)
    rows: dict[str, list] = {"source": [], "target": []}
    for _ in range(num_samples):
        words = rng.choices(REVERSE_WORDS, k=rng.randint(3, 7))
        rows["source"].append("reverse: " + " ".join(words))
        rows["target"].append(" ".join(reversed(words)))
    return rows
