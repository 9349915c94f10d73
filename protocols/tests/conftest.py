"""Shared test configuration for the tempering-protocols tests."""

pytest_plugins = ["pytester"]
