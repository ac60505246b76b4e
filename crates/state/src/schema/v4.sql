-- codemode state, schema version 4. A session ended for good (`end_session_cells`) keeps its
-- row for a while with ended_at_ms set: a replica that had not yet heard of the end cannot
-- begin it again nor give it a new cell. Pruned once older than the store keeps it.
ALTER TABLE sessions ADD COLUMN ended_at_ms BIGINT;
CREATE INDEX sessions_ended ON sessions (ended_at_ms) WHERE ended_at_ms IS NOT NULL;
