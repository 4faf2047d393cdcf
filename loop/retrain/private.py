"""The retrain's learner-data folder: mode 0700, files 0600, flocked while in use.

The next retrain removes one a killed run left."""
from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

DATA_DIR = ".data"          # inside a retrain's --out: events.csv, train.csv and the export's temporary files


@contextmanager
def private_data(out: Path, keep: bool) -> Iterator[Path]:
    """A fresh 0700 folder in `out`, held by an flock for the block, removed after it unless `keep`
    (then its files are made 0600). A retrain killed inside the block leaves it unlocked: sweep() removes it."""
    folder = Path(out) / DATA_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            if keep:
                (folder / "kept").write_text("kept by --keep-data: learner data, remove when done\n")
                for path in folder.iterdir():
                    os.chmod(path, 0o600)
            else:
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        os.close(fd)


def sweep(runs: Path) -> list[Path]:
    """Remove the data folders of retrains under `runs` that no process holds (killed runs); returns them.
    Folders kept on purpose (--keep-data) are locked by nobody either: they are kept when they hold a
    `kept` marker."""
    removed = []
    for folder in sorted(Path(runs).glob(f"*/{DATA_DIR}")):
        if (folder / "kept").exists():
            continue
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue                                   # a retrain is using it
        else:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed
