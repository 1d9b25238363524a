"""Catalogs of traced op configs: merge graphs of many models into deduplicated configs with provenance.

A config is an op with its place in the graph stripped (see :mod:`opgraph.ir.configs`); its
hash is stable across captures, op ids and program order. Catalogs feed sweep tests
(:mod:`validators.sweep`) and the ``opgraph ops`` command.
"""

from opgraph.catalog.build import (
    AddResult,
    CatalogBuilder,
    CatalogError,
    add_graph_files,
    build_catalog,
    graph_fingerprint,
    load_catalog,
    merge_catalogs,
    save_catalog,
)
from opgraph.catalog.models import Catalog, CatalogEntry, ConfigSource, GraphRecord
from opgraph.catalog.query import OperationSummary, filter_entries, select_op, summarize
from opgraph.ir.configs import (
    CONFIG_HASH_VERSION,
    canonical_json,
    config_dict,
    config_hash,
    dtype_signature,
    normalise_op,
    operation_name,
    size_label,
    tensor_layout,
)

__all__ = [
    "CONFIG_HASH_VERSION",
    "AddResult",
    "Catalog",
    "CatalogBuilder",
    "CatalogEntry",
    "CatalogError",
    "ConfigSource",
    "GraphRecord",
    "OperationSummary",
    "add_graph_files",
    "build_catalog",
    "canonical_json",
    "config_dict",
    "config_hash",
    "dtype_signature",
    "filter_entries",
    "graph_fingerprint",
    "load_catalog",
    "merge_catalogs",
    "normalise_op",
    "operation_name",
    "save_catalog",
    "select_op",
    "size_label",
    "summarize",
    "tensor_layout",
]
