"""Drive an ASGI app in-process the way an HTTP server does, disconnects included.

httpx's ASGI transport cannot make a client go away mid-request; this driver can: after the body
it answers ``receive()`` with ``http.disconnect`` once ``disconnect_after_s`` has passed (or once
the response is complete, as uvicorn does), which is the message a real server sends when the
client's socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answer:
    """What the app sent back.

    Attributes:
        status: the response status, ``None`` if the app sent none.
        body: the response body bytes.
        error: the exception the app raised, as text (``""``: none).
    """

    status: int | None = None
    body: bytes = b""
    error: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        """The body as JSON (``None`` if it is not JSON)."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None


async def asgi_call(
    app: Any,
    method: str,
    path: str,
    body: bytes = b"",
    headers: list[tuple[bytes, bytes]] | None = None,
    disconnect_after_s: float | None = None,
) -> Answer:
    """One request to ``app``; the client disconnects ``disconnect_after_s`` after sending the
    body (``None``: it stays until the response is complete)."""
    answer = Answer()
    complete = asyncio.Event()
    sent = False
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test"), *(headers or [])],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if disconnect_after_s is None:
            await complete.wait()
        else:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(complete.wait(), disconnect_after_s)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            answer.headers = {k.decode(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            answer.body += message.get("body", b"")
            if not message.get("more_body", False):
                complete.set()

    try:
        await app(scope, receive, send)
    except Exception as exc:  # noqa: BLE001  (reported to the test)
        answer.error = f"{type(exc).__name__}: {exc}"
    complete.set()
    return answer
