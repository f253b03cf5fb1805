"""Fixtures of the compatibility regression tests: the launcher tests' factory and client."""

from tests.launcher.conftest import launchers, zuul  # noqa: F401
