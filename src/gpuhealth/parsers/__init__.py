"""Pure parsers: real tool output in, facts-document fragments out.

Stdlib only: these modules are shipped to the nodes inside the probe bundle.
"""


class ParseError(ValueError):
    """Tool output that cannot be understood; the message names the line."""
