"""URL path converters that refuse what the database would choke on (NUL bytes …), registered
here once as ``<username:…>`` and ``<token:…>`` for every URLconf that imports this module
(registering a name twice is deprecated in Django 5.2 and an error from Django 6.0)."""

from django.urls import register_converter


class UsernameConverter:
    """Django usernames: letters, digits and ``@ . + - _`` (at most 150)."""

    regex = r"[\w.@+-]{1,150}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class TokenConverter:
    """An opaque URL token or key prefix (``secrets.token_urlsafe``, API key prefixes): word
    characters, ``.`` and ``-`` (at most 200). A NUL byte or a surrogate in the path does not
    match (404), where ``<str:…>`` passed it on to the database (500)."""

    regex = r"[\w.-]{1,200}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(UsernameConverter, "username")
register_converter(TokenConverter, "token")
