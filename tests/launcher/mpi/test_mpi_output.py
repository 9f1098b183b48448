"""Open MPI's abort notices picked out of mpirun's streamed output."""

import pytest

from smhvd.mpi.output import StderrFilter

RULE = "-" * 74
UNREACHABLE = f"""{RULE}
At least one pair of MPI processes are unable to reach each other for
MPI communications.  This means that no Open MPI device has indicated
that it can be used to communicate between these processes.

  Process 1 ([[41194,1],1]) is on host: algo-2
  BTLs attempted: self

Your MPI job is now going to abort; sorry.
{RULE}
"""
MPI_ABORT = f"""{RULE}
MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD
with errorcode 3.

NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.
{RULE}
"""


def feed_in_chunks(text: str, size: int) -> StderrFilter:
    output = StderrFilter()
    data = text.encode()
    shown = b"".join(output.feed(data[i : i + size]) for i in range(0, len(data), size))
    assert shown == data  # nothing is held back or dropped from what the user sees
    return output


@pytest.mark.parametrize("size", [1, 7, 4096])
@pytest.mark.parametrize(
    ("text", "notice"),
    [
        (
            UNREACHABLE,
            "At least one pair of MPI processes are unable to reach each other for MPI communications",
        ),
        (MPI_ABORT, "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD with errorcode 3"),
    ],
)
def test_an_abort_notice_is_the_first_sentence_of_its_message_however_the_output_is_cut(text, notice, size):
    output = feed_in_chunks("epoch 1 loss 0.3\n" + text + "more output\n", size)
    assert output.abort_notice == notice


def test_ordinary_messages_and_training_output_are_no_abort():
    text = f"{RULE}\nA deprecated MCA variable value was specified.\n{RULE}\nYour job is going fine\n"
    assert feed_in_chunks(text, 5).abort_notice is None
