"""The XYZ comment line: ``charge=N``, ``multiplicity=M`` and ``units=bohr|angstrom`` are
read; any other words are free text, except words that declare a charge, a multiplicity or
units in a form that is not read (``charge -2``, ``multiplicity: 3``, ``spin=2``, ``S=1``,
``chg=-1``, ``units: bohr``, ``coordinates in bohr``, ``-1 2`` alone). Those are refused
(a charge or multiplicity only when the command line does not give it, see
:meth:`dfmp2.input.xyz.Geometry.refuse_unread`): ignored, they gave the neutral singlet in
Angstrom without a word.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pyscf.lib import param

from dfmp2.errors import InputError

# ``key=value``; the value runs to the next blank, comma or semicolon.
COMMENT_FIELD = re.compile(r"\b(charge|multiplicity|units?)\s*=\s*([^\s,;]*)", re.IGNORECASE)
ANGSTROM_PER_UNIT = {"angstrom": 1.0, "bohr": param.BOHR}
# "charge multiplicity" opening the line, as some programs write it ("-1 1", "0,2 OH").
CHARGE_MULTIPLICITY_PAIR = re.compile(r"\s*([+-]?[0-9]+)\s*(?:[,;]\s*|\s+)([0-9]+)(?:\s.*)?")
# A whole number as a value (2, -1, +1, 2.0: other programs write multiplicities as floats).
WHOLE_VALUE = re.compile(r"[+-]?[0-9]+(?:\.0*)?")
WORD = re.compile(r"[a-z0-9_+]+")
# Between a declaring word and its value ("S = 1", "total charge of -1", "multiplicity : 3").
SEPARATORS = {"=", ":", "of", "is"}
# Words other programs declare with, by the field they would set. 'spin=2' may mean 2S, S or
# the multiplicity; the others are read by other programs in their own ways.
CHARGE_WORDS = {"charge", "chg", "chrg", "q", "totalcharge", "netcharge"}
MULTIPLICITY_WORDS = {"mult", "multiplicity", "spin", "s", "2s+1", "spinmultiplicity"}
UNIT_WORDS = {"unit", "units"}
# Words that make ``charge=``/``multiplicity=`` a quantity other than the molecule's own
# ("nuclear charge = 8", "formal-charge=1", "NMR multiplicity=3"): read, they set the
# molecule's charge or spin to an atom's or a signal's.
OTHER_QUANTITY_WORDS = {
    "nuclear", "partial", "formal", "effective", "atomic", "atom", "point", "core", "ionic",
    "fractional", "site", "fragment", "residue", "group", "ligand", "metal", "oxidation",
    "mulliken", "lowdin", "löwdin", "hirshfeld", "esp", "resp", "npa", "nbo", "cm5", "apt",
    "bader", "gasteiger", "ddec", "chelpg", "mk", "nmr", "peak", "signal", "band"}
# The word just before a key, joined to it by blanks, '-' or '_'.
WORD_BEFORE_KEY = re.compile(r"([^\W\d_]+)[\s_-]*$")
# Atomic units of length, as a units value or after "in".
BOHR_WORDS = {"bohr", "bohrs", "au", "a.u.", "a.u", "a0"}
REWRITES = {"charge": "write charge=N in the comment line",
            "multiplicity": "write multiplicity=2S+1 in the comment line",
            "unit": "write units=bohr (or units=angstrom) in the comment line"}


@dataclass(frozen=True)
class Unread:
    """A charge or multiplicity the comment line declares in a form that is not read: an
    error unless the command line gives that field (whose option the refusal names)."""
    field: str
    statement: str
    rewrite: str

    def refusal(self, option: str) -> str:
        return f"{self.statement}: {self.rewrite}, or remove it and give {option}"


@dataclass(frozen=True)
class CommentFields:
    charge: int | None = None
    multiplicity: int | None = None
    angstrom_per_unit: float = 1.0
    unread: tuple[Unread, ...] = ()


def parse_comment(comment: str, source: str) -> CommentFields:
    """``charge=N`` (an integer), ``multiplicity=M`` (an integer >= 1) and ``units=...``."""
    values: dict[str, str] = {}
    qualified: list[Unread] = []
    for match in COMMENT_FIELD.finditer(comment):
        key = match.group(1).lower().rstrip("s")
        before = WORD_BEFORE_KEY.search(comment[:match.start()])
        if key != "unit" and before and before.group(1).lower() in OTHER_QUANTITY_WORDS:
            text = comment[before.start():match.end()]
            qualified.append(Unread(key, f"{source}, line 2: {text!r} is not the molecule's "
                                         f"{key}", REWRITES[key]))
            continue
        if key in values:
            raise InputError(f"{source}, line 2: '{match.group(1)}' is given twice in the "
                             "comment line")
        values[key] = match.group(2)
    # A plain charge= beside "Mulliken charge=0" is the molecule's.
    unread = tuple([item for item in qualified if item.field not in values]
                   + _unread_declarations(comment, set(values), source))
    for item in unread:
        if item.field == "unit":
            raise InputError(f"{item.statement}: {item.rewrite}")
    charge = multiplicity = None
    if "charge" in values:
        charge = _comment_integer(values["charge"], "charge", source)
    if "multiplicity" in values:
        multiplicity = _comment_integer(values["multiplicity"], "multiplicity", source)
        if multiplicity < 1:
            raise InputError(f"{source}, line 2: multiplicity must be at least 1, "
                             f"got {multiplicity}")
    angstrom_per_unit = 1.0
    if "unit" in values:
        unit = values["unit"].lower()
        if unit not in ANGSTROM_PER_UNIT:
            raise InputError(f"{source}, line 2: units={values['unit']!r} is not understood; "
                             "write units=angstrom or units=bohr")
        angstrom_per_unit = ANGSTROM_PER_UNIT[unit]
    return CommentFields(charge, multiplicity, angstrom_per_unit, unread)


def _unread_declarations(comment: str, read: set[str], source: str
                         ) -> list[Unread]:
    """Each charge, multiplicity or units that the line declares in a form it does not read,
    unless that field is also given as ``key=value``."""
    pair = CHARGE_MULTIPLICITY_PAIR.fullmatch(comment)
    if pair and not read:
        statement = (f"{source}, line 2: {comment.strip()!r} opens like 'charge multiplicity', "
                     "which dfmp2 does not read")
        rewrite = f"write charge={pair.group(1)} multiplicity={pair.group(2)} in the comment line"
        return [Unread("charge", statement, rewrite), Unread("multiplicity", statement, rewrite)]
    found = []
    tokens = [token.strip("()[],;") for token in COMMENT_FIELD.sub(" ", comment).split()]
    for n, token in enumerate(tokens):
        declared = _declaration(tokens, n)
        if declared is not None and declared[0] not in read:
            field, text = declared
            found.append(Unread(field, f"{source}, line 2: {text!r} is not read (dfmp2 reads "
                                       "charge=, multiplicity= and units=)", REWRITES[field]))
    return found


def _declaration(tokens: list[str], n: int) -> tuple[str, str] | None:
    """(field, words) when token ``n`` declares a field with a value: a declaring word with
    ``=`` or ``:`` and its value in the token or in the next ones (past ``=``, ``:``, ``of``,
    ``is``), or a length unit after ``in``."""
    lowered = tokens[n].lower()
    if lowered in BOHR_WORDS and n > 0 and tokens[n - 1].lower() in ("in", "atomic"):
        return "unit", f"{tokens[n - 1]} {tokens[n]}"
    word = WORD.match(lowered)
    if word is None:
        return None
    field = declared_field(word.group(0))
    # "charge/mult: -1 2" declares the charge first.
    rest = re.sub(r"^/[a-z]+", "", lowered[word.end():])
    if field is None or (rest and rest[0] not in "=:"):
        return None
    value, words = rest[1:], [tokens[n]]
    following = iter(tokens[n + 1:n + 4])
    while not value:
        token = next(following, None)
        if token is None:
            return None
        words.append(token)
        if token.lower() not in SEPARATORS:
            value = token.lower()
    declares = (value in BOHR_WORDS or "bohr" in value) if field == "unit" else bool(
        WHOLE_VALUE.fullmatch(value))
    return (field, " ".join(words)) if declares else None


def declared_field(word: str) -> str | None:
    """The field a word declares in another program's convention (``chg``: the charge), if
    any."""
    if word in CHARGE_WORDS or word.endswith("_charge"):
        return "charge"
    if word in MULTIPLICITY_WORDS or word.endswith("multiplicity"):
        return "multiplicity"
    return "unit" if word in UNIT_WORDS else None


def _comment_integer(text: str, key: str, source: str) -> int:
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise InputError(f"{source}, line 2: {key}={text!r} is not an integer")
    return int(text)


def free_text(comment: str) -> str:
    """The comment without its charge, multiplicity and units (a fragment's own file does
    not have them); nothing when what is left would still declare one."""
    text = " ".join(COMMENT_FIELD.sub("", comment).split())
    return "" if _unread_declarations(text, set(), "") else text
