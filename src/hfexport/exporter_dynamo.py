"""Facade for `from hfexport.exporter_dynamo import register_pytree_node`, the documented import path."""

from .backends.dynamo.exporter import DynamoExporter
from .capture.pytree import register_pytree_node

__all__ = ["DynamoExporter", "register_pytree_node"]
