"""Cancelling an exam's provider batches: what `producer cancel` and the API's cancel do
beyond cancelling the slices (batch mode, runner.batching).

A cancel marks the exam's live submissions `cancel_requested` first, in the database, then
asks the provider to cancel those it has (POST /v1/batches/ID/cancel). The mark is what makes
it stick: a submission the provider could not be asked now (unreachable, or not created yet)
is cancelled by the batch runner's next poll of it. Nothing is lost either way: what the
provider finished before the cancel comes back in the output file and is committed (a reply
to a cancelled slice is kept, as a synchronous call in flight is), the rest comes back as
`batch_cancelled` error lines, booked failed at $0 (not billed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from examforge.batch_api import BatchAPI
from examforge.errors import ProviderError
from examforge.settings import Settings

if TYPE_CHECKING:
    from storage import Store

log = logging.getLogger("examforge.batching")

# Seconds a cancel waits for the provider, per batch, at most.
CANCEL_TIMEOUT_S = 15.0
# The provider's statuses in which a batch can still be cancelled.
_CANCELLABLE = frozenset({"validating", "in_progress"})


@dataclass
class BatchCancel:
    """What a cancel did to the exam's provider batches."""

    marked: int = 0  # live submissions marked cancel_requested
    cancelled: list[str] = field(default_factory=list)  # provider batch ids cancelling
    ended: list[str] = field(default_factory=list)  # ended before the cancel: "id (status)"
    later: list[str] = field(default_factory=list)  # left to the runner: "id: why"

    def lines(self, slug: str) -> list[str]:
        out = []
        if self.cancelled:
            out.append(f"cancelling {len(self.cancelled)} provider "
                       f"{'batch' if len(self.cancelled) == 1 else 'batches'} of {slug}: "
                       f"{', '.join(self.cancelled)} (what they finished is still committed)")
        if self.ended:
            out.append("ended before the cancel (their results are booked by the next batch "
                       f"pass, and kept): {', '.join(self.ended)}")
        for why in self.later:
            out.append(f"batch {why}: the batch runner cancels it at its next pass")
        return out


def cancel_batches(settings: Settings, store: Store, slug: str,
                   api: BatchAPI | None = None) -> BatchCancel:
    """Mark the exam's live submissions for cancelling, then cancel at the provider those it
    already has. Never raises for the provider: what could not be done now is left marked."""
    result = BatchCancel(marked=store.request_batch_cancel(slug))
    live = [b for b in store.live_batches(slug) if b.cancel_requested]
    if not live:
        return result
    own = api is None
    if api is None:
        # A short timeout: the caller (a command, an API request) waits on it, and the mark
        # already makes the cancel happen if this one does not get through.
        api = BatchAPI(settings.model_copy(update={"batch_http_timeout_s": min(
            settings.batch_http_timeout_s, CANCEL_TIMEOUT_S)}))
    try:
        for row in live:
            if row.provider_batch_id is None:
                # Not created yet (or its create's reply was lost): the runner cancels it
                # once it has the provider's id (it polls it with cancel_requested set).
                result.later.append(f"submission {row.id} ({row.state}): not at the "
                                    "provider yet")
                continue
            if row.provider_status == "cancelling":  # asked already (a runner's poll)
                result.cancelled.append(row.provider_batch_id)
                continue
            if row.provider_status not in (None, *_CANCELLABLE):
                # Finalizing or ended: every line is in; the runner books them.
                result.ended.append(f"{row.provider_batch_id} ({row.provider_status})")
                continue
            reply: dict[str, Any] | None
            try:
                reply = api.cancel(row.provider_batch_id)
            except ProviderError as exc:
                reply = _refused(api, row.provider_batch_id, exc)
                if reply is None:
                    log.warning("batch cancel failed; the runner tries again", extra={
                        "exam": slug, "submission": row.id, "error": str(exc)[:300]})
                    result.later.append(f"{row.provider_batch_id}: {exc}")
                    continue
            status = str(reply.get("status") or "cancelling")
            store.note_batch_status(row.id, status)
            if status in ("cancelling", "cancelled"):
                result.cancelled.append(row.provider_batch_id)
            else:  # it ended (or is finalizing) before the cancel: all its lines are in
                result.ended.append(f"{row.provider_batch_id} ({status})")
    finally:
        if own:
            api.close()
    return result


def _refused(api: BatchAPI, batch_id: str, exc: ProviderError) -> dict[str, Any] | None:
    """A cancel the provider refused with 409: the batch is already cancelling or has ended
    (a batch runner's poll may have cancelled it a moment ago). Its state then, or None when
    the refusal was something else or the batch cannot be read now."""
    if exc.status_code != 409:
        return None
    try:
        return api.retrieve(batch_id)
    except ProviderError:
        return None
