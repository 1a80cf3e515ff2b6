"""The OpenAI-compatible HTTP server: protocol, completion and chat endpoints, the FastAPI app."""
