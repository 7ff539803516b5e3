"""The package version: one place, imported by everything that needs it (image tags included)."""

__version__ = "0.1.0"
