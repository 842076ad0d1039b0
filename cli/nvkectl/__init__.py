"""nvkectl: the NVKE command-line client (talks HTTP to ``/api/v1`` only; no Django)."""

__version__ = "0.1.0"
