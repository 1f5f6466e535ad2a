"""Which content format a chat template takes, and messages rendered in it (as vLLM does).

A template either iterates over a message's content parts (`{% for item in message['content'] %}`:
the "openai" format, which can place media where the parts are) or prints the content as one
string (the "string" format, as many checkpoints' templates do). Given a list, a string template
would print Python's repr of it into the prompt. So: for an openai template, string content becomes
one text part; for a string template, parts become one string, text parts as they are and each
media part as the model's placeholder text (which the template cannot write), joined with newlines
in the order they came.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

# A token covers at most this many characters of ordinary text, so a prompt of more than
# max_context * CHARS_PER_TOKEN characters cannot fit: refused before it is tokenized.
CHARS_PER_TOKEN = 16

OPENAI, STRING = "openai", "string"


@lru_cache(maxsize=16)
def content_format(template: str) -> str:
    """OPENAI when some for-loop of the template iterates over a `content` field (directly, or
    through a variable set from one), else STRING."""
    import jinja2
    from jinja2 import nodes

    try:
        ast = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return STRING

    def is_content(node: nodes.Node, names: set[str]) -> bool:
        if isinstance(node, nodes.Getitem):
            return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
        if isinstance(node, nodes.Getattr):
            return node.attr == "content"
        if isinstance(node, nodes.Filter):  # e.g. `message['content'] | list`
            return node.node is not None and is_content(node.node, names)
        return isinstance(node, nodes.Name) and node.name in names

    aliases: set[str] = set()
    for assign in ast.find_all(nodes.Assign):  # {% set content = message['content'] %}
        if isinstance(assign.target, nodes.Name) and is_content(assign.node, aliases):
            aliases.add(assign.target.name)
    return OPENAI if any(is_content(loop.iter, aliases) for loop in ast.find_all(nodes.For)) else STRING


def render_messages(messages: list[dict[str, Any]], fmt: str, placeholders: dict[str, str]) -> list[dict[str, Any]]:
    """`messages` (content: a string or a list of {"type": "text" | "audio" | "image", ...}) in the
    template's format; `placeholders` maps a media type to the text that stands for it in a prompt."""
    out = []
    for message in messages:
        content = message.get("content")
        if fmt == OPENAI and isinstance(content, str):
            content = [{"type": "text", "text": content}]
        elif fmt == STRING and isinstance(content, list):
            content = "\n".join(part["text"] if part.get("type") == "text" else placeholders[part["type"]]
                                for part in content)
        out.append({**message, "content": content})
    return out
