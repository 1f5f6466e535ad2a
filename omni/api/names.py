"""The one rule for names a client gives what the server keeps (issue 25, point 6): an uploaded
voice's name, a Realtime conversation item's id. 1-64 ASCII letters, digits, '_', '.' or '-',
starting with a letter or digit: no control character, no space, no final newline (the pattern
ends in `\\Z`; `$` would match before a trailing "\\n")."""

from __future__ import annotations

import re
from typing import Any

from omni.api.errors import bad_request

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
RULE = "1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"


def is_name(name: Any) -> bool:
    return isinstance(name, str) and NAME_RE.match(name) is not None


def check_name(name: Any, what: str, param: str) -> str:
    """`name` when it follows the rule; else the one 400 (`invalid_value`) naming `what`."""
    if not is_name(name):
        raise bad_request(f"{what} is {RULE}", param=param, code="invalid_value")
    return name
