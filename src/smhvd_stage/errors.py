"""The one place domain errors meet exit codes (sysexits.h numbers)."""

from __future__ import annotations

USAGE = 2
DATA_ERROR = 65  # input present but wrong: a broken JSON, a bad .npz, a dangling reference
NO_INPUT = 66  # input missing: no such directory, a referenced image that does not exist
SOFTWARE = 70  # the bucket did not end up holding what was uploaded (verification failed)
UNAVAILABLE = 69  # no such bucket, endpoint unreachable, S3 errors
IO_ERROR = 74  # a local file could not be read
NO_PERMISSION = 77  # no credentials, access denied
INTERRUPTED = 130


class StageError(Exception):
    """An error the user can act on: shown as one line, mapped to `code`."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
