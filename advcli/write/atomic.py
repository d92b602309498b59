"""Publishing a file (or a dataset folder) safely: advcli's one way of putting a result on disk.

The rules every writer gets from :func:`atomic_output`:

- The result is written under a temporary name beside the output and renamed into place only when
  complete, so a reader sees the old file or the whole new one, never half of one.
- Without ``force`` the rename is *no-replace* (``renameat2(RENAME_NOREPLACE)``, else a hard link,
  else an exclusive placeholder): an output that appears while advcli works is never overwritten,
  because the existence check and the publish are one step.
- A partial file left by a killed run is removed by the next run that writes the same output, but
  only when advcli provably made it: it carries an extended attribute naming the process and the
  file's own inode, that process is gone, and the file is none of the current run's inputs. A file
  that merely has a partial-looking name is never touched.
- Every ``OSError`` raised while writing (a full disk, a file-size limit, a permission) becomes one
  :class:`~advcli.errors.AdvcliError` naming the output.
- A writer's ``before_publish`` check (that its inputs are still the files it opened) runs once
  the result is complete and before it is published: when it fails, nothing is.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import hashlib
import os
import re
import secrets
import shutil
import socket
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from advcli._runtime.signals import held
from advcli.errors import AdvcliError, InputChanged

PARTIAL_SUFFIX = ".advcli-partial"


class OutputAppeared(AdvcliError):
    """An output that did not exist when the write began exists when it is to be published: it
    is left as it is."""


# The extended attribute that marks a partial as advcli's: "PID INODE MACHINE" (see _machine).
MARKER = "user.advcli.partial"
# The extended attribute of a file advcli published whole: "SIZE MTIME_NS" of the file as it was
# renamed into place. A rename keeps both, a later write in place changes the modification time,
# so the mark vouches for the file only while both still match (:func:`published_whole`).
PUBLISHED = "user.advcli.published"


def check_output_path(output: Path, *, force: bool, folder_output: bool = False) -> None:
    """Refuse an output whose folder is missing or not writable, whose name is too long for the
    filesystem, that is a directory (unless the output is a dataset folder), or that exists
    without ``force``. A dangling symbolic link exists."""
    folder = output.parent
    if not folder.is_dir():
        raise AdvcliError(f"{output}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise AdvcliError(f"{output}: cannot write to {folder} (permission denied)")
    name_bytes, name_max = len(os.fsencode(output.name)), _name_max(folder)
    if name_bytes > name_max:
        raise AdvcliError(
            f"{output}: the file name is too long ({name_bytes} bytes; this filesystem allows "
            f"{name_max})"
        )
    if output.is_dir() and not folder_output:
        raise AdvcliError(f"{output}: is a directory; name a file")
    if writes_in_place(output):
        if folder_output:
            raise AdvcliError(f"{output}: a dataset folder cannot go to a device or a pipe")
        return
    kind = _special_kind(output)
    if kind is not None:
        # Renaming a result over it would put a regular file where the device or pipe was.
        raise AdvcliError(f"{output}: is {kind}, not a regular file; name a file")
    if os.path.lexists(output) and not force:
        raise AdvcliError(f"{output}: the file exists; pass --force to replace it")
    if folder_output and force and output.is_dir():
        _check_replaceable_folder(output)


# Paths that name a file the process already holds open: written through, never renamed over
# (that would replace the link in /dev or /proc).
_OPEN_FILE_PATHS = re.compile(r"/dev/(stdout|stderr|fd/\d+)|/proc/(self|\d+)/fd/\d+")


def writes_in_place(path: Path) -> bool:
    """Whether an output is written straight into ``path``: a character device (``/dev/null``),
    a named pipe, or a file the process holds open (``/dev/stdout``, ``/dev/fd/N``). A
    temporary file renamed into place only makes sense for a regular file; for these the bytes
    go through as they are written, as on standard output."""
    if _OPEN_FILE_PATHS.fullmatch(os.path.abspath(path)):
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _special_kind(path: Path) -> str | None:
    """What ``path`` (followed through links) is when it is neither a file nor a directory."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    kinds = {
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISFIFO: "a named pipe",
        stat.S_ISSOCK: "a socket",
    }
    return next((kind for test, kind in kinds.items() if test(mode)), None)


def _check_replaceable_folder(output: Path) -> None:
    # --force replaces a dataset folder advcli wrote (part-*.parquet files only), never a folder
    # of the user's other files.
    for entry in output.iterdir():
        if not (entry.is_file() and entry.name.startswith("part-") and entry.suffix == ".parquet"):
            raise AdvcliError(
                f"{output}: the folder holds files advcli did not write ({entry.name}); "
                "remove it yourself or choose another output"
            )


@contextlib.contextmanager
def atomic_output(
    output: Path,
    *,
    force: bool = False,
    folder: bool = False,
    keep: Sequence[Path] = (),
    before_publish: Callable[[], None] | None = None,
    replace_hint: str = "pass --force to replace it",
) -> Iterator[Path]:
    """Yield a temporary path beside ``output`` (a new empty file, or with ``folder`` a new empty
    directory); publish it at ``output`` only if the block succeeds. A device, a pipe or an
    open file's path (:func:`writes_in_place`) is yielded itself.

    The temporary path lies inside a partial folder of advcli's own, which is removed whatever
    happens: a writer thread that outlives an interrupted block (Polars finishes its tasks on its
    own threads) cannot create the file again once its folder is gone.

    Without ``force`` an ``output`` that exists when the block ends is an error
    (:class:`OutputAppeared`, its message ending with ``replace_hint``, how the caller's user
    asks for a replace), not replaced.
    ``keep`` names files that the stale-partial cleanup must not touch (the run's inputs).
    ``before_publish`` is called when the block has succeeded: an error it raises (an input that
    changed, :class:`~advcli.errors.InputChanged`) publishes nothing.
    """
    if not folder and writes_in_place(output):
        with _as_write_error(output):
            yield output
        if before_publish is not None:
            try:
                before_publish()
            except InputChanged as changed:
                # The bytes have gone through already: the reader must be told not to use them.
                raise InputChanged(
                    changed.label,
                    changed.change,
                    f"what went to {output} was read from it while it changed: do not use it",
                ) from None
        return
    parent = output.parent
    if not parent.is_dir():
        raise AdvcliError(f"{output}: the folder {parent} does not exist")
    _remove_stale_partials(output, keep)
    container: Path | None = None
    try:
        # A signal held back here is delivered as the block ends, when the folder already has
        # its name: inside this try, whose finally removes it.
        with held():
            try:
                container = _create_container(output)
            except OSError as error:
                raise AdvcliError(
                    f"{output}: cannot write to {parent} ({_reason(error)})"
                ) from None
        with _as_write_error(output):
            partial = container / "partial"
            if folder:
                os.mkdir(partial)
            else:
                os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            yield partial
            if before_publish is not None:
                before_publish()
            if not folder:
                _mark_published(partial)
            _publish(
                partial, output, force=force, folder=folder, keep=keep, replace_hint=replace_hint
            )
    finally:
        if container is not None:
            with held():
                _discard(container)


def _create_container(output: Path) -> Path:
    """A new partial folder beside ``output``, marked as advcli's."""
    prefix = _partial_prefix(output)
    # A name no user would pick: dot, output name, hash, PID, random text, suffix.
    while True:
        container = output.parent / f"{prefix}{os.getpid()}.{secrets.token_hex(4)}{PARTIAL_SUFFIX}"
        try:
            os.mkdir(container)
            break
        except FileExistsError:
            continue
    with contextlib.suppress(OSError):
        # Where the filesystem has no user extended attributes the partial stays unmarked: a run
        # killed there leaves it behind, and no later run removes it.
        marker = f"{os.getpid()} {os.stat(container).st_ino} {_machine()}"
        os.setxattr(container, MARKER, marker.encode())
    return container


def _mark_published(partial: Path) -> None:
    # Where the filesystem has no user extended attributes a watcher waits for the file to
    # settle instead.
    with contextlib.suppress(OSError):
        info = os.stat(partial)
        os.setxattr(partial, PUBLISHED, f"{info.st_size} {info.st_mtime_ns}".encode())


def published_whole(path: Path) -> bool:
    """Whether ``path`` is a file advcli published (renamed into place whole) and unchanged
    since: its :data:`PUBLISHED` mark names its present size and modification time."""
    try:
        info = os.stat(path)
        mark = os.getxattr(path, PUBLISHED).decode()
    except (OSError, UnicodeDecodeError):
        return False
    return mark == f"{info.st_size} {info.st_mtime_ns}"


def _partial_prefix(output: Path) -> str:
    """``.NAME.HASH.``: NAME cut so that the whole partial name fits the filesystem's limit (an
    output name close to the limit must not fail because of its temporary name), and HASH of the
    full name, so that the partials of two outputs never share a prefix (``a`` and ``a.b``, or two
    long names that differ only past the cut)."""
    digest = hashlib.sha256(os.fsencode(output.name)).hexdigest()[:8]
    # dot + "." + hash + "." + PID (up to 10 digits) + "." + 8 random hex + suffix
    room = _name_max(output.parent) - (1 + 1 + 8 + 1 + 10 + 1 + 8 + len(PARTIAL_SUFFIX))
    name = os.fsencode(output.name)[: max(0, room)].decode("utf-8", errors="ignore")
    return f".{name}.{digest}."


def _machine() -> str:
    """Where a PID means this process: the host, its boot and the PID namespace. A partial
    written under another one (a container sharing the folder, another host on a network
    filesystem) has a PID this process cannot check, so it is never taken for dead."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as boot:
            boot_id = boot.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        boot_id, namespace = "unknown", 0
    return f"{socket.gethostname()}/{boot_id}/{namespace}"


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


@contextlib.contextmanager
def _as_write_error(output: Path) -> Iterator[None]:
    """Any failure of the operating system while writing ``output`` as one error naming it."""
    try:
        yield
    except BrokenPipeError:  # the reader of a pipe went away: the command line ends quietly
        raise
    except OSError as error:
        raise AdvcliError(f"{output}: cannot write ({_reason(error)})") from None


def _reason(error: OSError) -> str:
    return error.strerror or str(error) or type(error).__name__


def _publish(
    partial: Path,
    output: Path,
    *,
    force: bool,
    folder: bool,
    keep: Sequence[Path],
    replace_hint: str,
) -> None:
    if force:
        if folder and output.is_dir():
            _replace_folder(partial, output, keep)
        else:
            os.replace(partial, output)
        return
    try:
        _rename_no_replace(partial, output, folder)
    except FileExistsError:
        raise OutputAppeared(
            f"{output}: the file appeared while advcli was writing; it was left as it is "
            f"({replace_hint})"
        ) from None


def _replace_folder(partial: Path, output: Path, keep: Sequence[Path]) -> None:
    # An input is never removed, whatever the caller checked (the output checks refuse such a
    # folder before any work).
    kept = {_identity(path) for path in keep}
    for entry in output.iterdir():
        if _identity(entry) in kept:
            raise AdvcliError(
                f"{output}: the output folder holds the input {entry}; choose another path"
            )
    # The old folder stays whole until the new one is in place; a rename cannot replace a
    # non-empty directory, so the old one is moved aside first (no signal between the two).
    # Beside the partial folder, not in it: that folder is removed whole at the end.
    retired = partial.parent.with_name(partial.parent.name + ".old")
    with held():
        os.rename(output, retired)
        os.rename(partial, output)
    # Only advcli's own part files go: anything else that appeared in the old folder meanwhile
    # stays, in the folder moved aside.
    for part in retired.glob("part-*.parquet"):
        part.unlink()
    with contextlib.suppress(OSError):
        retired.rmdir()


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def _rename_no_replace(source: Path, target: Path, folder: bool) -> None:
    """Rename ``source`` to ``target`` unless ``target`` exists (FileExistsError), as one step."""
    renameat2 = getattr(_libc(), "renameat2", None)
    if renameat2 is not None:
        result = renameat2(
            _AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE
        )
        if result == 0:
            return
        code = ctypes.get_errno()
        # EINVAL/ENOSYS/ENOTSUP: this filesystem or kernel has no RENAME_NOREPLACE.
        if code not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(code, os.strerror(code), str(target))
    if folder:
        # No hard links for directories: rename() refuses a non-empty target; an empty directory
        # that appeared in the meantime is the one case this fallback replaces.
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
        os.rename(source, target)
        return
    try:
        os.link(source, target, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError:
        # No hard links here either (FAT, some network filesystems): claim the name with an
        # exclusive create first, then move the result over our own placeholder.
        with held():  # not between the two: the placeholder would be left empty
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            os.replace(source, target)
        return
    source.unlink()


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _discard(container: Path) -> None:
    """Remove a partial folder. It is renamed first: a writer thread that still holds its old
    path can then create nothing in it while it is being emptied (a file appearing there would
    leave the folder behind)."""
    stem = container.name.removesuffix(PARTIAL_SUFFIX)
    trash = container.with_name(f"{stem}.gone{PARTIAL_SUFFIX}")
    try:
        os.rename(container, trash)
    except OSError:
        trash = container
    _remove(trash)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _remove_stale_partials(output: Path, keep: Sequence[Path]) -> None:
    pattern = f"{glob.escape(_partial_prefix(output))}*{PARTIAL_SUFFIX}"
    kept = {_identity(path) for path in keep}
    for leftover in output.parent.glob(pattern):
        if _is_dead_partial(leftover) and _identity(leftover) not in kept:
            _remove(leftover)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _is_dead_partial(path: Path) -> bool:
    """True only for a partial that advcli marked as its own and whose process has ended."""
    try:
        info = os.lstat(path)
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
            return False
        marker = os.getxattr(path, MARKER, follow_symlinks=False).decode()
        pid_text, inode_text, machine = marker.split()
        pid, inode = int(pid_text), int(inode_text)
    except (OSError, ValueError):
        return False
    # The marker names this very file (a copy of a partial, another inode, is not advcli's) and
    # a process this one can see.
    return (
        inode == info.st_ino
        and info.st_uid == os.getuid()
        and machine == _machine()
        and not _process_alive(pid)
    )


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but another user's
        return True
    return True
