"""MinIO's S3 client as both sides build it (torch-free, so the host side may import it)."""

from __future__ import annotations

from typing import Any

CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 30.0


def s3_client(endpoint: str, access_key: str, secret_key: str) -> Any:
    """MinIO's S3 client for `endpoint` (scheme://host:port) with short connect timeouts and one retry: a dead
    endpoint answers within seconds."""
    import urllib3
    from minio import Minio

    scheme, _, host = endpoint.partition("://")
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S),
        retries=urllib3.Retry(total=1, backoff_factor=0.2, status_forcelist=(500, 502, 503, 504)),
        maxsize=4,
    )
    return Minio(host, access_key=access_key, secret_key=secret_key, secure=scheme == "https", http_client=http)
