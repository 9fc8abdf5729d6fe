"""Durable key/value state kept as records in system topics (everything is in the log)."""

from core.state.table import DurableTable

__all__ = ["DurableTable"]
