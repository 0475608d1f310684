"""The "reviews" world: a small grammar of product reviews with a known sentiment for every sentence.

Text is lower-case words and punctuation separated by single spaces, e.g.

    prompt:   "i bought this kettle last month and"
    response: "the price is really good . to be honest , the lid is poor ."

A *prompt* is an opener naming a product, optionally after a focus sentence naming an aspect
("i care about the battery . review of the kettle :"): 40 products × 20 openers × (1 + 3 focus templates ×
16 aspects) = 39,200 distinct prompts (`prompt_space`). How prompts split into train / eval / test / ood:
`rlhf_lab.world.splits`. A *response* is a sequence of sentences, each produced by one of the productions
below; every production has a known valence (sentiment in [-1.3, 1.3]). Filler
("empathy") sentences carry no information and have valence 0. `parse_sentence` is the grammar's
recogniser: it returns the valence of a sentence the grammar can produce, or None.
"""

from __future__ import annotations

from dataclasses import dataclass

PRODUCTS = [
    "blender", "phone", "jacket", "lamp", "chair", "kettle", "camera", "backpack",
    "printer", "headphones", "mattress", "toaster", "keyboard", "tent", "watch", "speaker",
    "drone", "scooter", "router", "monitor", "vacuum", "heater", "fan", "grill",
    "mixer", "tablet", "laptop", "mouse", "umbrella", "wallet", "helmet", "bicycle",
    "pillow", "sofa", "desk", "microwave", "projector", "charger", "thermos", "guitar",
]
ASPECTS = [
    "battery", "price", "design", "quality", "sound", "size", "color", "handle",
    "screen", "motor", "lid", "strap", "button", "cable", "fabric", "finish",
]
# adjective -> valence
ADJECTIVES = {
    "excellent": 1.0, "great": 0.9, "wonderful": 0.9, "good": 0.6, "nice": 0.5, "solid": 0.5,
    "fine": 0.2, "okay": 0.0, "average": 0.0, "plain": -0.1,
    "cheap": -0.3, "weak": -0.5, "poor": -0.6, "bad": -0.7, "awful": -1.0, "terrible": -1.0,
}
# adverb -> multiplier of the adjective's valence
ADVERBS = {"very": 1.3, "really": 1.3, "quite": 1.1, "a bit": 0.7, "not": -0.6}
# verb phrase (after "it") -> valence
VERB_PHRASES = {
    "works perfectly": 1.0, "works well": 0.7, "does the job": 0.3, "arrived on time": 0.1,
    "arrived late": -0.3, "stopped working": -0.9, "broke quickly": -1.0, "feels flimsy": -0.6,
}
# "i <verb> it ." -> valence
FEELINGS = {"love": 1.0, "like": 0.5, "tolerate": -0.1, "dislike": -0.5, "hate": -1.0}
NEUTRAL_SENTENCES = [
    "it came in a box .", "i use it every day .", "my friend has one too .",
    "i got it as a gift .", "it is the second one i own .", "the manual is short .",
]
FILLERS = [
    "i understand how you feel .", "to be honest ,", "thank you for asking .",
    "i hope this helps .", "as you can imagine ,",
]
OPENERS = [
    "i bought this {p} last month and", "review of the {p} :", "my honest take on the {p} :",
    "we have used the {p} for a week and", "after a few days with the {p} ,",
    "here is what i think of the {p} :", "thoughts on the {p} :", "i got the {p} for my birthday and",
    "our family tried the {p} and", "a quick review of the {p} :", "so i finally tried the {p} and",
    "my first week with the {p} :", "the {p} arrived yesterday and", "i have owned this {p} for a year and",
    "two months with the {p} :", "my verdict on the {p} :", "is the {p} worth it ?",
    "what i learned from the {p} :", "rating the {p} :", "i use the {p} at work and",
]
# An optional focus sentence before the opener names an aspect the asker cares about, e.g.
# "i care about the battery . review of the kettle :". It is cosmetic: the gold reward ignores it (a
# response need not mention the aspect, and one that does scores as any other aspect sentence).
FOCUS = ["focus on the {a} .", "mostly about the {a} .", "i care about the {a} ."]
FOCUS_RATE = 0.5  # chance that a generated prompt has a focus sentence


def opener_product(prompt: str) -> str | None:
    """The product a prompt is about (None if the prompt is not an opener of this world)."""
    words = prompt.split()
    for p in PRODUCTS:
        if p in words:
            return p
    return None


def prompt_focus(prompt: str) -> str | None:
    """The aspect named by a prompt's focus sentence (None without one). Cosmetic: gold ignores it."""
    words = prompt.split()
    if "." in words:
        head = words[: words.index(".")]
        if head and head[-1] in ASPECTS:
            return head[-1]
    return None


def make_prompt(opener: str, product: str, focus: str | None = None, aspect: str | None = None) -> str:
    """The prompt of an opener template and a product, after the focus sentence when one is given."""
    body = opener.format(p=product)
    return f"{focus.format(a=aspect)} {body}" if focus else body


def prompt_space(products: list[str] | None = None) -> list[str]:
    """Every distinct prompt of the world (of the given products), in a fixed order."""
    focuses = [None] + [(f, a) for f in FOCUS for a in ASPECTS]
    return [make_prompt(o, p, *(fa or (None, None))) for p in (products or PRODUCTS) for o in OPENERS
            for fa in focuses]


@dataclass(frozen=True)
class Sentence:
    words: tuple[str, ...]
    valence: float | None  # None: not grammatical (or off-topic for this prompt)
    filler: bool = False


def _match_adj(words: list[str]) -> float | None:
    """[adverb] adjective -> valence."""
    if len(words) == 1 and words[0] in ADJECTIVES:
        return ADJECTIVES[words[0]]
    if len(words) >= 2 and words[-1] in ADJECTIVES:
        adv = " ".join(words[:-1])
        if adv in ADVERBS:
            return ADJECTIVES[words[-1]] * ADVERBS[adv]
    return None


def parse_sentence(words: list[str], product: str | None = None) -> float | None:
    """Valence of a sentence (list of words ending with '.') the grammar produces; None otherwise.

    A sentence naming a product other than the prompt's is off-topic: not produced for this prompt.
    Productions: "the <aspect> is [adv] <adj> .", "the <product> is [adv] <adj> .",
    "it <verb phrase> .", "i <feeling> it .", "overall it is [adv] <adj> .", neutral sentences.
    """
    if not words or words[-1] != ".":
        return None
    if " ".join(words) in NEUTRAL_SENTENCES:
        return 0.0
    body = words[:-1]
    # "the X is [adv] adj"
    if len(body) >= 4 and body[0] == "the" and body[2] == "is":
        noun = body[1]
        if noun in ASPECTS or (noun in PRODUCTS and (product is None or noun == product)):
            return _match_adj(body[3:])
        return None
    if len(body) >= 4 and body[:3] == ["overall", "it", "is"]:
        return _match_adj(body[3:])
    if len(body) >= 2 and body[0] == "it":
        vp = " ".join(body[1:])
        if vp in VERB_PHRASES:
            return VERB_PHRASES[vp]
    if len(body) == 3 and body[0] == "i" and body[2] == "it" and body[1] in FEELINGS:
        return FEELINGS[body[1]]
    return None


def split_sentences(text: str, product: str | None = None) -> list[Sentence]:
    """Split a response into sentences and parse each. Fillers are recognised as their own units.

    A trailing fragment without '.' is returned as an ungrammatical sentence.
    """
    words = text.split()
    out: list[Sentence] = []
    i = 0
    n = len(words)
    while i < n:
        matched = False
        for f in FILLERS:
            fw = f.split()
            if words[i : i + len(fw)] == fw:
                out.append(Sentence(tuple(fw), 0.0, filler=True))
                i += len(fw)
                matched = True
                break
        if matched:
            continue
        j = i
        while j < n and words[j] != ".":
            j += 1
        sent = words[i : min(j + 1, n)]
        out.append(Sentence(tuple(sent), parse_sentence(sent, product)))
        i = j + 1
    return out
