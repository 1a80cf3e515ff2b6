"""The server's hardening, called from the compatibility layer at one point each: the API key, request body
limits, binding the port and shutting down gracefully. Nothing here knows the engine."""
