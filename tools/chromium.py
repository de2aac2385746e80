"""Where the Chromium executable is: ``$MGRPO_CHROMIUM`` (a path, or a name looked up on ``PATH``)
or Debian's ``/usr/bin/chromium``, and how to install it. Imports nothing heavy (no playwright)."""

from __future__ import annotations

import os
import shutil

__all__ = ["DEFAULT_CHROMIUM", "INSTALL_HINT", "default_chromium", "find_chromium"]

DEFAULT_CHROMIUM = "/usr/bin/chromium"
INSTALL_HINT = "install it with `apt-get install -y chromium` (or set MGRPO_CHROMIUM to its path)"


def default_chromium() -> str:
    """The Chromium executable to use: ``$MGRPO_CHROMIUM`` or ``/usr/bin/chromium``."""
    return os.environ.get("MGRPO_CHROMIUM") or DEFAULT_CHROMIUM


def find_chromium(path: str | None = None) -> str | None:
    """The absolute path of an executable Chromium (``path`` or :func:`default_chromium`), or None."""
    path = path or default_chromium()
    found = path if os.path.isabs(path) else shutil.which(path)
    if found and os.path.isfile(found) and os.access(found, os.X_OK):
        return found
    return None
