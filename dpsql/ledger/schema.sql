-- dpsql budget ledger schema, version 1.
--
-- The canonical copy is dpsql/ledger/schema.sql (the code executes it when it creates a
-- ledger); sql/ledger_schema.sql is an identical copy for readers (a test checks they match).
--
-- Rules that make this a ledger and not a cache:
--   * A recorded field never changes meaning. A change of meaning is a new column or a new
--     table under a new schema version, never a reinterpretation of an old one.
--   * Rows are appended; the only updates are the status transitions
--     reserved -> released | failed (with the fields that go with them: updated_at,
--     failure_reason, params keys added at commit, synopsis_key, synopsis).
--   * Budget values (epsilon, delta) are stored as the IEEE-754 double the caller charged,
--     bit-exact. Budget arithmetic reads each one as its shortest round-trip decimal and sums
--     exactly (see dpsql/budget.py); never SUM() these columns in SQL to decide anything.

CREATE TABLE ledger_meta (
    key   VARCHAR PRIMARY KEY,  -- 'schema_version', 'created_at', 'created_by', 'generation',
                                --   'ledger_id', 'created_over'
    value VARCHAR NOT NULL
);

-- The single source of truth for the schema version (dpsql.ledger.SCHEMA_VERSION must match).
INSERT INTO ledger_meta VALUES ('schema_version', '1');

-- 'generation' counts write transactions (1 at creation); each write also records it in the
-- marker file <ledger>.generation, and a ledger holding an older generation than its marker
-- (a lost write-ahead log, a restored old copy) is refused.

-- 'ledger_id' (32 hex digits, random, set at creation; a ledger of an earlier release gets one at
-- its next write) is recorded in the marker too, and a file of another identity than its marker
-- (another ledger put in its place) is refused. 'created_over' lists the identities in the markers
-- of a ledger that was deleted at this path when this one was created there (comma-separated).

-- The total budget is the newest row of this log. The first row is written at creation;
-- every later row is an explicit, recorded set_total (never below what is spent).
CREATE TABLE ledger_totals (
    change_id        BIGINT PRIMARY KEY,        -- 1, 2, 3, ... in order of change
    changed_at       TIMESTAMPTZ NOT NULL,
    epsilon          DOUBLE NOT NULL CHECK (isfinite(epsilon) AND epsilon >= 0),
    delta            DOUBLE NOT NULL CHECK (isfinite(delta) AND delta >= 0 AND delta < 1),
    previous_epsilon DOUBLE,                    -- NULL on the first row
    previous_delta   DOUBLE,
    reason           VARCHAR NOT NULL
);

-- One row per charge (or zero-cost reuse).
CREATE TABLE ledger_entries (
    entry_id        BIGINT PRIMARY KEY,         -- 1, 2, 3, ... in order of reservation
    created_at      TIMESTAMPTZ NOT NULL,       -- when the budget was reserved
    updated_at      TIMESTAMPTZ NOT NULL,       -- last status change
    status          VARCHAR NOT NULL
                    CHECK (status IN ('reserved', 'released', 'failed', 'reused')),
    mechanism       VARCHAR NOT NULL,           -- e.g. 'sparse_histogram', 'dawa'
    epsilon         DOUBLE NOT NULL CHECK (isfinite(epsilon) AND epsilon >= 0),
    delta           DOUBLE NOT NULL CHECK (isfinite(delta) AND delta >= 0 AND delta < 1),
    query           VARCHAR NOT NULL,           -- the SQL text as the user submitted it
    tables          VARCHAR[] NOT NULL,         -- registered table names the query reads
    params          JSON NOT NULL,              -- mechanism parameters: sigma, tau, tau*, caps, rate, ...
    failure_reason  VARCHAR,                    -- set when status = 'failed'; no private values
    synopsis_key    VARCHAR,                    -- lookup key of a stored synopsis (released rows)
    synopsis        JSON,                       -- the synopsis itself (post-processing reuse)
    source_entry_id BIGINT,                     -- for status = 'reused': the entry whose synopsis was reused
    CHECK ((synopsis_key IS NULL) = (synopsis IS NULL)),
    CHECK (status <> 'reused' OR (epsilon = 0 AND delta = 0 AND source_entry_id IS NOT NULL)),
    CHECK (status = 'reused' OR source_entry_id IS NULL)
);
