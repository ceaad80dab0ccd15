"""Reading and writing ``GpuTargetConfigProto`` protobuf text (no protobuf dependency)."""

from __future__ import annotations

import os
import re

from remat_kit.errors import BadValue

__all__ = [
    "escape",
    "proto_cc",
    "proto_number",
    "read_config",
    "slug",
    "unescape",
]


def read_config(path_or_text: str | os.PathLike[str]) -> tuple[str, str, str | None]:
    if isinstance(path_or_text, str) and ("{" in path_or_text or "\n" in path_or_text):
        return path_or_text, "target config text", None
    path = os.fspath(path_or_text)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise BadValue(f"target config file {path!r} does not exist") from None
    stem = os.path.splitext(os.path.basename(path))[0]
    return text, f"target config file {path!r}", stem


def proto_number(text: str, key: str) -> float | None:
    match = re.search(rf"\b{key}\s*:\s*([-+0-9.eE]+)", text)
    if match is None:
        return None
    value = float(match.group(1))
    return int(value) if value.is_integer() else value


def proto_cc(text: str) -> tuple[int, int] | None:
    block = re.search(r"\bcuda_compute_capability\s*\{([^}]*)\}", text)
    if block is None:
        return None
    major = re.search(r"\bmajor\s*:\s*(\d+)", block.group(1))
    minor = re.search(r"\bminor\s*:\s*(\d+)", block.group(1))
    return (int(major.group(1)) if major else 0, int(minor.group(1)) if minor else 0)


def escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
