"""The model_name label values the proxy gives what upstream reports: served names as they come,
bounded in number and length, so no upstream reply can grow or break the sidecar's page."""

from __future__ import annotations

OTHER_MODEL = "_other"
MAX_MODEL_NAME = 128  # characters of a model_name label value


class ModelLabels:
    """The first `limit` printable names keep their own label; the rest, and any name that is
    too long or not printable UTF-8 (a lone surrogate, a control byte), read `_other`."""

    def __init__(self, limit: int = 16) -> None:
        self.limit = limit
        self.names: set[str] = set()

    def label(self, name: str | None) -> str:
        if not name:
            return ""
        if len(name) > MAX_MODEL_NAME or not name.isprintable() or not _utf8(name):
            return OTHER_MODEL
        if name in self.names or len(self.names) < self.limit:
            self.names.add(name)
            return name
        return OTHER_MODEL


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
