"""Facade for the seed's `from hfexport.exporter_dynamo import register_pytree_node`."""

from .backends.dynamo.exporter import DynamoExporter
from .capture.pytree import register_pytree_node

__all__ = ["DynamoExporter", "register_pytree_node"]
