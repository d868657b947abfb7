"""Request and response schemas (pydantic), one module per resource."""
