"""The server's guards in front of the routes: the API key (``paged_serve._infra.api_key``) and the request body
limits (``paged_serve._infra.request_body``)."""

from paged_serve._infra.api_key import API_KEY_ENV, UNPROTECTED_PATHS, APIKeyMiddleware
from paged_serve._infra.request_body import RequestBodyError, read_json

__all__ = ["API_KEY_ENV", "UNPROTECTED_PATHS", "APIKeyMiddleware", "RequestBodyError", "read_json"]
