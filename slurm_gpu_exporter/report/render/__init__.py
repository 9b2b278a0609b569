"""Renderers: the same report as a terminal table, CSV, JSON, Markdown or HTML."""
