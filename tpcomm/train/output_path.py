"""
Files a user names for a command's output (a trace, a plot, gpu_check's reports, a calibration, a sweep's
--out): checked before any work by one helper, so a typo never overwrites a checkpoint, never writes
`<dir>.png`, and never fails after the work is done. A refusal is a ConfigError naming the key and the
value (one line, exit 2).
"""

import json
import os
import tempfile

from tpcomm.errors import ConfigError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


MARK = "nanoGPT-TP "  # what this project writes into its own outputs, then what wrote them


def png_text(path, keyword):
    """A PNG's tEXt chunk `keyword` (str), or None: not a PNG, no such chunk, unreadable."""
    try:
        with open(path, "rb") as f:
            if f.read(8) != PNG_MAGIC:
                return None
            while True:
                head = f.read(8)
                if len(head) < 8:
                    return None
                size, kind = int.from_bytes(head[:4], "big"), head[4:]
                if kind == b"IEND" or size > 1 << 24:
                    return None
                body = f.read(size + 4)[:size]
                if kind == b"tEXt" and body.split(b"\0", 1)[0] == keyword.encode():
                    return body.split(b"\0", 1)[1].decode("latin-1")
    except OSError:
        return None


def written_by(maker):
    """A predicate: the file is this project's output of kind `maker` ('report', 'figure steps', 'trace'): a
    PNG whose Software chunk, or a JSON object whose 'written_by', is MARK + maker. Not a sniff of the file
    type: a figure of another command, or any other file, is not one."""
    def own(path):
        if path.lower().endswith(".png"):
            return png_text(path, "Software") == MARK + maker
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError, ValueError):
            return False
        return isinstance(data, dict) and data.get("written_by") == MARK + maker
    return own


def json_with(*keys):
    """A predicate: the file is a JSON object holding every one of `keys` (a command's own JSON output)."""
    def own(path):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError, ValueError):
            return False
        return isinstance(data, dict) and all(k in data for k in keys)
    return own


def check_folder(folder, *, key, value):
    """`folder` exists, is a directory, and a file can be created in it (tried: permissions, read-only
    mounts and /proc all refuse)."""
    if not os.path.isdir(folder):
        raise ConfigError(f"{key}: the folder {folder!r} does not exist or is not a directory "
                          f"({key}={value!r})")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-check-")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise ConfigError(f"{key}: cannot write in {folder!r} ({e.strerror or type(e).__name__}; "
                          f"{key}={value!r})") from None


def check_makeable(path, *, key):
    """A folder that exists or can be made: not a file, and its nearest existing ancestor a folder a file can
    be created in (tried, so /proc refuses); nothing is made."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ConfigError(f"{key}={path} is a file, not a directory")
    folder = os.path.abspath(path)
    while not os.path.lexists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise ConfigError(f"{key}={path}: {folder!r} is a file, not a directory")
    check_folder(folder, key=key, value=path)


def check_output_file(path, *, key, own=None, suffixes=(), overwrite=False):
    """Refuse, before any work, an output file path that is empty or not a string, lacks one of `suffixes`, is
    a directory, lies in a folder that is missing or unwritable, or names an existing file that is not this
    command's own output (own(path) says whether it is) unless overwrite. Returns the path."""
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{key} must be a file path, got {path!r}")
    if suffixes and not path.lower().endswith(tuple(suffixes)):
        raise ConfigError(f"{key} must end in {' or '.join(suffixes)} (the format written), got {path!r}")
    if os.path.isdir(path):
        raise ConfigError(f"{key} must be a file path, got the directory {path!r}")
    check_folder(os.path.dirname(os.path.abspath(path)), key=key, value=path)
    if os.path.lexists(path) and not overwrite and not (own is not None and own(path)):
        raise ConfigError(f"{key}={path!r} exists and is not this command's output: it would be overwritten; "
                          f"give another path or remove that file")
    return path


def check_output_dir(path, *, key):
    """An output folder: a directory (made if missing, with its parent existing) that can be written."""
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{key} must be a folder path, got {path!r}")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ConfigError(f"{key}={path!r} exists and is not a directory")
    check_folder(path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path)), key=key, value=path)
    return path


def replace_atomically(write, path):
    """write(tmp) into a temporary file beside `path` (its name ends as path's: writers that pick the format
    by the extension pick the same), then rename it into place: a failed write leaves the old file (if any)
    whole and no temporary file behind."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=f"-{os.path.basename(path)}")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
