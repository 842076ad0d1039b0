"""gunicorn's logger with secret path segments redacted from the access log
(``logger_class`` in :mod:`nvke.gunicorn_conf`; ``--logger-class`` under ``make run``)."""

from __future__ import annotations

from gunicorn.glogging import Logger

from nvke.redaction import redact

#: access-log atoms that carry the request's path or the referer
_PATH_ATOMS = ("r", "U", "q", "f")


class RedactingLogger(Logger):
    """gunicorn's Logger; the request line, path, query and referer pass :func:`redact`."""

    def atoms(self, resp, req, environ, request_time):
        atoms = super().atoms(resp, req, environ, request_time)
        for key in _PATH_ATOMS:
            if isinstance(atoms.get(key), str):
                atoms[key] = redact(atoms[key])
        return atoms

    def error(self, msg, *args, **kwargs):
        super().error(redact(str(msg)), *args, **kwargs)

    def warning(self, msg, *args, **kwargs):
        super().warning(redact(str(msg)), *args, **kwargs)
