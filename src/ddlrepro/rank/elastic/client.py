"""Client of the config server, over one kept-alive HTTP connection (workers ask it after every step)."""

from __future__ import annotations

import http.client
import json
from typing import Any

from ddlrepro.rank.elastic.cluster import Cluster


class ConfigServerError(RuntimeError):
    """The config server refused a request (its status and reason) or could not be reached."""


class ConfigClient:
    def __init__(self, address: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host, int(port)
        self.token = token
        self.timeout_s = timeout_s
        self.connection: http.client.HTTPConnection | None = None

    def latest(self) -> Cluster:
        return Cluster.from_dict(self.request("GET", "/config"))

    def stopped(self) -> bool:
        """Whether the job is to stop: its latest version has no members."""
        return not self.latest().members

    def version(self, number: int) -> Cluster:
        return Cluster.from_dict(self.request("GET", f"/config?version={number}"))

    def wait_newer(self, version: int, timeout_s: float = 10.0) -> Cluster:
        """The latest version once newer than `version` (or the latest after `timeout_s`)."""
        return Cluster.from_dict(self.request("GET", f"/config?after={version}&timeout={int(timeout_s)}"))

    def resize(self, size: int) -> Cluster:
        return Cluster.from_dict(self.request("POST", "/resize", {"size": size}))

    def remove(self, worker: int) -> Cluster:
        return Cluster.from_dict(self.request("POST", "/remove", {"worker": worker}))

    def put(self, members: list[int]) -> Cluster:
        return Cluster.from_dict(self.request("PUT", "/config", {"members": members}))

    def reset(self) -> Cluster:
        return Cluster.from_dict(self.request("POST", "/reset"))

    def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """Send one request (reconnecting once if the kept-alive connection was dropped); the JSON answer."""
        payload = json.dumps(body).encode() if body is not None else b""
        headers = {
            "Content-Type": "application/json",
            **({"Authorization": f"Bearer {self.token}"} if self.token else {}),
        }
        for attempt in (1, 2):
            try:
                connection = self._connection()
                connection.request(method, path, payload, headers)
                response = connection.getresponse()
                answer = json.loads(response.read() or b"{}")
                break
            except (ConnectionError, http.client.HTTPException, OSError) as error:
                self.close()
                if attempt == 2:
                    raise ConfigServerError(f"config server {self.host}:{self.port} unreachable: {error}") from error
        if response.status >= 400:
            self.close()
            raise ConfigServerError(f"{method} {path}: {response.status} {answer.get('error', '')}")
        return answer

    def _connection(self) -> http.client.HTTPConnection:
        if self.connection is None:
            self.connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s + 60)
        return self.connection

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None
