"""Output files the user sees: checked before any work starts, written whole or not at all.

Every file gptfpga writes for the user (emitted Verilog, the Vitis package, logits, traces,
collective dumps, bench JSON and plots, synthesis results) goes through :func:`atomic_write`
or :func:`atomic_output`: the content goes to a temporary name in the same folder, which is
renamed over the target only once it is complete, so an error or a Ctrl-C never leaves a
truncated file behind (a rename within one folder is atomic on POSIX file systems).

:func:`check_out_dir` and :func:`check_out_file` find the mistakes in an output path (a
folder where a file is meant, a missing or read-only folder, the wrong suffix) before the
work that would produce the file, and raise :class:`~host.errors.UserError` naming the flag.
"""

import contextlib
import os
import tempfile
from pathlib import Path

from .errors import UserError

__all__ = ["atomic_write", "write_if_changed", "atomic_output", "check_out_dir", "check_out_file"]


def _name(flag, path):
    return f"{flag}: {str(path)!r}" if flag else f"{str(path)!r}"


@contextlib.contextmanager
def atomic_output(path, mode="wb", *, flag=None):
    """Open a temporary file beside ``path``; on a clean exit it replaces ``path``.

    On an exception (KeyboardInterrupt included) the temporary file is removed and ``path``
    is left as it was. An ``OSError`` becomes a :class:`UserError` naming ``flag`` (when
    given) and the path.
    """
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{_name(flag, path)} is a folder; allowed: a file name")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise UserError(f"{_name(flag, path)}: cannot write there ({e.strerror})") from None
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        raise UserError(f"{_name(flag, path)}: cannot write ({e.strerror or e})") from None
    except BaseException:
        _remove(tmp)
        raise


def atomic_write(path, data, *, flag=None):
    """Write ``data`` (str or bytes) to ``path`` whole, through a temporary file."""
    mode = "w" if isinstance(data, str) else "wb"
    with atomic_output(path, mode, flag=flag) as f:
        f.write(data)
    return Path(path)


def write_if_changed(path, text):
    """``atomic_write`` unless ``path`` holds ``text`` already: an unchanged file keeps its
    time stamp (and what was built from it stays valid)."""
    path = Path(path)
    if path.is_file() and path.read_text() == text:
        return path
    return atomic_write(path, text)


def check_out_dir(path, flag, names=()):
    """An output folder: created if missing; an error if it is a file, cannot be created or
    written, or if one of ``names`` (the files to be written in it) is a folder there.
    Returns the Path."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{_name(flag, path)} is a file; allowed: a folder (created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{_name(flag, path)}: cannot create the folder ({e.strerror})") from None
    why = _unwritable(path)
    if why:
        raise UserError(f"{_name(flag, path)}: the folder is not writable ({why})")
    for name in names:
        if (path / name).is_dir():
            raise UserError(f"{_name(flag, path)}: {name} there is a folder; allowed: a folder in "
                            f"which {name} can be written as a file")
    return path


def check_out_file(path, flag, suffix=None):
    """An output file: its folder must exist and be writable, the path must not be a folder,
    and with ``suffix`` (".npy") its name must end in it (nothing is appended silently).
    Returns the Path."""
    path = Path(path)
    if path.is_dir() or str(path).endswith(os.sep):
        raise UserError(f"{_name(flag, path)} is a folder; allowed: a file name"
                        + (f" ending in {suffix}" if suffix else ""))
    if suffix and path.suffix != suffix:
        raise UserError(f"{_name(flag, path)}: allowed: a file name ending in {suffix}")
    parent = path.parent
    if not parent.is_dir():
        raise UserError(f"{_name(flag, path)}: the folder {str(parent)!r} does not exist")
    why = _unwritable(parent)
    if why:
        raise UserError(f"{_name(flag, path)}: the folder {str(parent)!r} is not writable ({why})")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{_name(flag, path)}: the file exists and is read-only")
    return path


def _unwritable(folder):
    """Why a file cannot be made in ``folder`` (None if it can): tried, not guessed from the
    permission bits (root passes os.access on /proc, and a read-only mount has rw bits)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".gptfpga-probe.", dir=folder)
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    _remove(tmp)
    return None


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _remove(tmp):
    with contextlib.suppress(OSError):
        os.unlink(tmp)
