"""The input formats, and how a file tells its own: by its extension, and for an Arrow
extension by its first bytes (an IPC file or an IPC stream)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

PARQUET_SUFFIXES = (".parquet", ".pq")
JSON_LINES_SUFFIXES = (".jsonl", ".ndjson", ".json")
# Arrow IPC files and streams: which of the two a file holds is told by its first bytes.
ARROW_SUFFIXES = (".arrow", ".arrows", ".ipc", ".feather")
IPC_FILE_MAGIC = b"ARROW1"
IPC_STREAM_MARKER = b"\xff\xff\xff\xff"
FEATHER_V1_MAGIC = b"FEA1"
DIRECTORY_JSON_SUFFIXES = (".jsonl", ".ndjson")
# What a directory's reading picks up (either kind, depending on what else it holds).
FOLDER_SUFFIXES = PARQUET_SUFFIXES + DIRECTORY_JSON_SUFFIXES
InputFormat = Literal["parquet", "json", "arrow", "arrow_stream"]
FORMAT_NAMES = {
    "parquet": "Parquet",
    "json": "JSON-lines",
    "arrow": "Arrow IPC",
    "arrow_stream": "Arrow IPC stream",
}


# Formats a dump is often saved in that advcli does not read, by extension: named in the error.
NOT_READ = {
    ".csv": "a CSV file",
    ".tsv": "a TSV file",
    ".xlsx": "an Excel workbook",
    ".pkl": "a pickle",
    ".pickle": "a pickle",
    ".pt": "a torch file",
    ".pth": "a torch file",
    ".npz": "a numpy archive",
    ".npy": "a numpy array",
    ".h5": "an HDF5 file",
    ".hdf5": "an HDF5 file",
}
# The files of those formats advcli does read: a trainer's own dump, told by its name.
READ_AS_TRAINERS = {
    ".pt": "slime's rollout_data/{id}.pt and train_data/{id}.pt",
    ".pkl": "SkyRL's global_step_{N}_training_input.pkl",
}
READ = (
    "Parquet (.parquet, .pq), JSON lines (.jsonl, .ndjson, .json) and Arrow IPC files and "
    "streams (.arrow, .arrows, .ipc, .feather)"
)


def not_read(path: Path) -> str | None:
    """What a file is, by its extension, when advcli does not read its format; else None."""
    return NOT_READ.get(path.suffix.lower())


def input_format_of(path: Path) -> InputFormat:
    """The format a file is read as, from its extension (Parquet when unknown); for an Arrow
    extension, an IPC file or stream as its first bytes say (``.arrows`` a stream unless they
    say file)."""
    suffix = path.suffix.lower()
    if suffix in JSON_LINES_SUFFIXES:
        return "json"
    if suffix not in ARROW_SUFFIXES:
        return "parquet"
    try:
        with path.open("rb") as file:
            head = file.read(len(IPC_FILE_MAGIC))
    except OSError:
        head = b""
    if head.startswith(IPC_FILE_MAGIC):
        return "arrow"
    if head.startswith(IPC_STREAM_MARKER) or suffix == ".arrows":
        return "arrow_stream"
    return "arrow"
