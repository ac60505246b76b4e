-- codemode state, schema version 1 (SQLite and PostgreSQL alike: BIGINT has integer affinity in SQLite). JSON values are stored as text (key order kept).

-- A client session; its `store()` values live in session_store.
CREATE TABLE sessions (
    id            TEXT PRIMARY KEY,
    principal     TEXT,
    created_at_ms BIGINT NOT NULL,
    last_seen_ms  BIGINT NOT NULL
);

CREATE TABLE session_store (
    session_id TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    PRIMARY KEY (session_id, key)
);

-- A script run that outlives a turn, held by the replica named in owner until lease_until_ms.
CREATE TABLE cells (
    id             TEXT PRIMARY KEY,
    session_id     TEXT NOT NULL,
    source         TEXT NOT NULL,
    source_hash    TEXT NOT NULL,
    options        TEXT NOT NULL,
    status         TEXT NOT NULL,
    approval_id    TEXT,
    result         TEXT,
    owner          TEXT,
    lease_until_ms BIGINT NOT NULL,
    created_at_ms  BIGINT NOT NULL,
    updated_at_ms  BIGINT NOT NULL
);
CREATE INDEX cells_by_session ON cells (session_id, created_at_ms);

-- The calls and results of a live cell, in order, to rebuild it by replay.
CREATE TABLE cell_replay (
    cell_id TEXT NOT NULL,
    step    BIGINT NOT NULL,
    entry   TEXT NOT NULL,
    PRIMARY KEY (cell_id, step)
);

-- A call waiting for a person; state moves from pending exactly once.
CREATE TABLE approvals (
    id               TEXT PRIMARY KEY,
    cell_id          TEXT,
    session_id       TEXT NOT NULL,
    tool             TEXT NOT NULL,
    arguments        TEXT NOT NULL,
    provenance       TEXT NOT NULL,
    policy_ids       TEXT NOT NULL,
    reason           TEXT NOT NULL,
    call_hash        TEXT NOT NULL,
    created_at_ms    BIGINT NOT NULL,
    expires_at_ms    BIGINT NOT NULL,
    state            TEXT NOT NULL,
    answered_by      TEXT,
    answered_channel TEXT,
    answered_at_ms   BIGINT
);
CREATE INDEX approvals_by_state ON approvals (state, expires_at_ms);

-- Spending per ledger (scope|day|id): used is settled, reserved is held by calls in flight.
CREATE TABLE budget_ledgers (
    key                     TEXT PRIMARY KEY,
    used_calls              BIGINT NOT NULL DEFAULT 0,
    used_model_calls        BIGINT NOT NULL DEFAULT 0,
    used_tokens             BIGINT NOT NULL DEFAULT 0,
    used_cost_micro_usd     BIGINT NOT NULL DEFAULT 0,
    used_bytes              BIGINT NOT NULL DEFAULT 0,
    reserved_calls          BIGINT NOT NULL DEFAULT 0,
    reserved_model_calls    BIGINT NOT NULL DEFAULT 0,
    reserved_tokens         BIGINT NOT NULL DEFAULT 0,
    reserved_cost_micro_usd BIGINT NOT NULL DEFAULT 0,
    reserved_bytes          BIGINT NOT NULL DEFAULT 0
);

-- One row per reservation and ledger; expired = 1 once its amounts went back to the ledger.
CREATE TABLE budget_holds (
    id             TEXT NOT NULL,
    ledger         TEXT NOT NULL,
    calls          BIGINT NOT NULL,
    model_calls    BIGINT NOT NULL,
    tokens         BIGINT NOT NULL,
    cost_micro_usd BIGINT NOT NULL,
    bytes          BIGINT NOT NULL,
    expires_at_ms  BIGINT NOT NULL,
    expired        BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (id, ledger)
);
CREATE INDEX budget_holds_by_ledger ON budget_holds (ledger, expired, expires_at_ms);

-- The last line of each audit stream; appends lock and move it.
CREATE TABLE audit_heads (
    stream TEXT PRIMARY KEY,
    seq    BIGINT NOT NULL,
    hash   TEXT NOT NULL
);

-- Audit lines; prev is '' for a stream's first line, so (stream, prev) refuses any fork.
CREATE TABLE audit_lines (
    stream TEXT NOT NULL,
    seq    BIGINT NOT NULL,
    prev   TEXT NOT NULL,
    hash   TEXT NOT NULL,
    line   TEXT NOT NULL,
    at_ms  BIGINT NOT NULL,
    PRIMARY KEY (stream, seq),
    UNIQUE (stream, prev)
);
