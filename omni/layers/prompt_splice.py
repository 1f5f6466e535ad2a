"""A chat prompt whose earlier answers are the token ids the model generated, not their text.

Why: an answer's text does not always tokenize back into the ids that produced it (a random-weight
answer never does), so a conversation re-tokenized each turn misses the prefix cache from the first
answer on. An assistant message may carry `token_ids`; the template is rendered with a sentinel in
its place, the text is tokenized piece by piece between sentinels, and the ids go in where the
sentinels were. Special tokens around a message (`<|im_start|>assistant\\n`, `<|im_end|>`) are
tokenizer boundaries already, so the pieces tokenize as the whole text would. The answer's stop
token is the template's closing token: when the piece after an answer starts with the answer's last
id (and it is special), it is not written twice.
"""

from __future__ import annotations

from typing import Any, Callable

SENTINEL = "\x00omni-generated-{}\x00"


def with_sentinels(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """Messages with each generated answer's content replaced by a sentinel, and the answers' ids."""
    out, answers = [], []
    for message in messages:
        ids = message.get("token_ids")
        if ids:
            out.append({"role": message["role"], "content": SENTINEL.format(len(answers))})
            answers.append([int(t) for t in ids])
        else:
            out.append(message)
    return out, answers


def splice(text: str, answers: list[list[int]], tokenize: Callable[[str], list[int]],
           special: set[int]) -> list[int]:
    """`text` (rendered with `with_sentinels`) tokenized, each sentinel replaced by its answer."""
    ids: list[int] = []
    rest = text
    for i, answer in enumerate(answers):
        head, sep, rest = rest.partition(SENTINEL.format(i))
        if not sep:  # the template dropped the message (none known does): nothing to splice
            rest = head
            continue
        ids = _join(ids, tokenize(head), special) + answer
    return _join(ids, tokenize(rest), special)


def _join(ids: list[int], piece: list[int], special: set[int]) -> list[int]:
    """`ids` then `piece`, the answer's stop token not written twice where the template closes it."""
    if ids and piece and ids[-1] == piece[0] and piece[0] in special:
        piece = piece[1:]
    return ids + piece
