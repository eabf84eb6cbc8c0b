"""Hookspecs, the plugin manager, and one adapter package per engine."""
