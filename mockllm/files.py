"""The Files API, in memory: upload, list, retrieve, download and delete, shaped like OpenAI's."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from mockllm.http import error_payload

UPLOAD_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
BATCH_OUTPUT = "batch_output"
MAX_LIST_LIMIT = 10_000


class ApiError(Exception):
    """Raised for a Files or Batch API request that OpenAI would refuse; carries the reply."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 error_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.payload = error_payload(message, error_type, code, param)


@dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str
    created_at: int
    content: bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": None,
        }


def list_page(items: list[dict[str, Any]], limit: int, after: str | None) -> dict[str, Any]:
    """An OpenAI cursor page over ``items`` (already in listing order)."""
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > len(page),
    }


def parse_limit(value: str | None, default: int, maximum: int) -> int:
    if value is None:
        return default
    try:
        limit = int(value)
    except ValueError:
        raise ApiError(400, f"Invalid value for 'limit': '{value}' is not an integer.", "limit") from None
    if not 1 <= limit <= maximum:
        raise ApiError(400, f"Invalid value for 'limit': must be between 1 and {maximum}.", "limit")
    return limit


class FileStore:
    """Uploaded files and the files batches write, kept in memory for the mock's lifetime."""

    def __init__(self) -> None:
        self._files: dict[str, StoredFile] = {}

    def _add(self, filename: str, purpose: str, content: bytes) -> StoredFile:
        stored = StoredFile(f"file-{uuid.uuid4().hex[:24]}", filename, purpose, int(time.time()), content)
        self._files[stored.id] = stored
        return stored

    def upload(self, filename: str | None, purpose: str | None, content: bytes | None) -> StoredFile:
        """``POST /v1/files``; raises ApiError like OpenAI for a missing part or a bad purpose."""
        return self._add(self.check_upload(filename, purpose, content), purpose or "", content or b"")

    @staticmethod
    def check_upload(filename: str | None, purpose: str | None, content: bytes | None) -> str:
        """The stored name of an upload OpenAI would accept; raises ApiError (400) otherwise."""
        if content is None:
            raise ApiError(400, "Missing required parameter: 'file'.", "file", "missing_required_parameter")
        if not purpose:
            raise ApiError(400, "Missing required parameter: 'purpose'.", "purpose", "missing_required_parameter")
        if purpose not in UPLOAD_PURPOSES:
            raise ApiError(400, f"Invalid value for 'purpose': '{purpose}' is not one of "
                           f"{', '.join(UPLOAD_PURPOSES)}.", "purpose")
        name = filename or "upload"
        if purpose == "batch" and not name.endswith(".jsonl"):
            raise ApiError(400, "Invalid file format for Batch API. Must be .jsonl", "file")
        return name

    def write_output(self, filename: str, content: bytes) -> StoredFile:
        """A file the mock writes itself (a batch's output or errors)."""
        return self._add(filename, BATCH_OUTPUT, content)

    def find(self, file_id: str) -> StoredFile | None:
        """The file, or None when it was never uploaded or has been deleted."""
        return self._files.get(file_id)

    def get(self, file_id: str) -> StoredFile:
        stored = self._files.get(file_id)
        if stored is None:
            raise ApiError(404, f"No such File object: {file_id}", "id")
        return stored

    def listing(self, query: dict[str, str]) -> dict[str, Any]:
        """``GET /v1/files`` with ``purpose``, ``limit``, ``order`` and ``after``."""
        limit = parse_limit(query.get("limit"), MAX_LIST_LIMIT, MAX_LIST_LIMIT)
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, "Invalid value for 'order': must be 'asc' or 'desc'.", "order")
        files = [f for f in self._files.values() if query.get("purpose") in (None, f.purpose)]
        if order == "desc":
            files.reverse()
        return list_page([f.to_dict() for f in files], limit, query.get("after"))

    def delete(self, file_id: str) -> dict[str, Any]:
        """``DELETE /v1/files/{id}``: gone for good (a batch create naming it is refused); a
        file never uploaded, or deleted already, is a 404."""
        self.get(file_id)
        del self._files[file_id]
        return {"id": file_id, "object": "file", "deleted": True}
