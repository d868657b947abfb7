"""The HTTP layer: Litestar controllers, request/response schemas, and the one error table."""
