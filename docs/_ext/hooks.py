"""MkDocs hooks for the site: the package version beside the site's name.

The version is read from ``pyproject.toml``, the one place it is written, so the site
cannot name another version than the package it documents.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def version() -> str:
    """The ``[project] version`` of ``pyproject.toml``."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def on_config(config: Any, **kwargs: Any) -> Any:
    # In the header and each page's title: "gosim 0.1.0".
    config["site_name"] = f"{config['site_name']} {version()}"
    return config
