"""The cluster layer (docs/cluster.md). Step 1 of its section 15: the :class:`MetadataStore`
boundary through which the core reads and changes cluster-wide definitions, and
:class:`LocalMetadata`, the single node's implementation over its own log."""

from core.cluster.epochs import EpochClaim, EpochTaken
from core.cluster.layout import ClusterLayout, LayoutError
from core.cluster.local import LocalMetadata
from core.cluster.metadata import (
    KIND_BINDING,
    KIND_LIMIT,
    KIND_QUEUE,
    KIND_REDRIVE,
    KIND_SECURITY,
    KIND_SETTING,
    KIND_TOPIC,
    Change,
    MetadataConflict,
    MetadataGap,
    MetadataStore,
    Versioned,
)

__all__ = [
    "KIND_BINDING",
    "KIND_LIMIT",
    "KIND_QUEUE",
    "KIND_REDRIVE",
    "KIND_SECURITY",
    "KIND_SETTING",
    "KIND_TOPIC",
    "Change",
    "ClusterLayout",
    "EpochClaim",
    "EpochTaken",
    "LayoutError",
    "LocalMetadata",
    "MetadataConflict",
    "MetadataGap",
    "MetadataStore",
    "Versioned",
]
