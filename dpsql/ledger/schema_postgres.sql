-- dpsql budget ledger schema, version 1, for PostgreSQL.
--
-- The same tables, columns, meanings and checks as schema.sql (the DuckDB ledger), in
-- PostgreSQL's type names: DOUBLE is DOUBLE PRECISION (IEEE-754 binary64, stored bit-exact),
-- VARCHAR[] is TEXT[], isfinite(x) is x < 'Infinity' (PostgreSQL orders NaN above Infinity).
-- The rules of schema.sql hold unchanged: rows are appended, the only updates are the status
-- transitions, never SUM() the budget columns to decide anything.

CREATE TABLE ledger_meta (
    key   VARCHAR PRIMARY KEY,  -- 'schema_version', 'created_at', 'created_by', 'generation', 'ledger_id'
                                --   (32 hex digits, random, set at creation; a ledger of an earlier release
                                --   gets one at its next write): a ledger object keeps to the ledger it used first
    value VARCHAR NOT NULL
);

INSERT INTO ledger_meta VALUES ('schema_version', '1');

CREATE TABLE ledger_totals (
    change_id        BIGINT PRIMARY KEY,
    changed_at       TIMESTAMPTZ NOT NULL,
    epsilon          DOUBLE PRECISION NOT NULL CHECK (epsilon >= 0 AND epsilon < 'Infinity'),
    delta            DOUBLE PRECISION NOT NULL CHECK (delta >= 0 AND delta < 1),
    previous_epsilon DOUBLE PRECISION,
    previous_delta   DOUBLE PRECISION,
    reason           VARCHAR NOT NULL
);

CREATE TABLE ledger_entries (
    entry_id        BIGINT PRIMARY KEY,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    status          VARCHAR NOT NULL
                    CHECK (status IN ('reserved', 'released', 'failed', 'reused')),
    mechanism       VARCHAR NOT NULL,
    epsilon         DOUBLE PRECISION NOT NULL CHECK (epsilon >= 0 AND epsilon < 'Infinity'),
    delta           DOUBLE PRECISION NOT NULL CHECK (delta >= 0 AND delta < 1),
    query           VARCHAR NOT NULL,
    tables          TEXT[] NOT NULL,
    params          JSON NOT NULL,
    failure_reason  VARCHAR,
    synopsis_key    VARCHAR,
    synopsis        JSON,
    source_entry_id BIGINT,
    CHECK ((synopsis_key IS NULL) = (synopsis IS NULL)),
    CHECK (status <> 'reused' OR (epsilon = 0 AND delta = 0 AND source_entry_id IS NOT NULL)),
    CHECK (status = 'reused' OR source_entry_id IS NULL)
);
