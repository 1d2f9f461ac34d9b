"""The built-in parallel corpus: English-like sentences and their translation
into an invented, German-like language, generated from a seed.

No external text, works offline, and is hard in the ways translation is hard:

- **Vocabulary**: ~170 nouns, ~60 adjectives, ~60 verbs, 12 prepositions on
  the source side; their target words are invented (seeded syllables) and
  inflected, several hundred surface forms on each side.
- **Reordering**: the target is verb-final (subject, prepositional phrase,
  object, verb, negation), adjectives follow their noun, in reverse order.
- **Agreement**: every noun has a gender (3); determiners and adjectives
  inflect for gender x number x case (nominative subject, accusative object,
  dative after prepositions) and definiteness; verbs agree with the subject's
  number; plural nouns take a gender-specific suffix.
- **Length**: one or two clauses ("... and ..."), optional adjectives and
  prepositional phrases: 4 to ~35 source words.
- **Held out**: no test or validation source sentence occurs in training.

Word order carries meaning: "the dog sees the cat" and "the cat sees the dog"
are the same bag of words with different translations (the case endings and
the order differ), so a model without positional information cannot solve
the task (`tests/test_synthetic_data.py` shows both the fact and the
consequence).

`--data builtin` reads it in memory; `write_tsv` (or this module run as a
program) writes it out as TSV files, for walk-throughs that start from files
(docs/own-data.md).

Example:
    python -m keras_transformer.data.synthetic --write mine
    # mine/train.tsv (40,000 pairs), mine/val.tsv, mine/test.tsv (500 each)
"""

import argparse
import functools
import os
import random
import sys

NOUNS = (
    "dog cat horse bird fish cow pig goat sheep duck mouse rabbit fox wolf bear lion "
    "tiger snake frog owl house car boat train bike door window table chair bed lamp "
    "book pen cup plate bowl spoon knife bottle box bag hat coat shoe shirt sock glove "
    "ring key clock phone radio camera picture letter card map road street bridge river "
    "lake hill field forest tree flower garden farm park shop market school church tower "
    "wall roof floor room kitchen garage yard gate fence stone rock star cloud planet "
    "ship plane truck wagon rocket ball doll toy drum flute piano guitar violin bell "
    "apple pear plum lemon melon carrot onion potato tomato bean cake cookie egg "
    "sandwich pizza farmer baker doctor teacher student pilot driver singer painter "
    "writer dancer player soldier king queen prince princess farmer's knight monk nurse "
    "cook guard sailor hunter friend brother sister uncle aunt cousin neighbor visitor "
    "stranger tourist child girl boy robot dragon giant wizard witch ghost"
).split()
NOUNS = tuple(n for n in dict.fromkeys(NOUNS) if "'" not in n)

ADJECTIVES = (
    "big small old young new red blue green yellow black white brown gray pink purple "
    "happy sad angry calm brave shy proud kind cruel clever silly quiet loud fast slow "
    "strong weak tall short long round flat soft hard warm cold hot wet dry clean dirty "
    "rich poor cheap strange famous hungry tired sleepy lazy busy friendly lonely lucky "
    "heavy light dark bright"
).split()

VERBS = (
    "see like love hate help find follow watch visit call paint draw build break carry "
    "push pull kick catch throw hold need want know meet greet thank chase feed wash "
    "clean open close lift drop hide buy sell bring take keep leave hear smell touch "
    "answer ask teach cook bake guard save warn praise admire trust miss join fear"
).split()

PREPOSITIONS = "in on under behind near beside above below with without inside outside".split()

GENDERS = ("m", "f", "n")
NUMBERS = ("sg", "pl")
CASES = ("nom", "acc", "dat")

# Source side: English determiners by (definite, number).
SOURCE_DETERMINERS = {(True, "sg"): "the", (False, "sg"): "a", (True, "pl"): "the",
                      (False, "pl"): "some"}

_ONSETS = "b d f g k l m n p r s t v z br dr gr kr pl sl st tr".split()
_VOWELS = "a e i o u ei au".split()
_CODAS = ["", "", "n", "r", "l", "s", "k", "t", "m"]


def third_person(verb):
    """English 3rd person singular present."""
    if verb in ("have",):
        return "has"
    if verb.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def plural(noun):
    """English plural of the nouns above."""
    irregular = {"mouse": "mice", "sheep": "sheep", "fish": "fish", "child": "children",
                 "goose": "geese", "knife": "knives", "wolf": "wolves", "shelf": "shelves"}
    if noun in irregular:
        return irregular[noun]
    if noun.endswith(("s", "sh", "ch", "x", "z")) or noun in ("potato", "tomato"):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


class SyntheticLanguage:
    """The invented target language: a lexicon and inflection tables drawn
    from `seed`. Same seed, same language."""

    def __init__(self, seed=0):
        rng = random.Random(f"language-{seed}")
        used = set()

        def word(syllables):
            while True:
                w = "".join(
                    rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                    for _ in range(syllables)
                )
                if w not in used:
                    used.add(w)
                    return w

        def suffix_table(pool):
            # One ending per (gender, number, case) with some syncretism, as
            # in German: a few endings shared by several cells.
            return {(g, n, c): rng.choice(pool) for g in GENDERS for n in NUMBERS for c in CASES}

        self.nouns = {n: (word(2), rng.choice(GENDERS)) for n in NOUNS}
        self.adjectives = {a: word(2) for a in ADJECTIVES}
        self.verbs = {v: word(2) for v in VERBS}
        self.prepositions = {p: word(1) for p in PREPOSITIONS}
        self.conjunction = word(1)
        self.negation = word(1)
        self.plural_suffix = {"m": "e", "f": "en", "n": "er"}
        self.dative_plural_suffix = "n"
        self.verb_suffix = {"sg": "et", "pl": "ant"}
        self.definite = {key: word(1) for key in suffix_table(["x"])}
        self.indefinite = {key: word(1) for key in suffix_table(["x"])}
        # Make a few determiner cells coincide (syncretism), deterministically.
        for table in (self.definite, self.indefinite):
            for g in GENDERS:
                table[(g, "pl", "acc")] = table[(g, "pl", "nom")]
        self.adjective_suffix = suffix_table(["e", "en", "er", "es", "em", "a", "o"])

    def noun_phrase(self, np_, case):
        noun, gender = self.nouns[np_["noun"]]
        number = np_["number"]
        key = (gender, number, case)
        determiner = (self.definite if np_["definite"] else self.indefinite)[key]
        if number == "pl":
            noun += self.plural_suffix[gender]
            if case == "dat":
                noun += self.dative_plural_suffix
        adjectives = [self.adjectives[a] + self.adjective_suffix[key]
                      for a in reversed(np_["adjectives"])]
        return [determiner, noun, *adjectives]

    def clause(self, clause):
        words = self.noun_phrase(clause["subject"], "nom")
        if clause["pp"] is not None:
            preposition, np_ = clause["pp"]
            words += [self.prepositions[preposition], *self.noun_phrase(np_, "dat")]
        words += self.noun_phrase(clause["object"], "acc")
        words.append(self.verbs[clause["verb"]] + self.verb_suffix[clause["subject"]["number"]])
        if clause["negated"]:
            words.append(self.negation)
        return words

    def translate(self, sentence):
        words = []
        for i, clause in enumerate(sentence):
            if i:
                words.append(self.conjunction)
            words += self.clause(clause)
        return " ".join(words)


def english(sentence):
    """The source side of a sentence structure."""
    words = []
    for i, clause in enumerate(sentence):
        if i:
            words.append("and")
        words += _english_np(clause["subject"])
        number = clause["subject"]["number"]
        if clause["negated"]:
            words += ["does" if number == "sg" else "do", "not", clause["verb"]]
        else:
            words.append(third_person(clause["verb"]) if number == "sg" else clause["verb"])
        words += _english_np(clause["object"])
        if clause["pp"] is not None:
            preposition, np_ = clause["pp"]
            words += [preposition, *_english_np(np_)]
    return " ".join(words)


def _english_np(np_):
    noun = np_["noun"] if np_["number"] == "sg" else plural(np_["noun"])
    return [SOURCE_DETERMINERS[(np_["definite"], np_["number"])], *np_["adjectives"], noun]


def _random_np(rng, max_adjectives):
    return {
        "noun": rng.choice(NOUNS),
        "number": rng.choice(NUMBERS),
        "definite": rng.random() < 0.6,
        "adjectives": rng.sample(ADJECTIVES, rng.choice(range(max_adjectives + 1))),
    }


def _random_sentence(rng):
    clauses = 1 if rng.random() < 0.75 else 2
    return [
        {
            "subject": _random_np(rng, 2),
            "verb": rng.choice(VERBS),
            "negated": rng.random() < 0.2,
            "object": _random_np(rng, 2),
            "pp": (rng.choice(PREPOSITIONS), _random_np(rng, 1)) if rng.random() < 0.4 else None,
        }
        for _ in range(clauses)
    ]


def generate_corpus(seed=0, num_train=40000, num_val=500, num_test=500):
    """Generates the corpus deterministically from `seed`.

    Returns:
        `{"train": (sources, targets), "val": ..., "test": ...}`, lists of
        `str`; no val/test source sentence occurs in train (or in each other).
    """
    language = SyntheticLanguage(seed)
    rng = random.Random(f"sentences-{seed}")
    seen = set()
    held_out = set()  # test and val sources, filled before "train" is drawn
    splits = {}
    for split, count in (("test", num_test), ("val", num_val), ("train", num_train)):
        sources, targets = [], []
        while len(sources) < count:
            sentence = _random_sentence(rng)
            source = english(sentence)
            if split != "train" and source in seen:
                continue
            if split == "train" and source in held_out:
                continue
            seen.add(source)
            sources.append(source)
            targets.append(language.translate(sentence))
        splits[split] = (sources, targets)
        if split == "val":
            held_out = set(seen)
    return splits


def swap_subject_and_object(seed=0, count=50):
    """Pairs of sentences that are the same bag of source words with
    different translations (subject and object exchanged): proof that the
    task needs word order. Returns a list of `(source_a, target_a, source_b,
    target_b)`."""
    language = SyntheticLanguage(seed)
    rng = random.Random(f"swaps-{seed}")
    pairs = []
    while len(pairs) < count:
        sentence = _random_sentence(rng)[:1]
        clause = sentence[0]
        swapped = [dict(clause, subject=clause["object"], object=clause["subject"])]
        if clause["subject"]["number"] != clause["object"]["number"]:
            continue  # the verb form would differ, making the bags differ
        if clause["negated"] or clause["subject"] == clause["object"]:
            continue
        pairs.append((english(sentence), language.translate(sentence),
                      english(swapped), language.translate(swapped)))
    return pairs


SPLIT_NAMES = {"train": "train", "validation": "val", "val": "val", "valid": "val",
               "dev": "val", "test": "test"}
DEFAULT_SIZES = dict(num_train=40000, num_val=500, num_test=500)


@functools.lru_cache(maxsize=4)
def _cached_corpus(seed, num_train, num_val, num_test):
    return generate_corpus(seed, num_train, num_val, num_test)


def parse_location(location):
    """`"seed=3,train=20000"` -> `(seed, sizes)`; "" gives the defaults."""
    seed, sizes = 0, dict(DEFAULT_SIZES)
    for item in filter(None, (part.strip() for part in (location or "").split(","))):
        key, _, value = item.partition("=")
        if key == "seed" and value.isdigit():
            seed = int(value)
        elif f"num_{key}" in sizes and value.isdigit():
            sizes[f"num_{key}"] = int(value)
        else:
            raise ValueError(
                f"Bad built-in data option {item!r} in {location!r}; expected "
                "comma-separated seed=N, train=N, val=N, test=N."
            )
    return seed, sizes


def builtin_source(location, split, src_lang="en", tgt_lang="synth", **unused):
    """Data-source loader for `--data builtin[:seed=N,train=N,...]`.

    Returns a `tf.data.Dataset` of `(source_text, target_text)` strings; the
    direction is English -> the synthetic language (swap `src_lang` and
    `tgt_lang` for the reverse).
    """
    import tensorflow as tf

    if split not in SPLIT_NAMES:
        raise ValueError(f"Unknown split {split!r}; expected one of {sorted(SPLIT_NAMES)}.")
    languages = {src_lang, tgt_lang}
    if languages != {"en", "synth"}:
        raise ValueError(
            "The built-in corpus pairs 'en' and 'synth'; received "
            f"--src-lang {src_lang!r} --tgt-lang {tgt_lang!r}."
        )
    seed, sizes = parse_location(location)
    english_side, synthetic_side = _cached_corpus(seed, **sizes)[SPLIT_NAMES[split]]
    sources, targets = ((english_side, synthetic_side) if src_lang == "en"
                        else (synthetic_side, english_side))
    return tf.data.Dataset.from_tensor_slices((list(sources), list(targets)))


TSV_SPLITS = ("train", "val", "test")


def write_tsv(directory, seed=0, num_train=40000, num_val=500, num_test=500):
    """Writes the corpus of `seed` (the pairs `--data builtin:seed=N,...`
    gives, English -> synthetic) as `directory/train.tsv`, `val.tsv` and
    `test.tsv`: one `source<TAB>target` pair per line, UTF-8. Creates
    `directory`; replaces those files.

    Returns: `{split: path}`.
    """
    corpus = _cached_corpus(seed, num_train, num_val, num_test)
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for split in TSV_SPLITS:
        paths[split] = os.path.join(directory, f"{split}.tsv")
        with open(paths[split], "w", encoding="utf-8", newline="\n") as f:
            f.writelines(f"{source}\t{target}\n" for source, target in zip(*corpus[split]))
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m keras_transformer.data.synthetic",
        description="Writes the built-in corpus (kt-train --data builtin) as TSV files: "
                    "DIR/train.tsv, DIR/val.tsv, DIR/test.tsv, one English<TAB>synthetic "
                    "pair per line.")
    parser.add_argument("--write", required=True, metavar="DIR",
                        help="directory to write the three files into (created)")
    parser.add_argument("--seed", type=int, default=0, help="the corpus's seed")
    for split, size in (("train", "num_train"), ("val", "num_val"), ("test", "num_test")):
        parser.add_argument(f"--{split}", type=int, default=DEFAULT_SIZES[size],
                            help=f"pairs in {split}.tsv (default %(default)s)")
    args = parser.parse_args(argv)
    for split in TSV_SPLITS:
        if getattr(args, split) < 1:
            parser.error(f"--{split} must be >= 1, received {getattr(args, split)}.")
    paths = write_tsv(args.write, args.seed, args.train, args.val, args.test)
    for split, path in paths.items():
        print(f"{path}: {getattr(args, split)} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
