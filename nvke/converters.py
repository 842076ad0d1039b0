"""URL path converters that refuse what the database would choke on (NUL bytes …)."""


class UsernameConverter:
    """Django usernames: letters, digits and ``@ . + - _`` (at most 150)."""

    regex = r"[\w.@+-]{1,150}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value
