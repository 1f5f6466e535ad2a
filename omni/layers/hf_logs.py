"""Drop a transformers start-up warning a family knows to be harmless for its checkpoints, at the
logger that emits it; every other message of that logger is left alone. Each family names its own
(its `__init__.py`, imported by omnid and by each of its stage processes)."""

from __future__ import annotations

import logging


class _DropHarmless(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)


def drop_warnings(logger_name: str, *prefixes: str) -> None:
    """Drop `logger_name`'s messages that start with any of `prefixes` (idempotent)."""
    logger = logging.getLogger(logger_name)
    for f in logger.filters:
        if isinstance(f, _DropHarmless):
            f.prefixes = tuple(dict.fromkeys((*f.prefixes, *prefixes)))
            return
    logger.addFilter(_DropHarmless(tuple(prefixes)))
