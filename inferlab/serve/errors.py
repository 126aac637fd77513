"""The course server's error answers in the OpenAI API's shape: ``APIError`` carries a status,
OpenAI's error body (``error_body``: ``{"error": {"message", "type", "param", "code"}}``) and,
for 429 and 503, a Retry-After header.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

RETRY_AFTER_S = 1  # what 429 and 503 tell a client to wait before trying again


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class APIError(Exception):
    """An OpenAI-style error answer."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, retry: bool = False):
        super().__init__(message)
        self.status, self.body = status, error_body(message, type_, param, code)
        self.headers = {"Retry-After": str(RETRY_AFTER_S)} if retry else None

    def response(self) -> JSONResponse:
        return JSONResponse(self.body, self.status, headers=self.headers)
