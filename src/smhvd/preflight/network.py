"""Bandwidth and latency between the hosts, over MPI itself (mpi4py in the probe): the transport, interfaces
and options the job's own ranks get, since the probe runs under the job's mpirun command line.

Links are measured in rounds: in the round of offset d every rank sends to ranks r+d and r-d and receives
from them, all at once (non-blocking), and times each receive from the moment it asked for it (the sender
sends on that word: `exchange`). Offsets 1..N/2 (every pair) up
to ALL_PAIRS_UP_TO hosts, offset 1 (the ring, both ways) above. First each round carries 256 KiB a link (a
rough rate for each); then, every rank knowing every link's rough rate (allgather), each round is done REPEATS
times, each link carrying what it carries in about SECONDS_PER_LINK, between 64 KiB and 32 MiB: a fast link is
measured on enough bytes, and a slow one (20 Mbit/s) costs a fraction of a second, never minutes. A link's
figure is its best; a link below the threshold is measured again alone, up to CONFIRM_TRIES times (`confirm`).

Latency and clock: the leader (rank 0) exchanges a few stamps with each rank in turn; the round trip's
minimum is the latency, and the clock offset is the rank's stamp minus the midpoint of that round trip.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from typing import Any

from .yardstick import late_trip, median

ALL_PAIRS_UP_TO = 8
CALIBRATION_BYTES = 256 << 10
MIN_BYTES = 64 << 10
MAX_BYTES = 32 << 20
SECONDS_PER_LINK = 0.03
POLL = 0.0005  # seconds between looks at a request a rank waits for
PATIENT_POLL = 0.01  # ... at most, for a rank that waits while others measure
CONFIRM_SECONDS = 0.1
CONFIRM_TRIES = 4  # a link slow alone is measured alone again, up to this many times; its best is kept
MAX_CONFIRMED = 16  # suspect links measured again alone, the slowest first
MIN_CPU_SHARE = 0.5  # an end of a link measured alone (spinning) that ran less of the time was starved
REPEATS = 2  # the measured rounds, each link's best kept (a busy host only ever slows a link down)
PINGS = 5
CONFIRM_PINGS = 20  # a late round trip's second look
TAG = 7117
GO_TAG = 7118  # a receiver's word to its sender: my clock runs, send

Link = tuple[int, int]  # (source rank, destination rank)


def offsets(n: int, all_pairs_up_to: int = ALL_PAIRS_UP_TO) -> list[int]:
    """The rounds' offsets for n ranks. Pure."""
    if n < 2:
        return []
    return list(range(1, n // 2 + 1)) if n <= all_pairs_up_to else [1]


def partners(rank: int, n: int, offset: int) -> list[int]:
    """Whom `rank` sends to and receives from in the round of `offset` (one partner when r+d == r-d). Pure."""
    return sorted({(rank + offset) % n, (rank - offset) % n} - {rank})


def sized(rate_mb_s: float | None, seconds: float = SECONDS_PER_LINK) -> int:
    """Bytes a link of this rough rate carries in about `seconds`, within [64 KiB, 32 MiB]. Pure."""
    if rate_mb_s is None or rate_mb_s <= 0:
        return CALIBRATION_BYTES
    wanted = int(rate_mb_s * 1e6 * seconds)
    return max(MIN_BYTES, min(MAX_BYTES, wanted))


def rate(size: int, seconds: float) -> float:
    """MB/s (1e6 bytes). Pure."""
    return round(size / max(seconds, 1e-9) / 1e6, 1)


def idle_wait(request: Any, longest: float = POLL) -> Any:
    """Wait for a request without spinning: MPI's blocking calls busy-poll, and on hosts with few cores (or a
    simulated cluster on one machine) the ranks that wait would take the CPU from those still measuring.
    Looks every POLL seconds, then (a rank waiting out others' turns) twice as long each time up to
    `longest`: fifteen ranks looking every 0.5 ms cost a 2-core machine as much as the link they wait on."""
    delay = POLL
    while True:
        done, value = request.test()
        if done:
            return value
        time.sleep(delay)
        delay = min(delay * 2, longest)


def exchange(
    comm: Any,
    mpi: Any,
    rank: int,
    peers: list[int],
    size_of: Callable[[Link], int],
    clock: Callable[[], float] = time.perf_counter,
    *,
    sends_to: list[int] | None = None,
    spin: bool = False,
) -> dict[int, float]:
    """One round, once every rank is at it (the caller's barrier): receive from each of `peers` and send to
    each of `sends_to` (by default `peers` too: both ways at once); by source, the MB/s of its link, timed
    from the moment this rank asked for it to the receive's completion.

    A sender sends only once its receiver has asked (a GO message, sent after the receiver's clock started):
    else a receiver that is late to start its clock (descheduled after the barrier, on a busy host) finds a
    message below the transport's eager limit already delivered, and a 2.5 MB/s link reads as 30-70 MB/s. A
    late sender only makes a link look slower, which the best of the rounds absorbs."""
    destinations = peers if sends_to is None else sends_to
    payload = bytearray(max((size_of((rank, p)) for p in destinations), default=0))
    buffers = {p: bytearray(size_of((p, rank))) for p in peers}
    start = clock()
    receives = [comm.Irecv([buffers[p], mpi.BYTE], source=p, tag=TAG) for p in peers]
    asked = [comm.Isend([bytearray(1), mpi.BYTE], dest=p, tag=GO_TAG) for p in peers]
    waiting = {p: comm.Irecv([bytearray(1), mpi.BYTE], source=p, tag=GO_TAG) for p in destinations}
    sends = []
    took: dict[int, float] = {}
    while len(took) < len(peers) or waiting:
        progressed = False
        for dest in [p for p, request in waiting.items() if request.Test()]:
            del waiting[dest]
            data = memoryview(payload)[: size_of((rank, dest))]
            sends.append(comm.Isend([data, mpi.BYTE], dest=dest, tag=TAG))
            progressed = True
        index, done = mpi.Request.Testany(receives)
        if done and index != mpi.UNDEFINED:
            took[peers[index]] = clock() - start
            progressed = True
        if not progressed and not spin:
            time.sleep(POLL)
    while not mpi.Request.Testall([*sends, *asked]):
        if not spin:
            time.sleep(POLL)
    return {p: rate(size_of((p, rank)), seconds) for p, seconds in took.items()}


def measure_links(comm: Any, mpi: Any, ratio: float) -> tuple[dict[int, float], dict[int, float]]:
    """MB/s of each link into this rank, by source rank, and the slow ones that could not be judged for a
    busy CPU, with its share (collective: every rank calls it; `confirm`)."""
    rank, n = comm.Get_rank(), comm.Get_size()
    rounds = [partners(rank, n, d) for d in offsets(n)]
    rough: dict[int, float] = {}
    for peers in rounds:
        idle_wait(comm.Ibarrier())
        rough.update(exchange(comm, mpi, rank, peers, lambda _link: CALIBRATION_BYTES))
    every: dict[Link, float] = {}
    for dst, rates in enumerate(comm.allgather(rough)):
        for src, value in rates.items():
            every[(src, dst)] = value

    def size_of(link: Link) -> int:
        return sized(every.get(link))

    best: dict[int, float] = dict.fromkeys(rough, 0.0)  # (1 MiB fits in the sockets' buffers: a rough rate)
    for _ in range(REPEATS):
        for peers in rounds:
            idle_wait(comm.Ibarrier())
            for source, mb_s in exchange(comm, mpi, rank, peers, size_of).items():
                best[source] = max(best[source], mb_s)
    return confirm(comm, mpi, rank, best, ratio)


def suspects(every: dict[Link, float], ratio: float, limit: int = MAX_CONFIRMED) -> list[Link]:
    """The links below ratio x the median, slowest first, at most `limit`. Pure."""
    med = median(every.values())
    if med is None:
        return []
    slow = sorted((mb_s, link) for link, mb_s in every.items() if mb_s < ratio * med)
    return sorted(link for _, link in slow[:limit])


def _same(size: int, _link: Link) -> int:
    return size


def confirm(
    comm: Any, mpi: Any, rank: int, best: dict[int, float], ratio: float
) -> tuple[dict[int, float], dict[int, float]]:
    """Measure each suspect link again alone, over CONFIRM_SECONDS, every other rank idle, and beside it the
    link at the median, alone too. Measured together, links share the hosts' CPUs (on a simulated cluster,
    one machine's) and a short window is at the mercy of one descheduling, so a link can look slow that is
    not. A suspect's figure becomes the better of what it had and its best alone figure on the rounds' scale
    (`on_rounds_scale`): like is compared with like, and a link slow alone too stays slow. A transfer alone
    lasts milliseconds on a fast link, so one descheduling can still spoil it: the links still slow
    (`still_slow`) are measured again, up to CONFIRM_TRIES times; a link slow every time is slow. An alone
    figure counts only if both ends had the CPU (`starved`): else it measured the host's other work, not the
    link. Every rank computes the same suspects and reference from the allgathered figures, and learns
    every alone figure after each try. Returns the links into this rank, by source, and those of them no
    try could judge (both ends never had the CPU at once), by source: the best CPU share seen."""
    every = {
        (src, dst): mb_s for dst, rates in enumerate(comm.allgather(best)) for src, mb_s in rates.items()
    }
    slow = suspects(every, ratio)
    med = median(every.values())
    if not slow or med is None:
        return best, {}
    reference = min((abs(mb_s - med), link) for link, mb_s in every.items() if link not in slow)[1]
    alone: dict[Link, float] = {}  # every rank's, after each try
    busy: dict[Link, float] = {}  # a suspect's best CPU share in tries that did not count
    pending = slow
    for _ in range(CONFIRM_TRIES):
        # Each sized by its best figure yet: a fast link's alone is far above its rounds' (`alone_once`).
        sizing = {link: max(every[link], alone.get(link, 0.0)) for link in [reference, *pending]}
        figures, shares = alone_once(comm, mpi, rank, sizing)
        for link, mb_s in figures.items():  # a starved reference only makes the scale stricter: kept
            if link == reference or not starved(shares.get(link, 0.0)):
                alone[link] = max(alone.get(link, 0.0), mb_s)
            else:
                busy[link] = max(busy.get(link, 0.0), shares.get(link, 0.0))
        pending = still_slow(slow, alone, med, ratio, reference)  # on the scale of the best reference so far
        if not pending:
            break
    confirmed = dict(best)
    for (src, dst), mb_s in alone.items():
        if dst == rank and (src, dst) != reference:
            # At most the median: a link cleared alone is as good as the median link, not better (lifted
            # above it, the cleared links would raise the median the verdict compares the others with).
            confirmed[src] = max(confirmed[src], min(med, on_rounds_scale(mb_s, med, alone.get(reference))))
    return confirmed, {
        src: share for (src, dst), share in busy.items() if dst == rank and (src, dst) not in alone
    }


def alone_once(
    comm: Any, mpi: Any, rank: int, links: dict[Link, float]
) -> tuple[dict[Link, float], dict[Link, float]]:
    """Each of `links` measured alone in turn, every other rank idle (collective): every link's MB/s, and
    the lesser CPU share of its two ends while it ran (`cpu_share`). A link carries what it would in about
    CONFIRM_SECONDS at the rate given (`links`: its best figure yet): sized by its rounds' figure alone, a
    fast link's try lasted 1-2 ms at 32 simulated hosts, and one pause of 20 ms (seen with both ends on their
    CPUs) made it read 30 MB/s; sized by its own alone figure, a slow link's stays short. Alone, both ends
    poll without sleeping (`spin`): a sleep that overruns on a busy host would be measured instead of the
    link, and an end that has its CPU then uses all of it."""
    mine: dict[Link, float] = {}
    shares: dict[Link, float] = {}
    for (src, dst), known in links.items():
        if rank not in (src, dst):
            idle_wait(comm.Ibarrier(), PATIENT_POLL)
            continue
        size = functools.partial(_same, sized(known, CONFIRM_SECONDS))
        idle_wait(comm.Ibarrier())
        wall, cpu = time.perf_counter(), time.process_time()
        if rank == src:  # one way: the other way would cross the link under test too
            exchange(comm, mpi, rank, [], size, sends_to=[dst], spin=True)
        else:
            mine[(src, dst)] = exchange(comm, mpi, rank, [src], size, sends_to=[], spin=True)[src]
        shares[(src, dst)] = cpu_share(time.process_time() - cpu, time.perf_counter() - wall)
    figures: dict[Link, float] = {}
    least: dict[Link, float] = {}
    for their_figures, their_shares in comm.allgather((mine, shares)):
        figures.update(their_figures)
        for link, share in their_shares.items():
            least[link] = min(least.get(link, share), share)
    return figures, least


def cpu_share(cpu_seconds: float, wall_seconds: float) -> float:
    """The part of `wall_seconds` a process ran on a CPU (its threads together, at most 1). Pure."""
    return round(min(1.0, cpu_seconds / max(wall_seconds, 1e-9)), 2)


def starved(share: float) -> bool:
    """An end of a link measured alone that had the CPU less than MIN_CPU_SHARE of the time: the host's other
    work held it, and the figure says nothing of the link. Pure."""
    return share < MIN_CPU_SHARE


def still_slow(
    links: Iterable[Link], alone: dict[Link, float], med: float, ratio: float, reference: Link
) -> list[Link]:
    """The links whose best alone figure, on the rounds' scale, is still below ratio x the median. Pure."""
    scale = functools.partial(on_rounds_scale, med=med, reference_alone=alone.get(reference))
    return [link for link in links if scale(alone.get(link, 0.0)) < ratio * med]


def on_rounds_scale(alone: float, med: float, reference_alone: float | None) -> float:
    """A link's figure measured alone, on the scale of the figures measured in rounds: times median / the
    median link's own alone figure. Alone, a link has the CPUs to itself and is faster; that factor is at
    most 1: a reference slower alone than in the rounds was descheduled, and scaling by it would lift a slow
    link over the threshold (a 2.5 MB/s link read as 131 MB/s, its host never named). Pure."""
    if not reference_alone:
        return 0.0
    return round(alone * min(1.0, med / reference_alone), 1)


def clock_and_latency(comm: Any, rank: int, n: int, ratio: float) -> dict[int, tuple[float, float]]:
    """On rank 0: (round trip ms, clock offset s) of each other rank; elsewhere {} (collective). Each rank
    is pinged PINGS times in turn; a rank whose best round trip is then `late_trip` is pinged again,
    CONFIRM_PINGS times, after every other rank had its turn: one busy moment on a loaded host (the same CPUs
    for every simulated host) may cover five pings in a row, hardly a second look too. A rank waits for its
    turn without spinning (idle_wait), then answers each stamp at once."""
    found: dict[int, tuple[float, float]] = {}
    if rank == 0:
        for other in range(1, n):
            found[other] = _pings(comm, other, PINGS)
        trips = [trip for trip, _ in found.values()]
        for other in [r for r, (trip, _) in found.items() if late_trip(trip, median(trips), ratio)]:
            found[other] = min(found[other], _pings(comm, other, CONFIRM_PINGS))
        for other in range(1, n):
            comm.send(0, dest=other, tag=TAG)  # no more turns
    else:
        while count := idle_wait(comm.irecv(source=0, tag=TAG), PATIENT_POLL):  # a turn: how many stamps
            comm.send(None, dest=0, tag=TAG)
            for _ in range(count):
                comm.recv(source=0, tag=TAG)
                comm.send(time.time(), dest=0, tag=TAG)  # stamped once the leader's word arrived
    return found


def _pings(comm: Any, other: int, count: int) -> tuple[float, float]:
    """The leader's turn with `other`: the best of `count` round trips (ms) and the clock offset (s) then."""
    comm.send(count, dest=other, tag=TAG)  # your turn
    comm.recv(source=other, tag=TAG)
    samples = []
    for _ in range(count):
        sent, sent_wall = time.monotonic(), time.time()
        comm.send(None, dest=other, tag=TAG)
        theirs = comm.recv(source=other, tag=TAG)
        samples.append(ping_sample(sent, time.monotonic(), sent_wall, theirs))
    trip, offset = min(samples)
    return round(trip * 1e3, 3), round(offset, 4)


def ping_sample(sent: float, back: float, sent_wall: float, theirs: float) -> tuple[float, float]:
    """(round trip s, clock offset s) of one ping: the trip on the monotonic clock (`sent`, `back`), which a
    step of the wall clock (NTP, a VM's resume) cannot make negative or long; the offset of the other host's
    wall clock (`theirs`) from this one's at the trip's middle. Pure."""
    trip = back - sent
    return trip, theirs - (sent_wall + trip / 2)
