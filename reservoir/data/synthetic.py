"""A built-in, deterministic generator of TinyStories-like stories.

It makes `python TinyStories.py` work on a machine with no network and no
data. The stories have characters with names and pronouns that must agree,
places, objects, feelings, dialogue and small plots that end in a moral, so a
model has long-range structure to learn (who the story is about, what was
lost, how it ends) that a bigram model cannot get from local statistics.
Numbers from it are *not* TinyStories numbers; results say which source ran.
"""

from __future__ import annotations

import random

_GIRLS = ["Lily", "Mia", "Sue", "Anna", "Emma", "Zoe", "Lucy", "Ella", "Rosa", "Kim"]
_BOYS = ["Tom", "Ben", "Max", "Sam", "Leo", "Tim", "Jack", "Finn", "Joe", "Bob"]
_ANIMALS = [("cat", "it"), ("dog", "it"), ("bunny", "it"), ("bird", "it"), ("frog", "it"),
            ("bear", "it"), ("duck", "it"), ("fox", "it"), ("mouse", "it"), ("fish", "it")]
_ANIMAL_NAMES = ["Spot", "Fluffy", "Pip", "Coco", "Buddy", "Sunny", "Bubbles", "Max", "Daisy", "Ziggy"]
_ADJECTIVES = ["little", "happy", "curious", "brave", "shy", "kind", "silly", "small", "busy", "gentle"]
_PLACES = ["the park", "the garden", "the forest", "the beach", "the big hill", "the farm", "the pond",
           "the school yard", "the old house", "the market"]
_OBJECTS = [("ball", "red"), ("kite", "blue"), ("hat", "yellow"), ("toy car", "green"), ("doll", "pink"),
            ("book", "big"), ("shell", "shiny"), ("box", "small"), ("cup", "pretty"), ("flower", "white"),
            ("drum", "loud"), ("key", "golden")]
_FEELINGS_GOOD = ["happy", "glad", "proud", "excited", "calm"]
_FEELINGS_BAD = ["sad", "scared", "angry", "worried", "lonely"]
_HELPERS = ["mom", "dad", "grandma", "grandpa", "the teacher", "a wise owl", "an old man", "a friendly dog"]
_OPENINGS = ["Once upon a time, there was", "One day, there was", "Once, there was", "Long ago, there was"]
_WEATHER = ["The sun was shining.", "It was a windy day.", "The sky was blue and clear.",
            "It was raining a little.", "It was a warm and sunny morning."]
_MORALS = {
    "share": "{name} learned that sharing makes everyone happy.",
    "lost": "{name} learned to take good care of {poss} things.",
    "help": "{name} learned that it is good to help others.",
    "brave": "{name} learned that being brave can make fears go away.",
    "sorry": "{name} learned that saying sorry can fix a friendship.",
}


def _hero(rng: random.Random) -> dict:
    kind = rng.random()
    if kind < 0.4:
        return {"name": rng.choice(_GIRLS), "what": "girl", "sub": "she", "obj": "her", "poss": "her"}
    if kind < 0.8:
        return {"name": rng.choice(_BOYS), "what": "boy", "sub": "he", "obj": "him", "poss": "his"}
    animal, _ = rng.choice(_ANIMALS)
    return {"name": rng.choice(_ANIMAL_NAMES), "what": animal, "sub": "it", "obj": "it", "poss": "its"}


def _friend(rng: random.Random, hero: dict) -> dict:
    friend = _hero(rng)
    while friend["name"] == hero["name"]:
        friend = _hero(rng)
    return friend


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _plot_share(rng, h, f, obj, color, place):
    return [
        f"{h['name']} had a {color} {obj}. {_cap(h['sub'])} loved the {obj} very much.",
        f"One day, {h['name']} went to {place} with the {obj}. There {h['sub']} met {f['name']}, a {f['what']}.",
        f'"Can I play with your {obj}?" asked {f["name"]}.',
        f'{h["name"]} did not want to share. "No, it is my {obj}!" {h["sub"]} said.',
        f"{f['name']} felt {rng.choice(_FEELINGS_BAD)} and walked away.",
        f"{h['name']} played alone, but it was not fun. {_cap(h['sub'])} felt {rng.choice(_FEELINGS_BAD)} too.",
        f'So {h["name"]} ran to {f["name"]} and said, "Let\'s play with my {obj} together."',
        f"They played all day and had lots of fun. "
        f"{h['name']} and {f['name']} were {rng.choice(_FEELINGS_GOOD)}.",
    ], "share"


def _plot_lost(rng, h, f, obj, color, place):
    helper = rng.choice(_HELPERS)
    return [
        f"{h['name']} liked to play with {h['poss']} {color} {obj} at {place}.",
        f"One day, {h['name']} could not find the {obj}. {_cap(h['sub'])} looked everywhere.",
        f"{_cap(h['sub'])} looked under the bed and behind the door, but the {obj} was not there.",
        f'{h["name"]} felt {rng.choice(_FEELINGS_BAD)}. "Where is my {obj}?" {h["sub"]} cried.',
        f"Then {helper} came and said, \"Let's look at {place}.\"",
        f"They went to {place} together. There, next to a tree, was the {color} {obj}!",
        f"{h['name']} hugged the {obj} and said thank you to {helper}.",
    ], "lost"


def _plot_help(rng, h, f, obj, color, place):
    return [
        f"{h['name']} was walking in {place} when {h['sub']} heard a small voice.",
        f"It was {f['name']}, a {f['what']}. {f['name']} was stuck and could not get out.",
        f'"Help me, please!" said {f["name"]}. {_cap(f["sub"])} was very {rng.choice(_FEELINGS_BAD)}.',
        f"{h['name']} used {h['poss']} {color} {obj} to help. {_cap(h['sub'])} pulled and pulled.",
        f"At last, {f['name']} was free! \"Thank you, {h['name']}!\" {f['sub']} said.",
        f"From that day on, {h['name']} and {f['name']} were best friends.",
    ], "help"


def _plot_brave(rng, h, f, obj, color, place):
    fear = rng.choice(["scared", "afraid"])
    return [
        f"{h['name']} wanted to go to {place}, but {h['sub']} was {fear} of the dark.",
        f"{h['poss'].capitalize()} friend {f['name']} said, \"Do not be afraid. I will come with you.\"",
        f"They took a {color} {obj} and went to {place} at night.",
        f"It was dark and quiet. {h['name']} heard a noise and wanted to run.",
        f"But it was only a little {rng.choice(_ANIMALS)[0]} saying hello.",
        f"{h['name']} laughed. {_cap(h['sub'])} was not {fear} any more.",
    ], "brave"


def _plot_sorry(rng, h, f, obj, color, place):
    return [
        f"{h['name']} and {f['name']} were playing with a {color} {obj} at {place}.",
        f"{h['name']} pushed too hard and the {obj} broke.",
        f'{f["name"]} was {rng.choice(_FEELINGS_BAD)}. "You broke my {obj}!" {f["sub"]} said.',
        f"{h['name']} felt bad. {_cap(h['sub'])} thought about what to do.",
        f'Then {h["sub"]} said, "I am sorry, {f["name"]}. I will help you fix it."',
        f"They fixed the {obj} together, and {f['name']} smiled again.",
    ], "sorry"


_PLOTS = [_plot_share, _plot_lost, _plot_help, _plot_brave, _plot_sorry]


def synthetic_story(rng: random.Random) -> str:
    hero = _hero(rng)
    friend = _friend(rng, hero)
    obj, color = rng.choice(_OBJECTS)
    place = rng.choice(_PLACES)
    opening = (f"{rng.choice(_OPENINGS)} a {rng.choice(_ADJECTIVES)} {hero['what']} "
               f"named {hero['name']}. {rng.choice(_WEATHER)}")
    body, moral = rng.choice(_PLOTS)(rng, hero, friend, obj, color, place)
    ending = _MORALS[moral].format(**hero)
    paragraphs = [opening + " " + " ".join(body[:3]), " ".join(body[3:]), ending]
    return "\n".join(paragraphs)


def synthetic_stories(n: int, seed: int) -> list[str]:
    """``n`` stories, the same ones for the same seed on every machine."""
    rng = random.Random(seed)
    return [synthetic_story(rng) for _ in range(n)]
