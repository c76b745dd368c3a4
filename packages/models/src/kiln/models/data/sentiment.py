"""A generated sentiment dataset that takes context to learn.

Every adjective appears with both labels in equal measure: negation flips it ("not bad",
"hardly good") and contrast makes the second clause decide ("I expected it to be awful
but it was great"). A bag of words sees the same words under both labels, so it cannot
solve the task; a model that reads order and scope can. Generation is seeded and exact:
the same arguments give the same rows on every machine.
"""

from __future__ import annotations

import random

POSITIVE = (
    "good", "great", "excellent", "wonderful", "delightful", "superb", "pleasant",
    "brilliant", "charming", "enjoyable", "fantastic", "lovely", "impressive", "fun",
)  # fmt: skip
NEGATIVE = (
    "bad", "awful", "terrible", "boring", "dull", "horrible", "poor", "disappointing",
    "dreadful", "tedious", "weak", "bland", "clumsy", "mediocre",
)  # fmt: skip
SUBJECTS = (
    "the movie", "the film", "this book", "the plot", "the acting", "the soundtrack",
    "the ending", "the dinner", "the service", "the show", "this album", "the game",
    "the story", "the hotel", "the script", "the food",
)  # fmt: skip
NEGATIONS = ("not", "hardly", "never", "far from", "not at all", "by no means")
INTENSIFIERS = ("", "", "very ", "really ", "quite ", "truly ", "rather ")
LABELS = ("negative", "positive")


def _adjective(rng: random.Random, positive: bool) -> str:
    return rng.choice(POSITIVE if positive else NEGATIVE)


def _sentence(rng: random.Random, label: int) -> str:
    subject = rng.choice(SUBJECTS)
    verb = rng.choice(("was", "is"))
    kind = rng.randrange(6)
    if kind == 0:  # plain: the adjective decides
        return f"{subject} {verb} {rng.choice(INTENSIFIERS)}{_adjective(rng, label == 1)}."
    if kind == 1:  # negated: the adjective is the opposite of the label
        neg = rng.choice(NEGATIONS)
        return f"{subject} {verb} {neg} {_adjective(rng, label == 0)}."
    if kind == 2:  # expectation, then reality: the second adjective decides
        first, second = _adjective(rng, label == 0), _adjective(rng, label == 1)
        return f"i expected {subject} to be {first} but it {verb} {second}."
    if kind == 3:  # concession: the main clause decides
        first, second = _adjective(rng, label == 0), _adjective(rng, label == 1)
        return f"although {subject} {verb} {first}, overall it {verb} {second}."
    if kind == 4:  # contrast with a negated second clause
        first, second = _adjective(rng, label == 1), _adjective(rng, label == 1)
        neg = rng.choice(NEGATIONS)
        return f"some said {subject} {verb} {neg} {first}, yet it {verb} {second}."
    # a negated opposite followed by a plain restatement of the label
    first, second = _adjective(rng, label == 0), _adjective(rng, label == 1)
    neg = rng.choice(NEGATIONS)
    return f"{subject} {verb} {neg} {first}; it {verb} {rng.choice(INTENSIFIERS)}{second}."


def generate_sentiment(num_samples: int, seed: int = 0) -> dict[str, list]:
    """Generate ``num_samples`` balanced rows ``{"text": [...], "label": [...]}``.

    Args:
        num_samples: Rows to generate.
        seed: The generator's seed; the rows depend only on (num_samples, seed).

    Returns:
        Column lists; ``label`` is 1 for positive, 0 for negative.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples!r} must be >= 1")
    rng = random.Random(seed)
    labels = [i % 2 for i in range(num_samples)]
    rng.shuffle(labels)
    return {"text": [_sentence(rng, label) for label in labels], "label": labels}
