"""What crosses between the control host and a node's agent for one worker turn: the order the
host sends (`TurnOrder`), and what the agent sends back while the turn runs (`Update`s: where
it runs, batches of events, a beat when there is nothing to say) and once it ended (`TurnDone`
or `TurnFailed`). Plain frozen dataclasses: Ray pickles them, the in-process node passes them
as they are; nothing in them is a key (a route's key stays in the host's environment, the
gateway's relay carries a per-turn secret only)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bridge.documents import WorkerExit
from bridge.events import EventData
from bridge.records import TaskRecord, VerificationDoc
from bridge.workers import Turn
from bridge.workspace.diff import Change
from bridge.workspace.snapshot import Dropped


@dataclass(frozen=True)
class GatewayTicket:
    """How the node's relay reaches the turn's gateway on the control host."""

    hub: tuple[str, int]
    secret: str


@dataclass(frozen=True)
class ImageOrder:
    """An image the turn needs, by the control host's id; ``pull``: where the node's engine
    pulls it by digest when it lacks it (None: it must hold it already)."""

    reference: str
    image_id: str
    pull: str | None = None


@dataclass(frozen=True)
class TurnOrder:
    """One worker turn of ``record`` on a node. ``start``: the commit the turn begins from (the
    base, or the node's previous snapshot of this task); ``bundles``: git bundles of what the
    node lacks of them (base first); ``remaining_s``: the task's time left."""

    record: TaskRecord
    turn: Turn
    repo_key: str
    start: str
    remaining_s: float
    images: tuple[ImageOrder, ...]
    bundles: tuple[bytes, ...] = ()
    gateway: GatewayTicket | None = None
    excludes: str = ""  # the ignore rules from outside the tree (see node_turn.outside_excludes)


@dataclass(frozen=True)
class ChecksOrder:
    """The checks of one turn's ``snapshot`` on a node: each command in a fresh container on a
    clean checkout of it, as on one host (bridge/pipeline/verify.py). ``changes``: the paths the
    snapshot changed from the base (the checkout brings only those from the base);
    ``bundles``: what the node lacks of the base and the snapshot."""

    record: TaskRecord
    repo_key: str
    turn: int
    snapshot: str
    changes: tuple[Change, ...]
    commands: tuple[str, ...]
    image: ImageOrder
    remaining_s: float
    bundles: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Placed:
    """The turn started on ``node``."""

    node: str


@dataclass(frozen=True)
class Events:
    """Events the turn recorded on the node since the last batch (kind, data), in order."""

    events: tuple[tuple[str, EventData], ...]


@dataclass(frozen=True)
class Beat:
    """Nothing new; the node is alive."""


@dataclass(frozen=True)
class TurnDone:
    """The turn ended: how the worker exited, its session, and (unless a limit stopped it
    first) the snapshot as a thin bundle of one commit on the base, with what was left out."""

    exit: WorkerExit
    session_id: str | None
    commit: str | None = None
    bundle: bytes | None = None
    dropped: tuple[Dropped, ...] = ()
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ChecksDone:
    """The checks ended: what they found (``timed_out``: the task's deadline stopped them), and
    the tree the node checked out (the control host compares it with the snapshot's own:
    verified bytes = accepted bytes)."""

    verification: VerificationDoc
    timed_out: bool
    tree: str


@dataclass(frozen=True)
class TurnFailed:
    """The turn could not run or finish on the node: an error kind and one sentence."""

    kind: str
    message: str
    superseded: bool = False  # the task was cancelled meanwhile


Update = Placed | Events | Beat | TurnDone | ChecksDone | TurnFailed
