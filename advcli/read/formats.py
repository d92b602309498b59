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
