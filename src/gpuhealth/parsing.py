"""What every parser shares: its one error type.

Parsers are pure (text in, facts out) and fail closed: anything they cannot understand is a
ParseError naming the line, never another exception and never a made-up value. Shipped to the
nodes with the probe, so Python 3.6 and the standard library only.
"""

import json
from typing import Any, Dict, List


class ParseError(ValueError):
    """Tool output that cannot be understood; the message names the line."""


def load_json(text: str, what: str, start: int = 0, whole: bool = False) -> Any:
    """The JSON document at text[start:], or a ParseError naming the line: also for integers
    too long to convert and nesting too deep for the decoder. With `whole`, nothing but
    whitespace may follow it; otherwise trailing text (a tool's last words) is ignored."""
    try:
        doc, end = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise ParseError(f"{what}: not valid JSON: line {exc.lineno}: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"{what}: JSON the decoder refuses: {str(exc)[:120]}") from None
    if whole and text[end:].strip():
        line = text.count("\n", 0, end) + 1
        raise ParseError(f"{what}: not valid JSON: line {line}: extra data after the document")
    return doc


def mapping(value: Any, what: str) -> Dict[str, Any]:
    """A JSON object where one belongs; null is an empty one, anything else a ParseError (a
    list or a number in its place is not "nothing to report")."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ParseError(f"{what}: expected an object, got {type(value).__name__}")
    return value


def sequence(value: Any, what: str) -> List[Any]:
    """A JSON array where one belongs; null is an empty one, anything else a ParseError."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ParseError(f"{what}: expected an array, got {type(value).__name__}")
    return value
