"""The package's version: ``walklens.__version__`` and ``walklens --version``.

It lives at the bottom of the layers, not in the package root: the root is the entry point, which imports the
notebook views to register them, so the CLI reads the version here instead of importing the root.
"""

from __future__ import annotations

__version__ = "0.1.0"
