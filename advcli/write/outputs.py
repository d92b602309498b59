"""Where a command's outputs go, checked in one place before any work is done: each output's
format (from ``--format`` or its extension), the paths every output may not take (an input, a
folder holding one, a path named twice, what :func:`advcli.write.atomic.check_output_path`
refuses), and standard output, which takes at most one output, never binary bytes onto a
terminal, and a result only once it is whole.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from advcli._runtime.process import copy_to_stdout, require_stdout
from advcli.errors import AdvcliError, UsageError
from advcli.read.dataset import Dataset, FileIdentity
from advcli.read.formats import FOLDER_SUFFIXES
from advcli.read.inputs import STDIN
from advcli.settings.config import Engine, OutputColumns, OutputFormat
from advcli.write.atomic import check_output_path, writes_in_place
from advcli.write.rows import Part, write_advantages

FORMAT_BY_SUFFIX: dict[str, OutputFormat] = {
    ".parquet": OutputFormat.PARQUET,
    ".pq": OutputFormat.PARQUET,
    ".arrow": OutputFormat.ARROW,
    ".arrows": OutputFormat.ARROWS,
    ".npz": OutputFormat.NPZ,
    ".pt": OutputFormat.PT,
}


def output_format_for(output: Path, requested: OutputFormat | None) -> OutputFormat:
    """The output format: ``requested`` if given, else the one its extension names."""
    if requested is not None:
        chosen = OutputFormat(requested)
    elif str(output) == STDIN:
        chosen = OutputFormat.ARROWS
    elif output.suffix.lower() in FORMAT_BY_SUFFIX:
        chosen = FORMAT_BY_SUFFIX[output.suffix.lower()]
    else:
        raise AdvcliError(
            f"{output}: cannot tell the output format from the extension; use .parquet, .arrow, "
            ".arrows, .npz or .pt, or pass --format"
        )
    if chosen == "pt" and importlib.util.find_spec("torch") is None:
        raise AdvcliError(f"{output}: writing .pt needs torch: pip install 'advcli[torch]'")
    return chosen


def goes_to_stdout(output: Path | None) -> bool:
    """Whether ``output`` is standard output: ``-``, or a name of the process's descriptor 1
    (``/dev/stdout``, ``/dev/fd/1``, ``/proc/self/fd/1``)."""
    if output is None:
        return False
    if str(output) == STDIN:
        return True
    names = {"/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", f"/proc/{os.getpid()}/fd/1"}
    return os.path.abspath(output) in names


def check_standard_output(outputs: Mapping[str, Path | None], binary: Collection[str] = ()) -> None:
    """Refuse, before any work, two outputs on standard output (``outputs``: each output's
    option name and path), whose bytes would be interleaved, and an output of ``binary`` bytes
    (Parquet, Arrow, a PNG) on a terminal, which it would garble."""
    on_stdout = [option for option, path in outputs.items() if goes_to_stdout(path)]
    if len(on_stdout) > 1:
        listed = f"{', '.join(on_stdout[:-1])} and {on_stdout[-1]}"
        every = "both" if len(on_stdout) == 2 else "all"
        raise UsageError(
            f"{listed} {every} write to standard output, which takes one output; send the "
            "others to files"
        )
    binary_on_stdout = [option for option in on_stdout if option in binary]
    if binary_on_stdout and _stdout_is_terminal():
        raise UsageError(
            f"{binary_on_stdout[0]} writes binary data to standard output, which is a terminal; "
            "redirect it to a file or a pipe"
        )


def _stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except ValueError:  # a closed stream
        return False


@contextlib.contextmanager
def staged_for_stdout(name: str) -> Iterator[Path]:
    """A path in a temporary folder to write a result to whole, copied to standard output once
    the block succeeds: a failure sends nothing down the pipe, and is one error saying that the
    staging failed (a full temporary folder, say)."""
    with tempfile.TemporaryDirectory(prefix="advcli-stdout-") as folder:
        staged = Path(folder) / name
        try:
            yield staged
        except AdvcliError as error:
            raise AdvcliError(f"standard output: staging the output failed: {error}") from None
        except OSError as error:
            reason = error.strerror or type(error).__name__
            raise AdvcliError(f"standard output: staging the output failed ({reason})") from None
        with staged.open("rb") as result:
            copy_to_stdout(result)


def report_format_for(path: Path) -> str:
    """``json`` or ``markdown``, from a report path's extension; JSON on standard output."""
    if goes_to_stdout(path):
        return "json"
    kind = {".json": "json", ".md": "markdown", ".markdown": "markdown"}.get(path.suffix.lower())
    if kind is None:
        raise AdvcliError(f"{path}: a report is .json or .md")
    return kind


def check_outputs(
    outputs: Sequence[Path | None], dataset: Dataset, *, force: bool, engine: Engine = Engine.LOCAL
) -> None:
    """Check every file a command will write before any work is done; two outputs may not share
    a path. The first output is a folder with the Ray engine."""
    seen: set[Path] = set()
    for position, output in enumerate(outputs):
        if output is None:
            continue
        in_place = writes_in_place(output) and not (engine == Engine.RAY and position == 0)
        if str(output) == STDIN or in_place:
            # /dev/null twice is fine: a device or pipe takes each output as it comes.
            check_output(output, dataset, force=force)
            continue
        if output.resolve() in seen:
            raise AdvcliError(f"{output}: named for two outputs; give each its own path")
        seen.add(output.resolve())
        folder_output = engine == Engine.RAY and position == 0
        check_output(output, dataset, force=force, folder_output=folder_output)


def check_output(
    output: Path, dataset: Dataset, *, force: bool, folder_output: bool = False
) -> None:
    """Refuse an output that would overwrite, remove or join the inputs
    (:func:`check_not_an_input`), or that :func:`advcli.write.atomic.check_output_path` refuses
    (``-``, standard output, is always fine)."""
    if str(output) == STDIN:
        require_stdout("the output")
        check_not_written_into(output, dataset)
        return
    check_not_an_input(output, dataset, folder_output=folder_output)
    if writes_in_place(output):
        check_not_written_into(output, dataset)
    check_output_path(output, force=force, folder_output=folder_output)


def check_not_written_into(output: Path, dataset: Dataset) -> None:
    """Refuse an output written in place (``-``, ``/dev/stdout``, ``/dev/fd/N``) that is an
    input file under a name the path checks do not see (a hard link, a shell's ``>>`` onto
    one): its bytes would go into the input, which a Parquet or Arrow writer opening the path
    also truncates. Told by the file's device and inode."""
    try:
        info = os.fstat(sys.stdout.fileno()) if str(output) == STDIN else os.stat(output)
    except (OSError, ValueError):
        return
    # A translated input's own file too (the trainer's file, not its snapshot).
    origins = [FileIdentity.of(path) for path in dataset.origins]
    for index, identity in [*enumerate(dataset.identities), *enumerate(origins)]:
        if identity is not None and (info.st_dev, info.st_ino) == (identity.device, identity.inode):
            shown = "standard output" if str(output) == STDIN else str(output)
            raise AdvcliError(
                f"{shown}: the output is the input {dataset.label(index)} (the same file); choose "
                "another path"
            )


def check_not_an_input(output: Path, dataset: Dataset, *, folder_output: bool = False) -> None:
    """Refuse an output that is an input file, a folder holding an input at any depth (``--force``
    would replace the folder, inputs and all), or, for a dataset folder or a file a directory's
    reading picks up, a path inside an input directory (the next run would read it as an
    input). A report beside the inputs is fine. Paths are compared resolved: symbolic links and
    ``..`` followed."""
    # Where the output points (a link followed) and where the rename puts it (the link itself).
    targets = {output.resolve(), output.parent.resolve() / output.name}
    for index, path in enumerate(dataset.inputs):
        # The file's data and its name (a link in an input folder is removed with the folder).
        sources = {path.resolve(), Path(os.path.abspath(path))}
        if sources & targets:
            raise AdvcliError(f"{output}: the output is also an input; choose another path")
        if targets & {folder for source in sources for folder in source.parents}:
            raise AdvcliError(
                f"{output}: the output folder holds the input {dataset.label(index)}; choose "
                "another path"
            )
    for folder in dataset.folders:
        inside = any(folder.resolve() in target.parents for target in targets)
        if inside and (folder_output or output.suffix in FOLDER_SUFFIXES):
            raise AdvcliError(
                f"{output}: the output is inside the input folder {folder}, whose files are "
                "read as inputs; choose a path outside it"
            )


def write_rows(
    dataset: Dataset,
    parts: Iterable[Part],
    output: Path,
    fmt: OutputFormat,
    tokens: bool,
    force: bool,
    output_columns: OutputColumns = OutputColumns.ALL,
) -> None:
    """Stage 3 to ``output``: :func:`advcli.write.rows.write_advantages` of ``parts`` (the
    run's one batch, ``dataset`` itself, or its files one after another), or, for ``-``, the
    same written whole to a temporary file and then copied to standard output."""
    write = functools.partial(
        write_advantages,
        dataset,
        parts,
        output_format=fmt,
        tokens=tokens,
        output_columns=output_columns,
    )
    _written_to(output, fmt, write, force)


def _written_to(output: Path, fmt: OutputFormat, write: Callable[..., None], force: bool) -> None:
    """``write(path, force=...)`` to ``output``, or, for ``-``, to a temporary file then copied
    to standard output."""
    if str(output) != STDIN:
        write(output, force=force)
        return
    with staged_for_stdout(f"out.{fmt.value}") as staged:
        write(staged, force=False)
