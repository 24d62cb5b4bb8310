"""What a batch runs: XYZ files, globs of them, and manifests.

Manifest format: one molecule per line, ``path/to/molecule.xyz [run options]``, with the same
options as ``dfmp2 run`` (e.g. ``water.xyz --basis cc-pvtz --frozen-core``). A line with
``--split N`` (and optionally ``--charges a,b`` / ``--spins a,b``) is a dimer: it gets a
counterpoise interaction-energy job with the options of ``dfmp2 interaction``. Paths are
relative to the manifest's folder; blank lines and lines starting with ``#`` are ignored.
Options on a line override the batch's own options for that molecule. A line that cannot be
read becomes an item carrying its error, which the batch records as failed.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import click

from dfmp2.errors import InputError
from dfmp2.input.basis_files import is_library_name
from dfmp2.input.settings import RunSettings
from dfmp2.input.xyz import names_standard_input, text_lines
from dfmp2.system.files import lookup_problem

GLOB_CHARACTERS = set("*?[")
INTERACTION_OPTIONS = ("--split", "--charges", "--spins")
HELP_OPTIONS = {"-h", "--help"}
# Options of dfmp2 batch itself, which a line cannot set for its own molecule.
BATCH_ONLY_OPTIONS = {"--out", "--shard"}
SETTINGS_FIELDS = {item.name for item in dataclasses.fields(RunSettings)}
BASIS_FILE_OPTIONS = ("basis", "auxbasis", "jk_auxbasis")


@dataclass
class BatchItem:
    index: int
    molecule: Path
    overrides: dict
    interaction: dict | None = None
    error: str | None = None
    options_unread: bool = False
    """A manifest line whose options could not be read: its basis is not known."""
    where: str = ""
    """The manifest and line it came from (empty for an XYZ file given to the batch)."""
    line: int | None = None
    """Its line number in its manifest (None for an XYZ file given to the batch)."""


def _manifest_items(manifest: Path, commands: dict[str, click.Command],
                    start: int) -> list[BatchItem]:
    try:
        # A byte-order mark (Notepad's and PowerShell's UTF-8) is no part of the first path.
        lines = text_lines(manifest.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError):
        return [BatchItem(start, manifest, {}, error=f"manifest {manifest} cannot be read as "
                                                      "text")]
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        items.append(_line_item(manifest, number, line, commands, start + len(items)))
    return items


def without_comment(line: str) -> str:
    """``line`` up to a comment: a ``#`` that starts a word outside quotes, as in a shell (so
    ``a#1.xyz`` is a file name, and ``# note`` after the options is not an option)."""
    quote, escaped, word_start = None, False, True
    for position, char in enumerate(line):
        if char == "#" and word_start and quote is None and not escaped:
            return line[:position]
        word_start = char.isspace() and quote is None and not escaped
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
    return line


def _line_item(manifest: Path, number: int, line: str, commands: dict[str, click.Command],
               index: int) -> BatchItem:
    where = f"{manifest}, line {number}"
    item = functools.partial(BatchItem, index, where=where, line=number)
    if "\x00" in line:
        # No name or option can hold one; read by click, the molecule's check (os.stat)
        # ended the whole batch in "ValueError: embedded null byte".
        return item(manifest, {}, error=f"{where}: holds a NUL byte", options_unread=True)
    try:
        tokens = shlex.split(without_comment(line))
    except ValueError as exc:
        # A prime in a basis name, 6-31G(d'), opens a quotation the shell way.
        return item(manifest, {},
                    error=f"{where}: {exc} (a line is read as a shell reads it: put a name "
                          "holding ' in double quotes)", options_unread=True)
    path = Path(tokens[0])
    path = path if path.is_absolute() else manifest.parent / path
    is_dimer = any(token.split("=")[0] in INTERACTION_OPTIONS for token in tokens[1:])
    name = "interaction" if is_dimer else "run"
    if HELP_OPTIONS & set(tokens[1:]):
        # Read by click, it printed run's help and ended the whole batch there, with status 0
        # and nothing run.
        return item(path, {}, error=f"{where}: a help option has no place in a manifest "
                                    f"line; 'dfmp2 {name} --help' lists the options",
                    options_unread=True)
    batch_own = sorted({token.split("=")[0] for token in tokens[1:]} & BATCH_ONLY_OPTIONS)
    if batch_own:
        # Read by click, '--out' was answered "Did you mean '--output'?", which the next
        # check refuses.
        return item(path, {}, error=f"{where}: {', '.join(batch_own)} "
                                    f"{'is' if len(batch_own) == 1 else 'are'} the batch's "
                                    "own, for all of its lines; give it to dfmp2 batch",
                    options_unread=True)
    try:
        ctx = commands[name].make_context(name, [str(path), *tokens[1:]], obj={"command": ""})
    except click.ClickException as exc:
        return item(path, {}, error=f"{where}: {exc.format_message()}", options_unread=True)
    overrides = {key: value for key, value in ctx.params.items()
                 if ctx.get_parameter_source(key) == click.core.ParameterSource.COMMANDLINE
                 and key not in ("molecule", "dimer")}
    # A basis file on a line is the manifest folder's, as the molecule is (it was read from
    # the working folder, or a file of that name there was used instead).
    for key in BASIS_FILE_OPTIONS:
        value = overrides.get(key)
        if (isinstance(value, str) and not is_library_name(value)
                and not Path(value).is_absolute()
                and lookup_problem(manifest.parent / value) is None
                and (manifest.parent / value).is_file()):
            overrides[key] = str(manifest.parent / value)
    interaction = None
    if is_dimer:
        interaction = {key: overrides.pop(key, None) for key in ("split", "charges", "spins")}
    # Output options (--json, -o, --qcschema) are the batch's, not a molecule's.
    outputs = [key for key in overrides if key not in SETTINGS_FIELDS or key == "output"]
    if outputs:
        names = ", ".join(next(param.opts[-1] for param in ctx.command.params
                               if param.name == key) for key in outputs)
        verb = "is" if len(outputs) == 1 else "are"
        return item(path, {}, error=f"{where}: {names} {verb} chosen by the batch, not per "
                                    "molecule", options_unread=True)
    return item(path, overrides, interaction)


def _below_a_linked_folder(match: str, pattern: str) -> bool:
    """Whether ``match`` lies below a folder reached through a symbolic link under the
    pattern's fixed folders: '**' follows none, as shells do (a link back up, mols/self -> .,
    listed every molecule forty times over)."""
    parts = pattern.split(os.sep)
    fixed = 0
    while fixed < len(parts) - 1 and not GLOB_CHARACTERS & set(parts[fixed]):
        fixed += 1
    components = match.split(os.sep)[:-1]
    return any(os.path.islink(os.sep.join(components[:end]))
               for end in range(fixed + 1, len(components) + 1))


def collect_items(inputs: list[str], commands: dict[str, click.Command],
                  dimers: bool = False) -> list[BatchItem]:
    """XYZ files, globs of them, and manifests, in the order given. With ``dimers`` every XYZ
    input is a dimer whose split is read from its comment line. Inputs that do not exist
    become failed items."""
    as_dimer = {"split": None, "charges": None, "spins": None} if dimers else None
    items: list[BatchItem] = []
    for text in inputs:
        # A file whose name holds a pattern's characters (mol[1].xyz, as a shell passes it
        # when quoted or escaped) is that file: taken as a pattern, it ran mol1.xyz instead,
        # or matched no file.
        if GLOB_CHARACTERS & set(text) and not os.path.lexists(text):
            # '**' as shells with globstar read it, any depth of folders: read as '*', it
            # left out the molecules beside and below the folders it matched.
            matches = sorted(match for match in glob.glob(text, recursive=True)
                             if "**" not in text or not _below_a_linked_folder(match, text))
            if not matches:
                items.append(BatchItem(len(items), Path(text), {},
                                       error=f"the pattern {text!r} matches no file"))
            items += [BatchItem(len(items) + n, Path(m), {}, as_dimer)
                      for n, m in enumerate(matches)]
            continue
        path = Path(text)
        if names_standard_input(path):
            # Taken as a manifest, a pipe became one failed line ('not a regular file') and a
            # failed record; a redirected list, one failed line per molecule (its paths were
            # looked up in /dev). Every rank and array task reads the list for itself.
            raise InputError(f"{text} is standard input, which dfmp2 batch does not read (each "
                             "rank reads the list itself, and a list's paths are relative to "
                             "its folder); give the list's own file (dfmp2 batch jobs.txt) or "
                             "the XYZ files, or pipe one molecule to dfmp2 run /dev/stdin")
        problem = lookup_problem(path)
        if problem is not None:
            items.append(BatchItem(len(items), path, {}, error=problem))
        elif not path.is_file():
            problem = "not a regular file" if path.exists() else "no such file"
            items.append(BatchItem(len(items), path, {}, error=f"{text}: {problem}"))
        elif path.suffix.lower() == ".xyz":
            items.append(BatchItem(len(items), path, {}, as_dimer))
        else:
            items += _manifest_items(path, commands, len(items))
    if not items:
        raise InputError("no molecules to run")
    return items


# Options that exclude each other: a line giving one overrides the batch's other.
EXCLUSIVE_OPTIONS = {"frozen": {"frozen_core": False}, "frozen_core": {"frozen": None}}


def line_settings(base: RunSettings, item: BatchItem) -> RunSettings:
    """The batch's options with the line's on top (a line's --frozen 0 under a batch-wide
    --frozen-core was refused as giving both). Options that cannot go together make the item
    a failed one, run with the batch's options only: the other lines run."""
    options: dict = {}
    for key in item.overrides:
        options.update(EXCLUSIVE_OPTIONS.get(key, {}))
    options.update(item.overrides)
    try:
        return dataclasses.replace(base, molecule=item.molecule, **options)
    except InputError as exc:
        item.error = f"{item.where}: {exc}" if item.where else str(exc)
        item.options_unread = True
        return dataclasses.replace(base, molecule=item.molecule)
