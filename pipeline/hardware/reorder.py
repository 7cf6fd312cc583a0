"""Put a run's telemetry back in order and say what was lost (``docs/robot-protocol.md``, *Losses*).

Every telemetry message of a run carries a sequence number. :class:`Reorder` hands messages on in
that order; one that is missing is waited for ``wait_s`` (wall time) once a later one has come,
then counted lost: a :class:`~pipeline.hardware.base.GapPacket` takes its place, spanning the robot
times of the messages on either side. A message that comes after it was counted lost, or twice,
is dropped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.hardware.base import GapPacket, Packet


def packet_time_s(packet: Packet) -> float:
    """The robot time of a packet (s); a gap's end."""
    return packet.t_end_s if isinstance(packet, GapPacket) else packet.t_s


@dataclass
class Reorder:
    """The messages of one run, numbered 0, 1, ..., handed on in order."""

    wait_s: float
    expected: int = 0
    end_seq: int | None = None
    end_t_s: float | None = None
    received: int = 0
    lost: int = 0
    late: int = 0
    duplicates: int = 0
    gaps: list[GapPacket] = field(default_factory=list)
    _held: dict[int, tuple[Packet, float]] = field(default_factory=dict)
    _lost_seqs: list[tuple[int, int]] = field(default_factory=list)
    _last_t_s: float = 0.0
    _end_seen_at: float | None = None

    def add(self, seq: int, packet: Packet, now: float) -> None:
        """Message ``seq`` carrying ``packet`` arrived at wall time ``now`` (s)."""
        if seq < self.expected:
            if any(low <= seq < high for low, high in self._lost_seqs):
                self.late += 1
            else:
                self.duplicates += 1
            return
        if seq in self._held:
            self.duplicates += 1
            return
        self.received += 1
        self._held[seq] = (packet, now)

    def end(self, seq: int, t_s: float, now: float) -> None:
        """The run ended: its messages are 0 .. ``seq`` - 1; it ended at robot time ``t_s``."""
        if self.end_seq is None:
            self.end_seq, self.end_t_s, self._end_seen_at = seq, t_s, now

    @property
    def last_t_s(self) -> float:
        """The robot time of the last packet handed on (s)."""
        return self._last_t_s

    @property
    def done(self) -> bool:
        """Every message of the ended run handed on or counted lost."""
        return self.end_seq is not None and self.expected >= self.end_seq

    def ready(self, now: float) -> list[Packet]:
        """What can be handed on at wall time ``now``: messages in order, gaps where some were lost."""
        out: list[Packet] = []
        while not self.done:
            if self.expected in self._held:
                packet, _ = self._held.pop(self.expected)
                out.append(packet)
                self._last_t_s = max(self._last_t_s, packet_time_s(packet))
                self.expected += 1
                continue
            if self._held:
                first = min(self._held)
                if now - min(at for _, at in self._held.values()) < self.wait_s:
                    break
                out.append(self._gap(first, packet_time_s(self._held[first][0])))
                continue
            if self.end_seq is not None and self._end_seen_at is not None and now - self._end_seen_at >= self.wait_s:
                out.append(self._gap(self.end_seq, max(self.end_t_s or 0.0, self._last_t_s)))
                continue
            break
        return out

    def _gap(self, upto: int, t_end_s: float) -> GapPacket:
        gap = GapPacket(t_start_s=self._last_t_s, t_end_s=t_end_s, missing=upto - self.expected)
        self.lost += gap.missing
        self._lost_seqs.append((self.expected, upto))
        self.gaps.append(gap)
        self.expected = upto
        return gap
