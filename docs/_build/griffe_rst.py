"""A griffe extension: the docstrings' reStructuredText roles, read as Markdown.

accel's Google-style docstrings name other objects with Sphinx roles (``:class:`X```,
``:func:`X```) and introduce code with ``::``; Markdown would print those as they are.
This turns each role into inline code and each ``::`` into a colon (``Example::``, which
Google style would read as a section heading, into ``For example:``); the indented code
that follows stays a code block.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:attr|class|data|exc|func|meth|mod|obj):`~?([^`]+)`")
EXAMPLE = re.compile(r"^(\s*)Examples?::$", flags=re.MULTILINE)
LITERAL = re.compile(r"(\S)::$", flags=re.MULTILINE)


def markdown(text: str) -> str:
    """Return ``text`` with roles as inline code and ``::`` as a colon."""
    text = ROLE.sub(r"`\1`", text)
    text = EXAMPLE.sub(r"\1For example:", text)
    return LITERAL.sub(r"\1:", text)


class ReStructuredTextRoles(griffe.Extension):
    """Rewrite every loaded object's docstring before mkdocstrings parses it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring, if it has one."""
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
