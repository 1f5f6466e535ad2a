"""msgspec's refusal of a request body, said in the client's terms, with one code per mistake.

msgspec words its errors for the programmer ("Object missing required field `model`", "Expected
`int` >= 1 - at `$.n`"). A client wants OpenAI's: the field by its JSON path, what was expected,
what was sent, and a code that is the same for the same mistake on every route and model:

  missing_field      a required field is absent               param = the field
  unknown_parameter  a field the (strict) object does not take param = the field
  invalid_type       a value of the wrong JSON type            param = the field (None: the body)
  invalid_value      the right type, but out of range / not one of the allowed values
  invalid_json       the bytes are not JSON at all
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any

import msgspec

from omni.api.errors import ApiError

_JSON_TYPES = {"int": "an integer", "float": "a number", "str": "a string", "bool": "a boolean",
               "object": "an object", "array": "an array", "null": "null", "bytes": "a base64 string"}
_BOUND_WORDS = {">=": "at least", "<=": "at most", ">": "more than", "<": "fewer than"}
_UNIT = {"str": "characters", "array": "items", "object": "entries"}
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_TOKEN = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")


def decode_refusal(exc: msgspec.ValidationError | msgspec.DecodeError, body: bytes | None = None,
                   cls: type | None = None) -> ApiError:
    """The 400 for a body `cls` could not be decoded from (`body`, when given, supplies the values)."""
    if not isinstance(exc, msgspec.ValidationError):
        return ApiError(400, f"body is not valid JSON: {exc}", code="invalid_json")
    raw = _raw(body)
    found = _AT.match(str(exc))
    what, tokens = found["what"], _tokens(found["path"] or "")
    tokens = _named_keys(tokens, raw, cls)
    return refusal_for(what, tokens, _value_at(raw, tokens), _type_at(cls, tokens))


def refusal_for(what: str, tokens: list, value: Any, tp: Any) -> ApiError:
    """One msgspec message (without its " - at ..." tail) at the path `tokens` as an ApiError."""
    if m := re.fullmatch(r"Object missing required field `(.+)`", what):
        param = _render(tokens + [m[1]])
        return ApiError(400, f"Missing required parameter: '{param}'.", param=param, code="missing_field")
    if m := re.fullmatch(r"Object contains unknown field `(.+)`", what):
        param = _render(tokens + [m[1]])
        return ApiError(400, f"Unrecognized request argument supplied: '{param}'.", param=param,
                        code="unknown_parameter")
    param = _render(tokens) or None
    where = f"'{param}'" if param else "the request body"
    if m := re.fullmatch(r"Expected `([^`]+)`, got `([^`]+)`", what):
        expected = _type_words(m[1]) if param else "a JSON object"
        return ApiError(400, f"Invalid type for {where}: expected {expected}, but got {_type_words(m[2])} instead.",
                        param=param, code="invalid_type")
    if m := re.fullmatch(r"Expected `([^`|]+)` of length (>=|<=|>|<) (\S+)", what):
        got = f", but got {len(value)}" if isinstance(value, (str, list, dict)) else ""
        return ApiError(400, f"Invalid {where}: expected {_type_words(m[1])} with {_BOUND_WORDS[m[2]]} {m[3]} "
                             f"{_unit(m[1], m[3])}{got}.", param=param, code="invalid_value")
    if m := re.fullmatch(r"Expected `([^`|]+)` (>=|<=|>|<) (\S+)", what):
        got = f", but got {_shown(value)} instead" if value is not None else ""
        return ApiError(400, f"Invalid {where}: expected {_type_words(m[1])} {m[2]} {m[3]}{got}.",
                        param=param, code="invalid_value")
    if m := re.fullmatch(r"Invalid (?:enum )?value (.+)", what):
        allowed = _literal_values(tp)
        supported = f" Supported values are: {', '.join(repr(v) for v in allowed)}." if allowed else ""
        return ApiError(400, f"Invalid value for {where}: {m[1]}.{supported}", param=param, code="invalid_value")
    return ApiError(400, f"Invalid {where}: {what}.", param=param, code="invalid_value")


def _raw(body: bytes | None) -> Any:
    try:
        return msgspec.json.decode(body) if body else None
    except (msgspec.DecodeError, RecursionError):
        return None


def _tokens(path: str) -> list:
    return [name if name else (int(index) if index.isdigit() else ...)
            for name, index in _TOKEN.findall(path)]


def _render(tokens: list) -> str:
    out = ""
    for t in tokens:
        out += f"[{t}]" if isinstance(t, int) else "[...]" if t is ... else (f".{t}" if out else t)
    return out


def _named_keys(tokens: list, raw: Any, cls: type | None) -> list:
    """msgspec writes a dict key as `[...]`: name it (the one key, or the first whose value fails)."""
    out: list = []
    for t in tokens:
        here = _value_at(raw, out)
        if t is ... and isinstance(here, dict) and here:
            inner = _type_at(cls, out + [...])
            bad = [k for k, v in here.items() if inner is not None and not _fits(v, inner)]
            t = (bad or list(here))[0] if len(here) == 1 or bad else t
        out.append(t)
    return out


def _fits(value: Any, tp: Any) -> bool:
    try:
        msgspec.convert(value, tp)
        return True
    except (msgspec.ValidationError, TypeError, RecursionError):
        return False


def _value_at(raw: Any, tokens: list) -> Any:
    for t in tokens:
        if isinstance(t, int) and isinstance(raw, list) and t < len(raw):
            raw = raw[t]
        elif isinstance(t, str) and isinstance(raw, dict):
            raw = raw.get(t)
        else:
            return None
    return raw


def _type_at(tp: Any, tokens: list) -> Any:
    """The declared Python type at `tokens` inside `tp` (None when the path leaves what is declared)."""
    for t in tokens:
        if tp is None:
            return None
        tp = _child(tp, t)
    return tp


def _child(tp: Any, token: Any) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return _child(args[0], token)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if isinstance(token, str) and all(isinstance(a, type) and issubclass(a, msgspec.Struct) for a in members):
            tags = [a.__struct_config__.tag for a in members if a.__struct_config__.tag_field == token]
            if tags:
                return typing.Literal[tuple(tags)]
        return next((c for a in members if (c := _child(a, token)) is not None), None)
    if origin is list and isinstance(token, int):
        return args[0] if args else Any
    if origin is dict and (token is ... or isinstance(token, str)):
        return args[1] if args else Any
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct) and isinstance(token, str):
        config = tp.__struct_config__
        if token == config.tag_field:
            return typing.Literal[config.tag]
        return next((f.type for f in msgspec.structs.fields(tp) if f.encode_name == token), None)
    return None


def _literal_values(tp: Any) -> list:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return _literal_values(args[0])
    if origin is typing.Literal:
        return list(args)
    if origin in (typing.Union, types.UnionType):
        return [v for a in args for v in _literal_values(a)]
    return []


def _unit(json_type: str, count: str) -> str:
    unit = _UNIT.get(json_type, "items")
    return unit[:-1] if count == "1" else unit


def _type_words(names: str) -> str:
    words = [_JSON_TYPES.get(n.strip(), n.strip()) for n in names.split("|")]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _shown(value: Any) -> str:
    text = msgspec.json.encode(value).decode()
    return text if len(text) <= 40 else text[:37] + "..."
