"""Engines room: the shared cell types (``base``), one runner module per engine family, and the
registry that maps an engine id to its family (``registry``)."""
