"""The tables, for both databases, and what opening a database does to them: the missing
tables are created, and an older database gains the columns and indexes it lacks (ALTER TABLE
ADD COLUMN, typed for its dialect; CREATE INDEX), with the values a new column needs for the
rows already there (a run's number; the run summary, computed once from the records:
summary.py)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Double,
    ForeignKey,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    inspect,
    text,
)

from andrea.metrics import COLUMNS
from andrea.store.engine import Database
from andrea.store.summary import OWN, SHOWN, Summaries

# A column missing from an older database is added when it opens (Schema.migrate): each numeric
# field of metrics.Record has a column of its own (NULL: the field was not sent, or for a
# required field, not finite); the rest is JSON text.
_TYPES = {"INTEGER": BigInteger, "REAL": Double}
META = MetaData()
RUNS = Table(
    "runs", META,
    Column("id", Text, primary_key=True),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("config", Text, nullable=False),             # JSON: the validated run config
    Column("token_sha256", Text, nullable=False),       # the trainer's write token, hashed
    Column("status", Text, nullable=False),             # runs/info.py RunStatus
    Column("message", Text),                            # why it failed or stopped
    Column("adapter", Text),                            # JSON: the trainer's GPU adapter
    Column("checkpoint_step", BigInteger),              # the newest committed checkpoint
    Column("name", Text),               # what people call it ("tiny adamw #12"); renamable
    Column("tags", Text),                               # JSON list of strings
    Column("notes", Text),
    # The "#12" of a default name: the next of COUNTERS' run_number when created (an older
    # SQLite file: its rowid).
    Column("number", BigInteger),
    # The run summary (summary.py), kept up to date with the run's records: its last step and
    # loss, when its first and last records were committed (elapsed time), its eval losses.
    Column("last_step", BigInteger),
    Column("last_loss", Double),
    Column("first_time", Double),
    Column("last_time", Double),
    Column("last_eval_loss", Double),
    Column("best_eval_loss", Double),
    Column("first_step", BigInteger),       # the summary's own (summary.OWN): never shown
    Column("last_eval_step", BigInteger),
    # A branch whose parent's records are still being copied (run_rows.Runs.branch): the parent's
    # id; NULL once the run is whole. Such a row is not listed.
    Column("copying_from", Text),
)
# The runs list pages newest first by (created_at, id) (run_rows.Runs.page).
Index("runs_by_created", RUNS.c.created_at, RUNS.c.id)
METRICS = Table(
    "metrics", META,
    Column("run_id", Text, ForeignKey("runs.id"), nullable=False),
    *(Column(name, _TYPES[t], nullable=name != "step") for name, t in COLUMNS.items()),
    Column("extra", Text),          # JSON of the record's non-numeric fields (source_losses)
    PrimaryKeyConstraint("run_id", "step"),
    sqlite_with_rowid=False,
)
EVENTS = Table(
    "events", META,
    Column("run_id", Text, ForeignKey("runs.id"), nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("kind", Text, nullable=False),               # sample | phase | resumed
    Column("data", Text, nullable=False),               # JSON
    PrimaryKeyConstraint("run_id", "step", "kind"),
    sqlite_with_rowid=False,
)
REVOKED = Table(                                        # a resume revokes the token it replaces
    "revoked_tokens", META,
    Column("run_id", Text, ForeignKey("runs.id"), nullable=False),
    Column("token_sha256", Text, nullable=False),
    PrimaryKeyConstraint("run_id", "token_sha256"),
    sqlite_with_rowid=False,
)

# Counts that outlive the rows they count. run_number: the highest number a run was given
# (run_rows.Runs.create); MAX(runs.number) went back down when the newest run was deleted, and
# the next run took its number (two "#3"s in one comparison). An older database gets the table
# empty: its first new run counts on from its runs' numbers.
COUNTERS = Table(
    "counters", META,
    Column("name", Text, primary_key=True),
    Column("value", BigInteger, nullable=False),
)

# Taken while a PostgreSQL database gets its tables: two processes starting at once.
_SCHEMA_LOCK = 0x616E64726561       # "andrea"


class Schema:
    """Makes the store's database current when it opens (Database.start runs migrate)."""

    def __init__(self, db: Database, summaries: Summaries):
        self.db = db
        self.summaries = summaries      # an older database's summaries, computed once

    def migrate(self) -> None:
        """Creates the tables that are missing and adds the columns an older database lacks
        (ALTER TABLE ADD COLUMN, typed for its dialect). Nothing is written when none is."""
        with self.db.tx() as conn:
            missing, indexes = _missing(conn), _missing_indexes(conn)
        if not missing and not indexes:
            return
        with self.db.tx(write=True) as conn:
            if self.db.postgres:
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK})
            missing = _missing(conn)    # again, under the lock
            have_tables = set(inspect(conn).get_table_names())
            META.create_all(conn)
            for column in missing:
                if column.table.name in have_tables:
                    conn.execute(text(f"ALTER TABLE {column.table.name} ADD COLUMN"
                                      f" {column.name} {column.type.compile(conn.dialect)}"))
            for index in _missing_indexes(conn):    # (a new table has its own: create_all)
                index.create(conn)
            if "runs" not in have_tables:
                return
            if RUNS.c.number in missing:
                conn.execute(text(
                    "UPDATE runs SET number = rowid" if not self.db.postgres else
                    "UPDATE runs SET number = s.n FROM (SELECT id, ROW_NUMBER() OVER"
                    " (ORDER BY created_at) AS n FROM runs) s WHERE runs.id = s.id"))
            if any(c.table is RUNS and c.name in SHOWN + OWN for c in missing):
                # Once, in this transaction: from now on the records' writers keep it.
                self.summaries.refresh_all(conn)


def _missing(conn: Connection) -> list[Column]:
    """The columns of META (all of a missing table's) that the database lacks."""
    have = inspect(conn)
    tables = set(have.get_table_names())
    missing = []
    for table in META.sorted_tables:
        present = ({c["name"] for c in have.get_columns(table.name)}
                   if table.name in tables else set())
        missing += [c for c in table.columns if c.name not in present]
    return missing


def _missing_indexes(conn: Connection) -> list[Index]:
    """The indexes of META's tables that the database has the table but not the index of."""
    have = inspect(conn)
    tables = set(have.get_table_names())
    return [index for table in META.sorted_tables if table.name in tables
            for index in table.indexes
            if index.name not in {i["name"] for i in have.get_indexes(table.name)}]
