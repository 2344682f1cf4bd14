"""Compiled-manifest schema, source readers, writers, hashing, buckets.json and plan readers.

Imports nothing else of this project and never torch: any trainer can depend on it.
"""

from manifests.atomic_files import atomic_path, write_json
from manifests.buckets_file import Bucket, BucketSpec, read_buckets, write_buckets
from manifests.content_hash import ContentHasher, file_sha256, table_hash
from manifests.errors import DataprepError, ManifestError, OptionError
from manifests.hash_cache import default_cache_dir, manifest_hash
from manifests.manifest_read import read_manifest, read_metadata
from manifests.manifest_write import write_manifest, write_parquet_stream, write_rejects
from manifests.plan_cursor import PlanCursor, PlanStateError
from manifests.plan_files import PlanBatch, PlanShard, open_shard, read_plan_json
from manifests.schema import MANIFEST_COLUMNS, MANIFEST_SCHEMA, REJECT_REASONS, SCHEMA_VERSION

__all__ = [
    "Bucket",
    "ContentHasher",
    "PlanBatch",
    "PlanCursor",
    "PlanShard",
    "PlanStateError",
    "BucketSpec",
    "DataprepError",
    "MANIFEST_COLUMNS",
    "MANIFEST_SCHEMA",
    "ManifestError",
    "OptionError",
    "REJECT_REASONS",
    "SCHEMA_VERSION",
    "atomic_path",
    "default_cache_dir",
    "file_sha256",
    "manifest_hash",
    "open_shard",
    "read_buckets",
    "read_manifest",
    "read_metadata",
    "read_plan_json",
    "table_hash",
    "write_buckets",
    "write_json",
    "write_manifest",
    "write_parquet_stream",
    "write_rejects",
]
