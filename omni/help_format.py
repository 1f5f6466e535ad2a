"""The one argparse help formatter of omnid's commands (serve, make-tiny FAMILY, ...).

argparse's ArgumentDefaultsHelpFormatter appends "(default: X)" to every flag, also "(default: None)"
or "(default: False)" that say nothing, and a second default after a text that states its own.
"""

from __future__ import annotations

import argparse


class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """`(default: X)` after a flag's help only where it says something: not for None / off / empty
    defaults, nor where the text already states its default (and never an API key's value)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default  # by identity: a default of 0 (== False) is still shown
        if default is None or default is False or default in ([], "", argparse.SUPPRESS) or "default" in text.lower():
            return text
        return super()._get_help_string(action)
