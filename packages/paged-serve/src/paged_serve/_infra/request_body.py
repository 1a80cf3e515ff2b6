"""A request body read as JSON that cannot exhaust the server: a size limit checked on the declared length and while
reading (a large body is never held whole), a media type other than JSON (415: a browser sends ``text/plain`` or a
form without a CORS preflight, so any web page could start generations), invalid UTF-8, invalid JSON and nesting
too deep refused."""

from __future__ import annotations

import json

from starlette.requests import Request


class RequestBodyError(ValueError):
    """The body cannot be used: ``status`` 413 (too large), 415 (not declared JSON) or 400 (not JSON)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


async def read_json(request: Request, max_bytes: int) -> object:
    """The body as JSON, or ``RequestBodyError``: 415 unless the content type is ``application/json`` (vLLM's
    ``validate_json_request``), 413 past ``max_bytes``, 400 for invalid UTF-8, invalid JSON or nesting too deep."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise RequestBodyError(
            f"Unsupported Media Type: {media_type or 'no content type'!r}; only 'application/json' is accepted", 415
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise RequestBodyError(f"request body of {int(declared)} bytes exceeds the limit of {max_bytes}", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise RequestBodyError(f"request body exceeds the limit of {max_bytes} bytes", 413)
        chunks.append(chunk)
    body = b"".join(chunks)
    try:
        return json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RequestBodyError(f"the body is not valid UTF-8: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise RequestBodyError(f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise RequestBodyError("invalid JSON: nested too deeply") from None
